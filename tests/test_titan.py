"""`tpuready.titan`: a plan's TorchTitan flags, checked by hand, by property and by TorchTitan.

The last test runs chapter 19's checker (`notebooks/titan/ch19_check.py`) in the TorchTitan venv:
TorchTitan 0.3.0's own config classes, `ParallelDims` and mesh construction on a fake process
group of 8,192 ranks accept the flags `titan_flags` writes and reject the mistakes the chapter
shows, each naming the flag `rejected_flag` finds.
"""

from __future__ import annotations

import json
import math
import platform
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuready.plan import ModelConfig, PlanError, make_plan
from tpuready.titan import (
    TitanConfigError,
    TitanRejection,
    raise_for_rejection,
    rejected_flag,
    titan_degrees,
    titan_flags,
)

REPOSITORY = Path(__file__).resolve().parent.parent
TITAN_PYTHON = REPOSITORY / ".venv-titan" / "bin" / "python"
CHECKER = REPOSITORY / "notebooks" / "titan" / "ch19_check.py"

# Qwen/Qwen3-235B-A22B's config.json, as chapter 9 plans it.
QWEN3_235B = ModelConfig("Qwen3-235B-A22B", 94, 4096, 64, 4, 128, 128, 8, 1536, 151936)
NAMES = {"module": "qwen3_235b", "config": "qwen3_235b_a22b"}


def plan_for(mesh: dict[str, int], *, recompute: bool = False, seq_len: int = 4096):
    return make_plan(
        QWEN3_235B,
        mesh,
        "v7",
        num_chips=math.prod(mesh.values()),
        global_batch=8192,
        seq_len=seq_len,
        recompute=recompute,
    )


def as_options(flags: list[str]) -> dict[str, str]:
    """`--name value` pairs and bare switches (value '') of a flag list, minus the subcommand."""
    options, index = {}, 0
    while index < len(flags):
        flag = flags[index]
        if index + 1 < len(flags) and not flags[index + 1].startswith(("--", "activation")):
            options[flag], index = flags[index + 1], index + 2
        else:
            options[flag], index = "", index + 1
    return options


def test_chapter_9s_best_mesh_by_hand():
    flags = titan_flags(plan_for({"fsdp": 1024, "expert": 8}), **NAMES)
    assert flags == [
        "--module", "qwen3_235b", "--config", "qwen3_235b_a22b",
        "--parallelism.data_parallel_replicate_degree", "1",
        "--parallelism.data_parallel_shard_degree", "8192",
        "--parallelism.tensor_parallel_degree", "1",
        "--parallelism.expert_parallel_degree", "8",
        "--training.local_batch_size", "1",
        "--training.global_batch_size", "8192",
        "--training.seq_len", "4096",
        "--training.disable_cuda_graphs",
        "activation-checkpoint:none",
    ]  # fmt: skip


def test_data_axis_and_recompute():
    flags = titan_flags(plan_for({"data": 2, "fsdp": 128, "expert": 32}, recompute=True), **NAMES)
    options = as_options(flags)
    assert options["--parallelism.data_parallel_replicate_degree"] == "2"
    assert options["--parallelism.data_parallel_shard_degree"] == "4096"
    assert options["--training.local_batch_size"] == "1"
    assert flags[-1] == "activation-checkpoint:full"


mesh_sizes = st.fixed_dictionaries(
    {},
    optional={axis: st.sampled_from([1, 2, 4, 8, 16]) for axis in ("data", "fsdp", "expert")}
    | {"tensor": st.sampled_from([1, 2, 4])},
)


@settings(deadline=None, max_examples=80)
@given(mesh=mesh_sizes)
def test_degrees_cover_the_world_as_torchtitan_requires(mesh):
    degrees = titan_degrees(mesh)
    world = math.prod(mesh.values())
    replicate, shard = (
        degrees["data_parallel_replicate_degree"],
        degrees["data_parallel_shard_degree"],
    )
    tensor, expert = degrees["tensor_parallel_degree"], degrees["expert_parallel_degree"]
    # ParallelDims: dp_replicate x dp_shard x cp x tp x pp is the world (cp = pp = 1 here).
    assert replicate * shard * tensor == world
    # Expert parallelism borrows from dp_shard x tp, and efsdp is the plan's fsdp x tensor.
    assert (shard * tensor) % expert == 0
    assert shard * tensor // expert == mesh.get("fsdp", 1) * tensor


@settings(deadline=None, max_examples=40)
@given(mesh=mesh_sizes, recompute=st.booleans())
def test_batch_flags_multiply_back_to_the_global_batch(mesh, recompute):
    plan = make_plan(
        QWEN3_235B,
        mesh,
        "v7",
        num_chips=math.prod(mesh.values()),
        global_batch=8 * 8 * 16 * 16,
        seq_len=4096,
        recompute=recompute,
    )
    options = as_options(titan_flags(plan, **NAMES))
    batch_ranks = int(options["--parallelism.data_parallel_replicate_degree"]) * int(
        options["--parallelism.data_parallel_shard_degree"]
    )
    assert int(options["--training.local_batch_size"]) * batch_ranks == plan.global_batch
    assert int(options["--training.global_batch_size"]) == plan.global_batch
    assert "--training.disable_cuda_graphs" in options


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: titan_degrees({"pipeline": 2}), "unknown mesh axes ['pipeline']"),
        (lambda: titan_degrees({"fsdp": 2.0}), "mesh['fsdp']"),
        (lambda: titan_degrees([("fsdp", 2)]), "mesh must map axis names"),
        (lambda: titan_flags({"fsdp": 8}, **NAMES), "use make_plan"),
        (
            lambda: titan_flags(plan_for({"fsdp": 8}), module="qwen3-235b", config="c"),
            "module must be a Python name",
        ),
        (
            lambda: titan_flags(plan_for({"fsdp": 4, "tensor": 2}, seq_len=4095), **NAMES),
            "--training.seq_len",
        ),
    ],
)
def test_bad_input_names_the_value(call, needle):
    with pytest.raises(TitanConfigError) as caught:
        call()
    assert needle in str(caught.value)
    assert isinstance(caught.value, PlanError)


@pytest.mark.parametrize(
    ("message", "flag"),
    [
        (
            "Error parsing Config: CUDA graphs support only expert parallel token dispatcher "
            "configurations without CPU synchronization. Set HybridEP non_blocking_capacity_"
            "factor, or use MinimalAsyncEP, or set --training.disable_cuda_graphs.",
            "--training.disable_cuda_graphs",
        ),
        (
            "Error parsing --parallelism.expert-parallel-degree: invalid literal for int()",
            "--parallelism.expert_parallel_degree",
        ),
        ("Unrecognized options: --parallelism.expert_parallel, 8", "--parallelism.expert_parallel"),
        (
            "Invalid parallel dims: dp_replicate(1) * dp_shard(1024) * cp(1) * tp(1) * pp(1) "
            "!= WORLD_SIZE(8192)",
            "--parallelism.data_parallel_shard_degree",
        ),
        (
            "The product of mesh_sizes=(1, 1, 2730, 3) is 8190, but the original dimension at "
            "dim=0 has size 8192. These must be equal for unflatten to work correctly.",
            "--parallelism.expert_parallel_degree",
        ),
    ],
)
def test_rejected_flag(message, flag):
    assert rejected_flag(message) == flag
    with pytest.raises(TitanRejection, match=f"Fix {flag}\\.$"):
        raise_for_rejection({"accepted": False, "stage": "parse", "message": message})


def test_rejection_without_a_flag_says_so():
    with pytest.raises(TitanRejection, match="no flag found"):
        rejected_flag("something else went wrong")
    raise_for_rejection({"accepted": True})  # accepted: nothing raised


def titan_python() -> Path:
    if TITAN_PYTHON.exists():
        return TITAN_PYTHON
    if (platform.system(), platform.machine()) == ("Linux", "x86_64"):
        pytest.fail(f"{TITAN_PYTHON} is missing: run `make titan-venv`")
    pytest.skip("the TorchTitan venv is for x86-64 Linux only")


def test_torchtitan_accepts_the_flags_and_rejects_the_mistakes():
    best = titan_flags(plan_for({"fsdp": 1024, "expert": 8}), **NAMES)
    recomputed = titan_flags(
        plan_for({"data": 2, "fsdp": 128, "expert": 32}, recompute=True), **NAMES
    )
    naive = list(best)
    naive[naive.index("--parallelism.data_parallel_shard_degree") + 1] = "1024"
    graphs = [flag for flag in best if flag != "--training.disable_cuda_graphs"]
    cases = {"best": best, "recomputed": recomputed, "naive": naive, "graphs": graphs}
    printed = subprocess.run(
        [str(titan_python()), str(CHECKER), "8192", json.dumps(
            [{"name": name, "flags": flags} for name, flags in cases.items()]
        )],
        capture_output=True, text=True, timeout=240, check=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    ).stdout  # fmt: skip
    report = json.loads(printed.splitlines()[-1])
    results = {result["name"]: result for result in report["results"]}
    assert results["best"]["accepted"] and results["recomputed"]["accepted"]
    assert dict(map(tuple, results["best"]["meshes"]["sparse"])) == {
        "pp": 1, "dp_replicate": 1, "efsdp": 1024, "ep": 8,
    }  # fmt: skip
    assert results["best"]["activation_checkpoint"] is None
    assert results["recomputed"]["activation_checkpoint"] == "FullAC.Config"
    assert results["recomputed"]["degrees"]["dp_replicate"] == 2
    assert rejected_flag(results["naive"]["message"]) == "--parallelism.data_parallel_shard_degree"
    assert rejected_flag(results["graphs"]["message"]) == "--training.disable_cuda_graphs"
    # TorchTitan's own 235B-A22B counts the parameters chapter 9 counted from transformers.
    assert report["model"]["params"] == QWEN3_235B.total_params
    assert "CUDA" in report["model"]["stopped"]
