"""tpuready.runtime.host_launch: the command each host of a TPU slice runs (chapter 28), and
`python -m tpuready torchrun`, torchrun behind TorchTPU's launch environment."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed.run
from conftest import REPOSITORY
from hypothesis import given
from hypothesis import strategies as st

import tpuready.runtime.host_launch as host_launch
from tpuready import __main__ as cli
from tpuready.calc.hardware import TPU_RANKS_PER_HOST, UnknownChipError
from tpuready.runtime.host_launch import (
    HostLaunch,
    HostLaunchError,
    format_host_launches,
    host_launch_commands,
)

PREFIX = ("python", "-m", "tpuready", "torchrun")


def test_one_host_runs_a_standalone_torchrun_with_a_rank_per_chip():
    (launch,) = host_launch_commands("train.py", chip="v6e", num_hosts=1, script_args=["--x", "1"])
    assert launch == HostLaunch(
        0,
        (*PREFIX, "--standalone", "--nproc-per-node=8", "train.py", "--x", "1"),
        num_hosts=1,
        ranks_per_host=8,
    )
    assert launch.world_size == 8
    assert (
        launch.shell()
        == "python -m tpuready torchrun --standalone --nproc-per-node=8 train.py --x 1"
    )


def test_two_hosts_share_one_rendezvous_and_differ_by_node_rank():
    from torch.distributed.run import parse_args

    launches = host_launch_commands("train.py", chip="v5e", num_hosts=2, ranks_per_host=4)
    assert [launch.argv for launch in launches] == [
        (
            *PREFIX,
            "--nnodes=2",
            f"--node-rank={host}",
            "--nproc-per-node=4",
            "--master-addr=$COORDINATOR_ADDRESS",
            "--master-port=29500",
            "train.py",
        )
        for host in (0, 1)
    ]
    assert [launch.host_index for launch in launches] == [0, 1]
    assert {launch.world_size for launch in launches} == {8}
    # torchrun honours --node-rank only under its static rendezvous: the one it reads here.
    for launch in launches:
        parsed = parse_args(list(launch.argv[4:]))
        assert (parsed.rdzv_backend, parsed.node_rank) == ("static", launch.host_index)


@pytest.mark.parametrize("num_hosts", [1, 3])
def test_a_module_runs_with_torchruns_dash_m_as_torchrun_reads_it(num_hosts):
    from torch.distributed.run import parse_args

    flags = ["--module", "qwen3_235b", "--checkpoint.enable"]
    launches = host_launch_commands(
        "torchtitan.train", chip="v7", num_hosts=num_hosts, script_args=flags, module=True
    )
    for launch in launches:
        assert launch.argv[-5:] == ("-m", "torchtitan.train", *flags)
        # torchrun's own parser: a module to run, and every flag left for it.
        parsed = parse_args(list(launch.argv[4:]))
        assert parsed.module
        assert parsed.training_script == "torchtitan.train"
        assert parsed.training_script_args == flags
        assert int(parsed.nproc_per_node) == launch.ranks_per_host == 8


def test_format_prints_every_host_on_its_own_line():
    launches = host_launch_commands(
        "train.py", chip="v6e", num_hosts=2, script_args=["--steps", "100"]
    )
    common = (
        '--nproc-per-node=8 "--master-addr=$COORDINATOR_ADDRESS" --master-port=29500 '
        "train.py --steps 100"
    )
    assert format_host_launches(launches) == (
        f"host 0: python -m tpuready torchrun --nnodes=2 --node-rank=0 {common}\n"
        f"host 1: python -m tpuready torchrun --nnodes=2 --node-rank=1 {common}"
    )


def test_the_shell_line_expands_only_the_coordinator_variable(tmp_path: Path):
    """bash itself reads the line: the variable expands, every other word arrives as it was."""
    launch = host_launch_commands(
        "my train.py",
        chip="v6e",
        num_hosts=2,
        script_args=["--note", "$HOME is 'kept' \"as is\"", "a;b"],
        port=1234,
    )[1]
    completed = subprocess.run(
        ["bash", "-c", f'show() {{ printf "%s\\0" "$@"; }}; show {launch.shell()}'],
        env={"PATH": os.environ["PATH"], "COORDINATOR_ADDRESS": "10.1.2.3", "HOME": "/nowhere"},
        capture_output=True,
        text=True,
        check=True,
    )
    words = completed.stdout.split("\0")[:-1]
    expected = [word.replace("$COORDINATOR_ADDRESS", "10.1.2.3") for word in launch.argv]
    assert words == expected
    assert {"--master-addr=10.1.2.3", "--master-port=1234"} <= set(words)
    assert "$HOME is 'kept' \"as is\"" in words


def test_a_literal_coordinator_is_quoted_like_any_word():
    launch = host_launch_commands("t.py", chip="v7", num_hosts=2, coordinator="10.0.0.2")[0]
    assert "--master-addr=10.0.0.2" in launch.argv
    assert launch.shell_variables == ()
    assert shlex.split(launch.shell()) == list(launch.argv)
    braced = host_launch_commands("t.py", chip="v7", num_hosts=2, coordinator="${HEAD}")[0]
    assert '"--master-addr=${HEAD}"' in braced.shell()


@pytest.mark.parametrize(
    ("chip", "default", "allowed_other"),
    [("v5e", 8, 1), ("v6e", 8, 4), ("v5p", 8, 2), ("v4", 8, 1), ("TPU v7", 8, 2)],
)
def test_ranks_per_host_defaults_to_the_largest_count_a_host_runs(chip, default, allowed_other):
    assert host_launch_commands("t.py", chip=chip, num_hosts=1)[0].ranks_per_host == default
    (launch,) = host_launch_commands("t.py", chip=chip, num_hosts=1, ranks_per_host=allowed_other)
    assert f"--nproc-per-node={allowed_other}" in launch.argv


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"chip": "v99"}, UnknownChipError, "unknown chip 'v99'"),
        ({"chip": 6}, HostLaunchError, "chip must be a tpuready.calc.hardware.Chip"),
        ({"chip": "h100"}, HostLaunchError, "'H100 SXM' is not a TPU"),
        (
            {"ranks_per_host": 2},
            HostLaunchError,
            "ranks_per_host must be one of 1, 4, 8 on a TPU v6e host, got 2: TorchTPU would "
            "fail with 'No TPU topology found for count: 2'",
        ),
        ({"chip": "v7", "ranks_per_host": 1}, HostLaunchError, "one of 2, 4, 8 on a TPU v7"),
        ({"ranks_per_host": 4.0}, HostLaunchError, "ranks_per_host must be a whole number"),
        ({"num_hosts": 0}, HostLaunchError, "num_hosts must be at least 1, got 0"),
        ({"num_hosts": True}, HostLaunchError, "num_hosts must be a whole number"),
        ({"port": 0}, HostLaunchError, "port must be at least 1, got 0"),
        ({"port": 70000}, HostLaunchError, "port must be at most 65535, got 70000"),
        ({"script": ""}, HostLaunchError, "script must be a non-empty string"),
        ({"script_args": "--steps 5"}, HostLaunchError, "script_args must be a list of strings"),
        ({"script_args": ["--steps", 5]}, HostLaunchError, "script_args must hold strings only"),
        ({"coordinator": "$HOST.local"}, HostLaunchError, "coordinator must be an address or"),
        ({"coordinator": "a b"}, HostLaunchError, "coordinator must be a non-empty string"),
        ({"module": 1}, HostLaunchError, "module must be True or False, got 1"),
        (
            {"module": True, "script": "scripts/train.py"},
            HostLaunchError,
            "script must be a dotted module name with module=True, got 'scripts/train.py'",
        ),
    ],
)
def test_bad_arguments_are_named(kwargs, error, message):
    arguments = {"script": "t.py", "chip": "v6e", "num_hosts": 2, **kwargs}
    with pytest.raises(error) as raised:
        host_launch_commands(**arguments)
    assert message in str(raised.value)


@pytest.mark.parametrize("launches", [[], "host 0", [("python",)], None])
def test_format_needs_host_launches(launches):
    with pytest.raises(HostLaunchError, match="launches must"):
        format_host_launches(launches)


@st.composite
def slices(draw):
    generation = draw(st.sampled_from(sorted(TPU_RANKS_PER_HOST)))
    ranks = draw(st.sampled_from(TPU_RANKS_PER_HOST[generation]))
    return generation, ranks, draw(st.integers(1, 64))


@given(
    slice_=slices(),
    script_args=st.lists(st.text(min_size=1, max_size=8), max_size=3),
)
def test_every_host_of_every_slice_gets_its_own_rank_and_the_script(slice_, script_args):
    generation, ranks, num_hosts = slice_
    launches = host_launch_commands(
        "train.py",
        chip=generation,
        num_hosts=num_hosts,
        ranks_per_host=ranks,
        script_args=script_args,
    )
    assert len(launches) == num_hosts
    assert [launch.host_index for launch in launches] == list(range(num_hosts))
    tail = ["train.py", *script_args]
    for launch in launches:
        assert list(launch.argv[: len(PREFIX)]) == list(PREFIX)
        assert list(launch.argv[-len(tail) :]) == tail
        flags = launch.argv[len(PREFIX) : -len(tail)]
        assert f"--nproc-per-node={ranks}" in flags
        if num_hosts > 1:
            assert f"--nnodes={num_hosts}" in flags
            assert f"--node-rank={launch.host_index}" in flags
        else:
            assert "--standalone" in flags
    node_ranks = sorted(
        int(flag.split("=")[1])
        for launch in launches
        for flag in launch.argv
        if flag.startswith("--node-rank=")
    )
    assert node_ranks == (list(range(num_hosts)) if num_hosts > 1 else [])
    assert sum(launch.ranks_per_host for launch in launches) == num_hosts * ranks
    assert {launch.world_size for launch in launches} == {num_hosts * ranks}


# --- python -m tpuready torchrun ---------------------------------------------------------


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Replace the launch environment and torchrun itself with recorders, in call order."""
    calls: list[tuple] = []
    monkeypatch.setattr(
        host_launch,
        "prepare_launch_environment",
        lambda nproc_per_node, nnodes=1: calls.append(("prepare", nproc_per_node, nnodes)),
    )
    monkeypatch.setattr(
        torch.distributed.run, "main", lambda args=None: calls.append(("torchrun", args))
    )
    for variable in ("PET_NNODES", "PET_NPROC_PER_NODE"):
        monkeypatch.delenv(variable, raising=False)
    return calls


@pytest.mark.parametrize(
    ("args", "nproc_per_node", "nnodes"),
    [
        (["--standalone", "--nproc-per-node=2", "s.py"], 2, 1),
        (["--nnodes", "2", "--nproc_per_node", "4", "s.py", "--nnodes", "9"], 4, 2),
        (["--nnodes=3:3", "--node-rank=1", "--nproc-per-node", "8", "s.py"], 8, 3),
        (["s.py", "--lr", "0.1"], 1, 1),  # torchrun's defaults
    ],
)
def test_the_subcommand_prepares_the_counts_then_runs_torchrun_unchanged(
    recorded, args, nproc_per_node, nnodes
):
    assert cli.main(["torchrun", *args]) == 0
    assert recorded == [("prepare", nproc_per_node, nnodes), ("torchrun", args)]


def test_the_counts_may_come_from_torchruns_variables(recorded, monkeypatch):
    monkeypatch.setenv("PET_NPROC_PER_NODE", "4")
    assert cli.main(["torchrun", "s.py"]) == 0
    assert recorded == [("prepare", 4, 1), ("torchrun", ["s.py"])]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nnodes=1:4", "s.py"], "--nnodes=1:4 is an elastic range of hosts"),
        (["--nnodes=two", "s.py"], "--nnodes must be a number of hosts, 1 or more, got 'two'"),
        (["--nproc-per-node=auto", "s.py"], "--nproc-per-node must be a number of ranks"),
        (["--nproc-per-node=0", "s.py"], "got '0'"),
    ],
)
def test_counts_torchtpu_cannot_use_are_refused_before_anything_starts(
    recorded, capsys, args, message
):
    assert cli.main(["torchrun", *args]) == 2
    assert recorded == []
    assert message in capsys.readouterr().err


def test_torchtpus_refusal_is_reported_and_nothing_starts(monkeypatch, capsys):
    def refuse(nproc_per_node: int, nnodes: int = 1) -> None:
        raise RuntimeError(f"No TPU topology found for count: {nproc_per_node}")

    started = []
    monkeypatch.setattr(host_launch, "prepare_launch_environment", refuse)
    monkeypatch.setattr(torch.distributed.run, "main", lambda args=None: started.append(args))
    assert cli.main(["torchrun", "--nproc-per-node=2", "s.py"]) == 2
    assert started == []
    assert "No TPU topology found for count: 2" in capsys.readouterr().err


def test_torchruns_own_usage_errors_keep_torchruns_status(recorded, capsys):
    assert cli.main(["torchrun", "--no-such-flag", "s.py"]) == 2
    assert recorded == []
    assert "--no-such-flag" in capsys.readouterr().err


@pytest.mark.timeout(180)
def test_the_subcommand_starts_two_cpu_ranks(tmp_path: Path):
    script = tmp_path / "show_rank.py"
    script.write_text(
        "import os, sys\nprint(f\"RANK={os.environ['RANK']} {sys.argv[1:]}\", flush=True)\n",
        encoding="utf-8",
    )
    completed = subprocess.run(
        [
            *(sys.executable, "-m", "tpuready", "torchrun"),
            *("--standalone", "--nproc-per-node=2", str(script), "--steps", "3"),
        ],
        cwd=REPOSITORY,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    assert sorted(completed.stdout.splitlines()) == [
        "RANK=0 ['--steps', '3']",
        "RANK=1 ['--steps', '3']",
    ]
