"""tpuready.runtime.launch's one way to place a rank: backend and device on every kind of host.

Hosts are faked (`torch.accelerator` answers, a fake `torch.tpu`, a recording
`init_process_group`), so no GPU, TPU or NCCL is needed; one test starts real gloo ranks to
check that `run_workers` goes through the same code. The last tests read the worker files:
each torchrun `main()` must join through `init_rank`, none may name a backend itself.
"""

from __future__ import annotations

import ast
import json
import multiprocessing.context
import os
import subprocess
import sys
import textwrap
import types
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from conftest import NOTEBOOK_DIR, REPOSITORY
from hypothesis import given
from hypothesis import strategies as st

import tpuready.runtime.launch
from tpuready.runtime.launch import (
    RankPlacement,
    choose_rank_placement,
    init_rank,
    prepare_launch_environment,
    rank_device,
    run_workers,
)

WORKER_FILES = sorted((NOTEBOOK_DIR / "workers").glob("*.py"))
TOOLKIT_FILES = sorted((REPOSITORY / "tpuready").rglob("*.py"))
CUDA = torch.device("cuda")


def placements(
    accelerator: torch.device | None, device_count: int, num_ranks: int
) -> list[RankPlacement]:
    """The placement of every rank of a host with `device_count` devices of `accelerator`."""
    return [
        choose_rank_placement(
            local_rank, num_ranks, accelerator=accelerator, device_count=device_count
        )
        for local_rank in range(num_ranks)
    ]


# One row per kind of host: (accelerator, device count, ranks, backend, devices, reason).
HOSTS = {
    "CPU only": (None, 0, 4, "gloo", ["cpu"] * 4, "no accelerator: gloo on the CPU"),
    "one GPU, one rank": (CUDA, 1, 1, "nccl", ["cuda:0"], "1 rank on 1 CUDA device: nccl"),
    "one GPU, four ranks": (
        CUDA,
        1,
        4,
        "gloo",
        ["cpu"] * 4,
        "4 ranks but 1 CUDA device: gloo on the CPU (NCCL needs one GPU per rank); "
        "start at most 1 rank per host to use it",
    ),
    "four GPUs, four ranks": (
        CUDA,
        4,
        4,
        "nccl",
        ["cuda:0", "cuda:1", "cuda:2", "cuda:3"],
        "4 ranks on 4 CUDA devices: nccl, this rank on cuda:",
    ),
    "eight GPUs, two ranks": (CUDA, 8, 2, "nccl", ["cuda:0", "cuda:1"], "2 ranks on 8 CUDA"),
    "two XPUs, two ranks": (
        torch.device("xpu"),
        2,
        2,
        "xccl",
        ["xpu:0", "xpu:1"],
        "2 ranks on 2 xpu devices: xccl",
    ),
    "one XPU, two ranks": (
        torch.device("xpu"),
        1,
        2,
        "gloo",
        ["cpu", "cpu"],
        "2 ranks but 1 xpu device: gloo on the CPU (xccl needs one per rank)",
    ),
    # torch.distributed maps mps to gloo, which moves CPU and CUDA tensors only.
    "an Apple GPU": (torch.device("mps"), 1, 2, "gloo", ["cpu", "cpu"], "mps has no collective"),
    "an accelerator torch.distributed does not know": (
        torch.device("hpu"),
        8,
        2,
        "gloo",
        ["cpu", "cpu"],
        "hpu has no collective backend in torch.distributed: gloo on the CPU",
    ),
}


# torch's map from device type to default backend, as a fresh process has it: another test
# in the same process (the fake process group) can register a backend for "hpu" in the live one.
FRESH_BACKEND_MAP = {"cpu": "gloo", "cuda": "nccl", "xpu": "xccl", "mps": "gloo"}


@pytest.fixture(autouse=True)
def fresh_backend_map(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dist.Backend, "default_device_backend_map", dict(FRESH_BACKEND_MAP))


@pytest.mark.parametrize(
    ("accelerator", "device_count", "num_ranks", "backend", "devices", "reason"),
    list(HOSTS.values()),
    ids=list(HOSTS),
)
def test_each_kind_of_host_gets_its_backend_and_one_device_per_rank(
    accelerator: torch.device | None,
    device_count: int,
    num_ranks: int,
    backend: str,
    devices: list[str],
    reason: str,
) -> None:
    chosen = placements(accelerator, device_count, num_ranks)
    assert [placement.backend for placement in chosen] == [backend] * num_ranks
    assert [str(placement.device) for placement in chosen] == devices
    for placement in chosen:
        assert placement.reason.startswith(reason), placement.reason
        assert "\n" not in placement.reason


def test_the_reason_names_the_rank_s_own_device() -> None:
    chosen = placements(CUDA, 4, 4)
    assert [placement.reason.rsplit(" ", 1)[-1] for placement in chosen] == [
        f"cuda:{index}" for index in range(4)
    ]


def test_a_placement_is_a_frozen_value() -> None:
    placement = choose_rank_placement(0, 1, accelerator=None)
    assert placement == RankPlacement("gloo", torch.device("cpu"), placement.reason)
    with pytest.raises(AttributeError):
        placement.backend = "nccl"  # type: ignore[misc]


def test_without_fakes_this_host_is_read_from_torch_accelerator(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[bool] = []

    def current_accelerator(check_available: bool = False) -> torch.device | None:
        asked.append(check_available)
        return CUDA if check_available else None

    monkeypatch.setattr(torch.accelerator, "current_accelerator", current_accelerator)
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 2)
    assert choose_rank_placement(1, 2).device == torch.device("cuda", 1)
    assert choose_rank_placement(1, 3).device == torch.device("cpu")
    assert asked and all(asked), "an accelerator that is built but unusable must not count"


def test_a_tpu_host_gets_tpu_dist_and_tpu_0_for_every_rank() -> None:
    # torch.device("tpu") parses only once TorchTPU has renamed PrivateUse1 to "tpu", which
    # cannot be undone in a process: the check runs in a fresh interpreter.
    script = textwrap.dedent(
        """
        import json
        import torch
        torch.utils.rename_privateuse1_backend("tpu")
        from tpuready.runtime.launch import choose_rank_placement
        chosen = [
            choose_rank_placement(rank, 4, accelerator=torch.device("tpu"), device_count=4)
            for rank in range(4)
        ]
        print(json.dumps([[p.backend, str(p.device), p.reason] for p in chosen]))
        """
    )
    completed = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    chosen = json.loads(completed.stdout)
    assert [(backend, device) for backend, device, _ in chosen] == [("tpu_dist", "tpu:0")] * 4
    assert all("tpu:0" in reason for _, _, reason in chosen)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"local_rank": -1, "local_world_size": 4}, "local_rank must be at least 0, got -1"),
        ({"local_rank": 4, "local_world_size": 4}, "below local_world_size (4), got 4"),
        ({"local_rank": 0, "local_world_size": 0}, "local_world_size must be at least 1, got 0"),
        ({"local_rank": 1.0, "local_world_size": 4}, "local_rank must be a whole number, got 1.0"),
        ({"local_rank": True, "local_world_size": 4}, "got True"),
        ({"local_rank": 0, "local_world_size": "4"}, "got '4'"),
        (
            {"local_rank": 0, "local_world_size": 1, "accelerator": "cuda"},
            "accelerator must be a torch.device or None, got 'cuda'",
        ),
        (
            {"local_rank": 0, "local_world_size": 1, "accelerator": CUDA, "device_count": -1},
            "device_count must be at least 0, got -1",
        ),
    ],
    ids=[
        "negative rank",
        "rank past the end",
        "no ranks",
        "float",
        "bool",
        "str",
        "str accelerator",
        "negative count",
    ],
)
def test_bad_input_is_refused_with_its_value(arguments: dict, named: str) -> None:
    with pytest.raises(ValueError) as caught:
        choose_rank_placement(**arguments)
    assert named in str(caught.value)


@given(
    local_world_size=st.integers(min_value=1, max_value=64),
    device_count=st.integers(min_value=0, max_value=64),
    data=st.data(),
)
def test_on_cuda_nccl_is_chosen_iff_every_rank_has_its_own_gpu(
    local_world_size: int, device_count: int, data: st.DataObject
) -> None:
    local_rank = data.draw(st.integers(min_value=0, max_value=local_world_size - 1))
    placement = choose_rank_placement(
        local_rank, local_world_size, accelerator=CUDA, device_count=device_count
    )
    enough = device_count >= local_world_size
    assert (placement.backend == "nccl") is enough
    assert placement.device == (torch.device("cuda", local_rank) if enough else torch.device("cpu"))
    if enough:
        indices = {p.device.index for p in placements(CUDA, device_count, local_world_size)}
        assert len(indices) == local_world_size  # no two ranks share a GPU
        assert max(indices) < device_count  # and each index names a device that exists


class FakeHost:
    """Record, in order, what `init_rank` asks of torch on a faked host."""

    def __init__(
        self,
        monkeypatch: pytest.MonkeyPatch,
        accelerator: object,
        device_count: int,
    ) -> None:
        self.calls: list[tuple[str, object]] = []
        monkeypatch.setattr(
            torch.accelerator,
            "current_accelerator",
            lambda check_available=False: accelerator,
        )
        monkeypatch.setattr(torch.accelerator, "device_count", lambda: device_count)
        monkeypatch.setattr(
            torch.accelerator,
            "set_device_index",
            lambda index: self.calls.append(("set_device_index", index)),
        )
        monkeypatch.setattr(
            dist,
            "init_process_group",
            lambda **options: self.calls.append(("init_process_group", options)),
        )
        # init_rank remembers its choice for rank_device(): forget it after the test.
        monkeypatch.setattr(tpuready.runtime.launch, "_placement", None)


def test_init_rank_on_cuda_sets_the_device_before_joining(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = FakeHost(monkeypatch, CUDA, device_count=4)
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    placement = init_rank()
    assert host.calls == [("set_device_index", 2), ("init_process_group", {"backend": "nccl"})]
    assert placement.device == rank_device() == torch.device("cuda", 2)


def test_init_rank_passes_the_launcher_s_store_and_timeout_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    host = FakeHost(monkeypatch, CUDA, device_count=1)
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    store, timeout = object(), timedelta(seconds=7)
    placement = init_rank(timeout=timeout, store=store, rank=3, world_size=4)
    # 4 ranks on 1 GPU: gloo on the CPU, and no set_device_index (it would pick cuda:3).
    assert host.calls == [
        (
            "init_process_group",
            {"backend": "gloo", "timeout": timeout, "store": store, "rank": 3, "world_size": 4},
        )
    ]
    assert placement.device == rank_device() == torch.device("cpu")
    assert "4 ranks but 1 CUDA device" in placement.reason


def test_init_rank_on_a_cpu_sets_no_device(monkeypatch: pytest.MonkeyPatch) -> None:
    host = FakeHost(monkeypatch, None, device_count=0)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert init_rank().backend == "gloo"
    assert host.calls == [("init_process_group", {"backend": "gloo"})]


@pytest.mark.parametrize("missing", ["LOCAL_RANK", "LOCAL_WORLD_SIZE"])
def test_init_rank_outside_a_launcher_names_the_variable_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    host = FakeHost(monkeypatch, None, device_count=0)
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    monkeypatch.delenv(missing)
    with pytest.raises(
        RuntimeError, match=f"{missing} is not set: start this process with torchrun"
    ):
        init_rank()
    assert host.calls == []


def test_init_rank_refuses_a_local_rank_that_is_not_a_number(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    FakeHost(monkeypatch, None, device_count=0)
    monkeypatch.setenv("LOCAL_RANK", "first")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    with pytest.raises(ValueError, match="LOCAL_RANK must be an integer >= 0, got 'first'"):
        init_rank()


def test_rank_device_before_init_rank_says_what_to_call(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tpuready.runtime.launch, "_placement", None)
    with pytest.raises(RuntimeError, match=r"before init_rank\(\)"):
        rank_device()


def fake_torch_tpu(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, int]]:
    """Install a `torch.tpu` whose `distributed.set_tpu_launch_env` records its arguments."""
    calls: list[dict[str, int]] = []
    tpu, distributed = types.ModuleType("torch.tpu"), types.ModuleType("torch.tpu.distributed")
    distributed.set_tpu_launch_env = lambda **kwargs: calls.append(kwargs)  # type: ignore[attr-defined]
    tpu.distributed = distributed  # type: ignore[attr-defined]
    monkeypatch.setattr(torch, "tpu", tpu, raising=False)
    return calls


def test_prepare_launch_environment_sets_torchtpu_s_variables_on_a_tpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = fake_torch_tpu(monkeypatch)
    # Only the type is read, and torch.device("tpu") needs TorchTPU: a stand-in will do.
    tpu = types.SimpleNamespace(type="tpu")
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda check_available=False: tpu)
    prepare_launch_environment(4)
    prepare_launch_environment(8, nnodes=2)
    assert calls == [{"nnodes": 1, "nproc_per_node": 4}, {"nnodes": 2, "nproc_per_node": 8}]


@pytest.mark.parametrize("accelerator", [None, CUDA], ids=["CPU", "CUDA"])
def test_prepare_launch_environment_does_nothing_elsewhere(
    monkeypatch: pytest.MonkeyPatch, accelerator: torch.device | None
) -> None:
    calls = fake_torch_tpu(monkeypatch)
    monkeypatch.setattr(
        torch.accelerator, "current_accelerator", lambda check_available=False: accelerator
    )
    environment = dict(os.environ)
    prepare_launch_environment(4)
    assert calls == []
    assert dict(os.environ) == environment


@pytest.mark.parametrize(("nproc_per_node", "nnodes"), [(0, 1), (4, 0), (2.0, 1), (4, True)])
def test_prepare_launch_environment_refuses_bad_counts(
    nproc_per_node: object, nnodes: object
) -> None:
    with pytest.raises(ValueError, match=r"must be (at least 1|a whole number), got"):
        prepare_launch_environment(nproc_per_node, nnodes)  # type: ignore[arg-type]


class StopBeforeSpawning(Exception):
    """Raised by a fake `prepare_launch_environment` to end `run_workers` before it spawns."""


def test_run_workers_prepares_the_launch_environment_before_starting_ranks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    prepared: list[int] = []

    def prepare(nproc_per_node: int, nnodes: int = 1) -> None:
        prepared.append(nproc_per_node)
        raise StopBeforeSpawning

    def refuse_to_start(process: object) -> None:
        raise AssertionError("a rank started before the launch environment was prepared")

    monkeypatch.setattr(tpuready.runtime.launch, "prepare_launch_environment", prepare)
    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", refuse_to_start)
    with pytest.raises(StopBeforeSpawning):
        run_workers(report_placement, 3)
    assert prepared == [3]


def report_placement(rank: int, world_size: int) -> dict[str, str]:
    """A worker: what this rank was given (run by `run_workers` in a spawned process)."""
    return {
        "device": str(rank_device()),
        "backend": dist.get_backend(),
        "LOCAL_RANK": os.environ["LOCAL_RANK"],
        "LOCAL_WORLD_SIZE": os.environ["LOCAL_WORLD_SIZE"],
    }


@pytest.mark.timeout(180)
def test_run_workers_places_each_rank_through_init_rank() -> None:
    results = run_workers(report_placement, 2, timeout_seconds=120)
    expected = choose_rank_placement(0, 2)  # this host, as each rank sees it
    assert results == [
        {
            "device": str(expected.device),
            "backend": expected.backend,
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": "2",
        }
        for rank in range(2)
    ]


def called_name(call: ast.Call) -> str | None:
    """`init_process_group` for `dist.init_process_group(...)` and for a bare call."""
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    if isinstance(call.func, ast.Name):
        return call.func.id
    return None


def calls_in(node: ast.AST, name: str) -> list[ast.Call]:
    """Every call of `name` under `node`."""
    return [
        call for call in ast.walk(node) if isinstance(call, ast.Call) and called_name(call) == name
    ]


def names_a_backend(call: ast.Call) -> bool:
    """Whether an `init_process_group` call spells its backend as a string."""
    backend = call.args[0] if call.args else None
    for keyword in call.keywords:
        if keyword.arg == "backend":
            backend = keyword.value
    return isinstance(backend, ast.Constant) and isinstance(backend.value, str)


def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def test_the_sources_are_found() -> None:
    assert len(WORKER_FILES) >= 7 and len(TOOLKIT_FILES) >= 10
    assert calls_in(parsed(REPOSITORY / "tpuready" / "runtime" / "launch.py"), "init_process_group")


@pytest.mark.parametrize(
    "path", WORKER_FILES + TOOLKIT_FILES, ids=lambda path: path.relative_to(REPOSITORY).as_posix()
)
def test_no_source_names_a_backend_for_init_process_group(path: Path) -> None:
    calls = calls_in(parsed(path), "init_process_group")
    spelled = [call.lineno for call in calls]
    named = [call.lineno for call in calls if names_a_backend(call)]
    assert named == [], (
        f"{path.name} lines {named}: call tpuready.runtime.launch.init_rank() instead"
    )
    if path in WORKER_FILES:  # a worker joins through init_rank only
        assert spelled == [], f"{path.name} lines {spelled}: call init_rank() instead"


def entry_functions(module: ast.Module) -> list[ast.FunctionDef]:
    """The module's functions that its `if __name__ == "__main__":` blocks call or hand to
    `run_torchrun_main`."""
    functions = {node.name: node for node in module.body if isinstance(node, ast.FunctionDef)}
    entries = []
    for node in module.body:
        if isinstance(node, ast.If) and "__name__" in ast.unparse(node.test):
            for statement in node.body:
                for call in ast.walk(statement):
                    if isinstance(call, ast.Call) and called_name(call) in functions:
                        entries.append(functions[called_name(call)])
                    elif isinstance(call, ast.Call):  # run_torchrun_main(main, __file__, ...)
                        entries += [
                            functions[argument.id]
                            for argument in call.args
                            if isinstance(argument, ast.Name) and argument.id in functions
                        ]
    return entries


@pytest.mark.parametrize("path", WORKER_FILES, ids=lambda path: path.name)
def test_every_worker_main_joins_through_init_rank(path: Path) -> None:
    module = parsed(path)
    entries = entry_functions(module)
    assert entries, f"{path.name} has no main() under `if __name__ == '__main__':`"
    for entry in entries:
        assert calls_in(entry, "init_rank"), f"{path.name}: {entry.name}() must call init_rank()"


@pytest.mark.parametrize("path", WORKER_FILES, ids=lambda path: path.name)
def test_workers_take_their_device_and_mesh_type_from_rank_device(path: Path) -> None:
    module = parsed(path)
    assert calls_in(module, "current_accelerator") == [], f"{path.name}: use rank_device()"
    for call in calls_in(module, "init_device_mesh"):
        first = call.args[0] if call.args else None
        assert not isinstance(first, ast.Constant), (
            f"{path.name} line {call.lineno}: init_device_mesh(rank_device().type, ...)"
        )
