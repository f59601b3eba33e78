"""`tpuready.calc.titan`: a plan's TorchTitan flags, checked by hand, by property and by TorchTitan.

The last test runs chapter 26's checker (`notebooks/titan/ch26_check.py`) in the TorchTitan venv:
TorchTitan 0.3.0's own config classes, `ParallelDims` and mesh construction on a fake process
group of 16,384 ranks (8,192 v7 chips of two devices) accept the flags `titan_flags` writes and
reject the mistakes the chapter shows, each naming the flag `rejected_flag` finds.
"""

from __future__ import annotations

import json
import math
import platform
import re
import subprocess
from pathlib import Path

import pytest
from conftest import QWEN3_235B
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuready.calc.plan import ModelConfig, PlanError, make_plan
from tpuready.calc.titan import (
    TitanConfigError,
    TitanRejection,
    chip_split_costs,
    choose_within_chip,
    raise_for_rejection,
    rejected_flag,
    titan_degrees,
    titan_flags,
    titan_options,
    titan_run_flags,
)

REPOSITORY = Path(__file__).resolve().parent.parent
TITAN_PYTHON = REPOSITORY / ".venv-titan" / "bin" / "python"
CHECKER = REPOSITORY / "notebooks" / "titan" / "ch26_check.py"

NAMES = {"module": "qwen3_235b", "config": "qwen3_235b_a22b"}


def plan_for(
    mesh: dict[str, int], *, recompute: bool = False, seq_len: int = 4096, chip: str = "v7"
):
    return make_plan(
        QWEN3_235B,
        mesh,
        chip,
        num_chips=math.prod(mesh.values()),
        global_batch=8192,
        seq_len=seq_len,
        recompute=recompute,
    )


def test_chapter_14s_best_mesh_by_hand():
    flags = titan_flags(plan_for({"fsdp": 1024, "expert": 8}), **NAMES)
    assert flags == [
        "--module", "qwen3_235b", "--config", "qwen3_235b_a22b",
        "--parallelism.pipeline_parallel_degree", "1",
        "--parallelism.data_parallel_replicate_degree", "1",
        "--parallelism.data_parallel_shard_degree", "8192",
        "--parallelism.context_parallel_degree", "1",
        "--parallelism.tensor_parallel_degree", "2",  # a v7 chip's two devices, as chosen
        "--parallelism.expert_parallel_degree", "16",  # each device half a chip's experts
        "--training.local_batch_size", "1",
        "--training.global_batch_size", "8192",
        "--training.seq_len", "4096",
        "--training.disable_cuda_graphs",
        "activation-checkpoint:none",
    ]  # fmt: skip


def test_data_axis_and_recompute():
    flags = titan_flags(plan_for({"data": 2, "fsdp": 128, "expert": 32}, recompute=True), **NAMES)
    options = titan_options(flags)
    assert options["--parallelism.data_parallel_replicate_degree"] == "2"
    assert options["--parallelism.data_parallel_shard_degree"] == "4096"
    assert options["--training.local_batch_size"] == "1"
    assert flags[-1] == "activation-checkpoint:full"


def test_a_one_device_chip_has_no_context_parallelism():
    options = titan_options(titan_flags(plan_for({"fsdp": 256, "tensor": 4}, chip="v5p"), **NAMES))
    assert options["--parallelism.context_parallel_degree"] == "1"
    assert options["--parallelism.tensor_parallel_degree"] == "4"
    assert options["--training.local_batch_size"] == "32"  # 8192 sequences over 256 ranks


def test_context_inside_a_chip_moves_the_devices_from_tp_to_cp():
    plan = plan_for({"fsdp": 1024, "expert": 8})
    options = titan_options(titan_flags(plan, **NAMES, within_chip="context"))
    assert options["--parallelism.context_parallel_degree"] == "2"
    assert options["--parallelism.tensor_parallel_degree"] == "1"
    assert options["--parallelism.expert_parallel_degree"] == "16"  # ep borrows cp's ranks
    assert options["--parallelism.context_parallel_load_balancer"] == "ptrr"  # FlexAttention
    assert titan_flags(plan, **NAMES, within_chip="tensor") == titan_flags(plan, **NAMES)
    with pytest.raises(TitanConfigError, match="within_chip"):
        titan_degrees({"fsdp": 4}, devices_per_chip=2, within_chip="pipeline")


def test_chip_split_costs_for_chapter_26s_plan_by_hand():
    plan = plan_for({"fsdp": 1024, "expert": 8})
    context, tensor = chip_split_costs(plan).values()
    tokens, layers, half = 4096, 94, 1 / 2  # a chip's tokens; what a device receives
    # cp: keys and values (2 x 4 heads x 128) gathered forward, gradients back, per layer,
    # received by each of the chip's two devices.
    assert context.activation_bytes == 2 * layers * 2 * half * tokens * 1024 * 2
    # tp: four (T x 4096) collectives per layer, four more for the embedding and head.
    assert tensor.activation_bytes == 2 * (layers * 4 + 4) * half * tokens * 4096 * 2
    # Dense weights: attention (q, o 4096 x 8192; k, v 4096 x 512; q/k norms), the router
    # and the untied embedding and head, gathered in bf16 twice and reduced in fp32.
    dense = layers * (2 * 4096 * 8192 + 2 * 4096 * 512 + 2 * 128 + 128 * 4096) + 2 * 151936 * 4096
    gathers = dense * (2 + 2 + 4)
    # Rings in rank order: the same dense bytes over the ICI either way; cp's ring also
    # passes every layer from one of the chip's devices to the other.
    assert tensor.ici_bytes == context.ici_bytes == gathers
    assert tensor.die_to_die_bytes == tensor.activation_bytes
    assert context.die_to_die_bytes == context.activation_bytes + gathers
    # Each device holds half the plan's chip, plus what its split adds.
    saved_input = layers * half * tokens * 4096 * 2  # tp's gathered attention input
    assert tensor.memory_bytes_per_device == plan.memory_bytes / 2 + saved_input
    assert context.memory_bytes_per_device > plan.memory_bytes / 2
    assert choose_within_chip(plan) == "tensor"  # fewer bytes inside the chip, as many outside


@settings(max_examples=40)
@given(
    mesh=st.sampled_from([{"fsdp": 64}, {"fsdp": 8, "expert": 8}, {"data": 2, "fsdp": 32}]),
    seq_len=st.sampled_from([1024, 4096, 16384, 65536]),
    recompute=st.booleans(),
)
def test_activations_grow_with_the_chips_tokens_and_the_weights_do_not(mesh, seq_len, recompute):
    costs = [
        chip_split_costs(
            make_plan(QWEN3_235B, mesh, "v7", num_chips=64, global_batch=64 * batch,
                      seq_len=seq_len, recompute=recompute)
        )
        for batch in (1, 2)
    ]  # fmt: skip
    for name in ("context", "tensor"):
        one, two = costs[0][name], costs[1][name]
        assert two.activation_bytes == pytest.approx(2 * one.activation_bytes)
        assert two.ici_bytes == one.ici_bytes
        weights = one.die_to_die_bytes - one.activation_bytes  # the dense gathers' hops
        assert two.die_to_die_bytes - two.activation_bytes == pytest.approx(weights)
    # cp always moves fewer activation bytes (Qwen3's K and V are narrower than the hidden
    # state) and passes the dense gathers between the dies; both move them once over the ICI.
    context, tensor = costs[0].values()
    assert context.activation_bytes < tensor.activation_bytes
    assert context.ici_bytes == tensor.ici_bytes
    assert context.die_to_die_bytes - context.activation_bytes == context.ici_bytes


@settings(max_examples=40)
@given(
    mesh=st.sampled_from([{"fsdp": 64}, {"fsdp": 8, "expert": 8}, {"data": 2, "fsdp": 32}]),
    batch=st.sampled_from([1, 4, 16, 64]),
    seq_len=st.sampled_from([1024, 4096, 16384, 65536]),
    recompute=st.booleans(),
)
def test_the_choice_follows_the_bytes(mesh, batch, seq_len, recompute):
    plan = make_plan(QWEN3_235B, mesh, "v7", num_chips=64, global_batch=64 * batch,
                     seq_len=seq_len, recompute=recompute)  # fmt: skip
    context, tensor = chip_split_costs(plan).values()
    usable = plan.chip.per_device_hbm_bytes * (1 - plan.hbm_headroom)
    fewer = tensor.die_to_die_bytes < context.die_to_die_bytes
    fits = tensor.memory_bytes_per_device <= usable
    assert choose_within_chip(plan) == ("tensor" if fewer and fits else "context")
    options = titan_options(titan_flags(plan, **NAMES))
    assert options["--parallelism.tensor_parallel_degree"] == ("2" if fewer and fits else "1")


def test_long_sequences_and_narrow_heads_keep_context():
    # Past the crossover (activations outgrow the weights) cp moves fewer bytes.
    long = make_plan(QWEN3_235B, {"fsdp": 64}, "v7", num_chips=64, global_batch=64 * 16,
                     seq_len=65536, recompute=True)  # fmt: skip
    context, tensor = chip_split_costs(long).values()
    assert context.die_to_die_bytes < tensor.die_to_die_bytes
    assert choose_within_chip(long) == "context"
    # One key-value head: TorchTitan's tp must divide it.
    one_kv = ModelConfig("one-kv", 94, 4096, 64, 1, 128, 128, 8, 1536, 151936)
    narrow = make_plan(one_kv, {"fsdp": 1024, "expert": 8}, "v7", num_chips=8192,
                       global_batch=8192, seq_len=4096, recompute=False)  # fmt: skip
    chip_split_costs(narrow)  # priced, but not launchable as tp 2
    assert choose_within_chip(narrow) == "context"
    # A tensor axis, or a chip of one device: nothing the model prices.
    assert choose_within_chip(plan_for({"fsdp": 2048, "tensor": 4})) == "context"
    assert choose_within_chip(plan_for({"fsdp": 256}, chip="v5p")) == "context"
    with pytest.raises(TitanConfigError, match="use make_plan"):
        choose_within_chip({"fsdp": 4})


@pytest.mark.parametrize(
    ("plan", "needle"),
    [
        ("not a plan", "use make_plan"),
        (plan_for({"fsdp": 256}, chip="v5p"), "devices_per_chip=1"),
        (plan_for({"fsdp": 4, "tensor": 2}), "plan.mesh['tensor']=2"),
    ],
)
def test_chip_split_costs_refuses_what_it_does_not_model(plan, needle):
    with pytest.raises(TitanConfigError, match=re.escape(needle)):
        chip_split_costs(plan)


# A plan may have an expert axis or a tensor axis, not both (TorchTitan has no such layout).
mesh_sizes = st.tuples(
    st.fixed_dictionaries(
        {}, optional={axis: st.sampled_from([1, 2, 4, 8, 16]) for axis in ("data", "fsdp")}
    ),
    st.one_of(
        st.fixed_dictionaries({"expert": st.sampled_from([1, 2, 4, 8, 16])}),
        st.fixed_dictionaries({"tensor": st.sampled_from([1, 2, 4])}),
    ),
).map(lambda parts: parts[0] | parts[1])


@settings(max_examples=80)
@given(mesh=mesh_sizes, devices_per_chip=st.sampled_from([1, 2]))
def test_degrees_satisfy_torchtitans_mesh_rules_and_keep_the_plans_experts(mesh, devices_per_chip):
    degrees = titan_degrees(mesh, devices_per_chip=devices_per_chip)
    pp, replicate, shard, context, tensor, expert = degrees.values()
    assert list(degrees) == [  # TorchTitan's mesh order, then ep
        f"{name}_degree"
        for name in (
            "pipeline_parallel",
            "data_parallel_replicate",
            "data_parallel_shard",
            "context_parallel",
            "tensor_parallel",
            "expert_parallel",
        )
    ]
    # ParallelDims: the degrees multiply to the world, one rank per device.
    assert pp * replicate * shard * context * tensor == math.prod(mesh.values()) * devices_per_chip
    # EP borrows from dp_shard x cp x tp; what is left, efsdp, FSDP-shards the experts.
    assert (shard * context * tensor) % expert == 0
    efsdp = shard * context * tensor // expert
    if mesh.get("expert", 1) > 1:
        # The plan's layout: experts sharded over its fsdp axis, an expert group spanning its
        # expert chips, and each chip holding num_experts / expert of them.
        assert efsdp == mesh.get("fsdp", 1)
        assert expert == mesh["expert"] * devices_per_chip
        chip_experts = QWEN3_235B.num_experts // expert * devices_per_chip
        assert chip_experts == QWEN3_235B.num_experts // mesh["expert"]
    else:
        assert expert == 1  # no expert parallelism: experts split like dense weights


@settings(max_examples=40)
@given(mesh=mesh_sizes, recompute=st.booleans(), chip=st.sampled_from(["v5p", "v7"]))
def test_each_chip_trains_the_plans_tokens(mesh, recompute, chip):
    plan = make_plan(
        QWEN3_235B,
        mesh,
        chip,
        num_chips=math.prod(mesh.values()),
        global_batch=8 * 8 * 16 * 16,
        seq_len=4096,
        recompute=recompute,
    )
    options = titan_options(titan_flags(plan, **NAMES))
    # A dp rank's sequences are one chip's (its devices split them with cp; tensor ranks share
    # them): what the plan counts per chip.
    local = int(options["--training.local_batch_size"])
    assert local * int(options["--training.seq_len"]) == plan.tokens_per_chip
    batch_ranks = int(options["--parallelism.data_parallel_replicate_degree"]) * int(
        options["--parallelism.data_parallel_shard_degree"]
    )
    assert local * batch_ranks == int(options["--training.global_batch_size"]) == plan.global_batch
    context = int(options["--parallelism.context_parallel_degree"])
    balancer = options.get("--parallelism.context_parallel_load_balancer")
    assert balancer == ("ptrr" if context > 1 else None)
    tensor = int(options["--parallelism.tensor_parallel_degree"])
    assert context * tensor == plan.chip.devices_per_chip * plan.mesh.get("tensor", 1)
    assert "--training.disable_cuda_graphs" in options


@pytest.mark.parametrize(
    ("call", "needle"),
    [
        (lambda: titan_degrees({"pipeline": 2}), "unknown mesh axes ['pipeline']"),
        (lambda: titan_degrees({"fsdp": 2.0}), "mesh['fsdp']"),
        (lambda: titan_degrees([("fsdp", 2)]), "mesh must map axis names"),
        (lambda: titan_degrees({"fsdp": 2}, devices_per_chip=0), "devices_per_chip"),
        (
            lambda: titan_degrees({"fsdp": 128, "expert": 16, "tensor": 4}),
            "mesh['expert']=16 with mesh['tensor']=4",
        ),
        (lambda: titan_flags({"fsdp": 8}, **NAMES), "use make_plan"),
        (
            lambda: titan_flags(plan_for({"fsdp": 8}), module="qwen3-235b", config="c"),
            "module must be a Python module name",
        ),
        (
            lambda: titan_flags(plan_for({"fsdp": 8}), module="qwen3_235b", config="a.b"),
            "config must be a Python function name",
        ),
        (  # a v7 plan: cp 2 x 128 (FlexAttention's block masks) must divide it
            lambda: titan_flags(plan_for({"fsdp": 4, "tensor": 2}, seq_len=4104), **NAMES),
            "seq_len=4104 is not divisible by 256",
        ),
        (  # one device a chip: tp alone (sequence parallelism)
            lambda: titan_flags(
                plan_for({"fsdp": 4, "tensor": 2}, seq_len=4095, chip="v5p"), **NAMES
            ),
            "seq_len=4095 is not divisible by 2",
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
            "Unrecognized options: --parallelism.expert_parallel, 8 Perhaps you meant: "
            "--parallelism.expert-parallel-degree",
            "--parallelism.expert_parallel_degree",
        ),
        ("Cannot import module 'qwen3_nope' or 'qwen3_nope.config_registry'.", "--module"),
        ("Config function 'nope' not found in qwen3_235b.", "--config"),
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


def test_options_read_every_spelling_torchtitan_takes():
    flags = [
        "--module", "qwen3_235b",
        "--parallelism.expert-parallel-degree=8",
        "--training.disable_cuda_graphs",
        "--training.seq_len", "4096",
        "--checkpoint.folder", "gs://bucket/run",
        "activation-checkpoint:full",
    ]  # fmt: skip
    assert titan_options(flags) == {
        "--module": "qwen3_235b",
        "--parallelism.expert_parallel_degree": "8",
        "--training.disable_cuda_graphs": "",
        "--training.seq_len": "4096",
        "--checkpoint.folder": "gs://bucket/run",  # a colon, but a value
        "activation-checkpoint:full": "",
    }
    with pytest.raises(TypeError, match="list of strings"):
        titan_options("--module qwen3_235b")


def titan_python() -> Path:
    if TITAN_PYTHON.exists():
        return TITAN_PYTHON
    if (platform.system(), platform.machine()) == ("Linux", "x86_64"):
        pytest.fail(f"{TITAN_PYTHON} is missing: run `make titan-venv`")
    pytest.skip("the TorchTitan venv is for x86-64 Linux only")


def test_torchtitan_accepts_the_flags_and_rejects_the_mistakes():
    best = titan_flags(plan_for({"fsdp": 1024, "expert": 8}), **NAMES)
    cases = {
        "best": best,
        "recomputed": titan_flags(
            plan_for({"data": 2, "fsdp": 128, "expert": 32}, recompute=True), **NAMES
        ),
        "tensor": titan_flags(plan_for({"fsdp": 2048, "tensor": 4}), **NAMES),
        "cp inside": titan_flags(
            plan_for({"fsdp": 1024, "expert": 8}), **NAMES, within_chip="context"
        ),
        "naive": [
            "1024" if flags_index == best.index("--parallelism.data_parallel_shard_degree") + 1
            else flag
            for flags_index, flag in enumerate(best)
        ],
        "graphs": [flag for flag in best if flag != "--training.disable_cuda_graphs"],
        "misspelt": [
            "--parallelism.expert_parallel" if flag == "--parallelism.expert_parallel_degree"
            else flag
            for flag in best
        ],
        "module": ["--module", "qwen3_nope", *best[2:]],
        "launch": titan_flags(
            plan_for({"fsdp": 1024, "expert": 8}), **NAMES,
            run_flags=titan_run_flags(dump_folder="/mnt/run", checkpoint_interval=250),
        ),
    }  # fmt: skip
    devices = 8192 * 2  # chapter 14's v7 chips, two devices each
    printed = subprocess.run(
        [str(titan_python()), str(CHECKER), str(devices), json.dumps(
            [{"name": name, "flags": flags} for name, flags in cases.items()]
        )],
        capture_output=True, text=True, timeout=240, check=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    ).stdout  # fmt: skip
    report = json.loads(printed.splitlines()[-1])
    results = {result["name"]: result for result in report["results"]}
    assert all(results[name]["accepted"] for name in ("best", "recomputed", "tensor", "cp inside"))
    meshes = {
        name: {mesh: dict(map(tuple, axes)) for mesh, axes in results[name]["meshes"].items()}
        for name in ("best", "tensor", "cp inside")
    }
    # The plan's experts: FSDP over its fsdp axis, an expert group of 8 chips' 16 devices.
    for name in ("best", "cp inside"):
        assert meshes[name]["sparse"] == {"pp": 1, "dp_replicate": 1, "efsdp": 1024, "ep": 16}
    assert meshes["best"]["dense"]["tp"] == meshes["cp inside"]["dense"]["cp"] == 2
    # Rank 0's groups: its chip partner is rank 1 (tp innermost; with cp, tp 1), its expert
    # group ranks 0 to 15.
    assert results["best"]["groups"] == {"tp": [0, 1], "ep": list(range(16))}
    assert results["cp inside"]["groups"] == {"cp": [0, 1], "ep": list(range(16))}
    assert meshes["tensor"]["dense"] == {
        "pp": 1, "dp_replicate": 1, "dp_shard": 2048, "cp": 2, "tp": 4,
    }  # fmt: skip
    assert results["tensor"]["groups"] == {"cp": [0, 4], "tp": [0, 1, 2, 3]}  # partner r + tp
    assert results["best"]["activation_checkpoint"] is None
    assert results["recomputed"]["activation_checkpoint"] == "FullAC.Config"
    assert results["recomputed"]["degrees"]["dp_replicate"] == 2
    for name, flag in {
        "naive": "--parallelism.data_parallel_shard_degree",
        "graphs": "--training.disable_cuda_graphs",
        "misspelt": "--parallelism.expert_parallel_degree",  # tyro's suggestion
        "module": "--module",
    }.items():
        assert not results[name]["accepted"], name
        assert rejected_flag(results[name]["message"]) == flag, results[name]
    # TorchTitan's own 235B-A22B counts the parameters chapter 14 counted from transformers.
    assert report["model"]["params"] == QWEN3_235B.total_params
    assert "CUDA" in report["model"]["stopped"]
    # The run flags as TorchTitan reads them, and its refusal of TorchTPU's backend for
    # FlexAttention.
    launch = results["launch"]
    assert launch["accepted"] and launch["dump_folder"] == "/mnt/run"
    assert launch["checkpoint"] == {
        "enable": True, "folder": "checkpoint", "interval": 250, "async_mode": "async",
    }  # fmt: skip
    assert launch["compile"]["enable"] and launch["compile"]["backend"] == "tpu"
    assert "FlexAttention" in report["model"]["compile_refused"]["tpu"]


def test_run_flags_go_before_the_subcommand_and_name_torchtpus_backend():
    run = titan_run_flags(dump_folder="/mnt/run", checkpoint_interval=250)
    assert titan_options(run) == {
        "--dump_folder": "/mnt/run",
        "--checkpoint.enable": "",
        "--checkpoint.folder": "checkpoint",
        "--checkpoint.interval": "250",
        "--checkpoint.async_mode": "async",
        "--compile.enable": "",
        "--compile.backend": "tpu",
    }
    plan = plan_for({"fsdp": 1024, "expert": 8})
    flags = titan_flags(plan, **NAMES, run_flags=run)
    assert flags == [*titan_flags(plan, **NAMES)[:-1], *run, flags[-1]]
    assert flags[-1] == "activation-checkpoint:none"


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"checkpoint_interval": 0}, "checkpoint_interval must be at least 1"),
        ({"checkpoint_interval": 5, "async_mode": "threads"}, "async_mode must be one of"),
        ({"checkpoint_interval": 5, "dump_folder": ""}, "dump_folder must be a non-empty"),
        ({"checkpoint_interval": 5, "compile_backend": "--x"}, "compile_backend must be"),
    ],
)
def test_run_flags_refuse_bad_values(kwargs, needle):
    with pytest.raises(TitanConfigError, match=needle):
        titan_run_flags(**{"dump_folder": "/mnt/run", **kwargs})
    with pytest.raises(TitanConfigError, match="run_flags must be a list of strings"):
        titan_flags(plan_for({"fsdp": 1024, "expert": 8}), **NAMES, run_flags="--x")
