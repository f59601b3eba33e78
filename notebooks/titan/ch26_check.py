"""Chapter 26's check of TorchTitan flags, run with the TorchTitan venv.

    python ch26_check.py WORLD_SIZE CASES_JSON

CASES_JSON is a list of {"name": ..., "flags": [...]}: the command-line
flags of `torchtitan.train`, `--module` and `--config` included. Each case
goes through TorchTitan 0.3.0's own code up to `parallelize_fn`, without
its device calls: `ConfigManager.parse_args` (its config classes, through
tyro), then `ParallelDims` (the degrees against the world size), then
`ParallelDims.build_mesh` on a fake process group of WORLD_SIZE ranks,
whose rank 0's groups it reports. The trainer's own batch and sequence
checks are not run (`tpuready.calc.titan.titan_flags` keeps to them); the
global batch is reported as the trainer derives it. For the first
accepted case it also builds the model on the meta device and calls the
model's `parallelize_fn`, which is where a CPU stops; and it reads the
bf16 peak TorchTitan's MFU divides by for each TPU. An accepted case's
checkpoint, compile and output settings are reported as TorchTitan read
them; for each compile backend an accepted case enables, the model is
put to the check TorchTitan's `apply_compile` makes first (a model with
FlexAttention compiles with 'inductor' or 'aot_eager' only). Prints one
JSON line; TorchTitan's log goes to standard error.
"""

import contextlib
import io
import json
import re
import sys

import torch
import torch.distributed as dist
from torchtitan.config import ConfigManager
from torchtitan.distributed.compile import _maybe_regional_inductor_backend
from torchtitan.distributed.parallel_dims import ParallelDims
from torchtitan.tools.utils import get_peak_flops

TPU_NAMES = ("TPU v5e", "TPU v5p", "TPU v6e", "TPU v7")


def tyro_message(text: str) -> str:
    """The first paragraph of tyro's error box (drawn in lines or dashes),
    and the first flag it suggests under "Perhaps you meant:"."""
    frame = " \u2502\u256d\u256e\u2570\u256f"
    lines = [line.strip(frame) for line in text.splitlines()]
    # Rules, and a boxed title, start with three dashes or "\u2500 ".
    rules = [
        i
        for i, line in enumerate(lines)
        if re.match("[-\u2500]{3}|\u2500 ", line)
    ]
    body = lines[rules[0] + 1 : rules[1]] if len(rules) > 1 else lines
    message = re.sub(r"\s+", " ", " ".join(body)).strip()
    if "Perhaps you meant:" in lines:
        after = lines[lines.index("Perhaps you meant:") + 1 :]
        suggested = next(line.split()[0] for line in after if line)
        message += f" Perhaps you meant: {suggested}"
    return message


def parse(flags: list[str]) -> object:
    """TorchTitan's config for `flags`; SystemExit carries tyro's message."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return ConfigManager().parse_args(flags)
    except SystemExit as error:
        raise ValueError(tyro_message(captured.getvalue())) from error


def check(flags: list[str], world_size: int) -> tuple[dict, object]:
    """One case's result, and its ParallelDims when TorchTitan accepts it."""
    try:
        config = parse(flags)
    except (ValueError, ImportError) as error:  # tyro, or --module/--config
        return {
            "accepted": False,
            "stage": "parse",
            "message": str(error),
        }, None
    try:
        dims = ParallelDims.from_config(config.parallelism, world_size)
    except AssertionError as error:
        message = str(error)
        return {
            "accepted": False,
            "stage": "degrees",
            "message": message,
        }, None
    try:
        dims.build_mesh()
    except (RuntimeError, ValueError, AssertionError) as error:
        message = str(error).splitlines()[0]
        return {"accepted": False, "stage": "mesh", "message": message}, None
    meshes = {
        name: list(zip(mesh.mesh_dim_names, mesh.shape, strict=True))
        for name, mesh in dims._global_meshes.items()
    }
    training = config.training
    batch_ranks = dims.dp_replicate * dims.dp_shard
    global_batch = training.global_batch_size
    if global_batch < 0:  # the trainer's default: one accumulation step
        global_batch = training.local_batch_size * batch_ranks
    # Rank 0's group on each parallel axis that is on.
    groups = {
        name: mesh.mesh.flatten().tolist()
        for name in ("cp", "tp", "ep")
        if (mesh := dims.get_optional_mesh(name)) is not None
    }
    checkpointing = config.activation_checkpoint  # None when off
    if checkpointing is not None:
        checkpointing = type(checkpointing).__qualname__
    result = {
        "accepted": True,
        "degrees": {
            "pp": dims.pp,
            "dp_replicate": dims.dp_replicate,
            "dp_shard": dims.dp_shard,
            "cp": dims.cp,
            "tp": dims.tp,
            "ep": dims.ep,
        },
        "meshes": meshes,
        "groups": groups,
        "local_batch_size": training.local_batch_size,
        "global_batch_size": global_batch,
        "seq_len": training.seq_len,
        "activation_checkpoint": checkpointing,
        "model": f"{config.model_spec.name} {config.model_spec.flavor}",
        "dump_folder": config.dump_folder,
        "comm_mode": config.comm.mode,
        "checkpoint": {
            key: getattr(config.checkpoint, key)
            for key in ("enable", "folder", "interval", "async_mode")
        },
        "compile": {
            "enable": config.compile.enable,
            "backend": config.compile.backend,
            "components": list(config.compile.components),
        },
    }
    return result, (config, dims)


def model_on_meta(config: object, dims: ParallelDims) -> tuple[dict, object]:
    """Build the model on meta, count it, try TorchTitan's parallelize_fn;
    the report and the model."""
    spec = config.model_spec
    spec.model.update_from_config(config=config)
    with torch.device("meta"):
        model = spec.model.build()
    params, flops = spec.model.get_nparams_and_flops(
        model, config.training.seq_len
    )
    try:
        spec.parallelize_fn(
            model,
            parallel_dims=dims,
            training=config.training,
            parallelism=config.parallelism,
            compile_config=config.compile,
            ac_config=config.activation_checkpoint,
            dump_folder=config.dump_folder,
        )
        stopped = ""
    except (AssertionError, RuntimeError) as error:
        stopped = f"{type(error).__name__}: {str(error).splitlines()[0]}"
    report = {"params": params, "flops_per_token": flops, "stopped": stopped}
    return report, model


def compile_refusals(model: object, backends: list[str]) -> dict:
    """By backend, apply_compile's refusal of it for `model` ('' if none)."""
    refused = {}
    for backend in backends:
        try:
            _maybe_regional_inductor_backend(model, backend)
            refused[backend] = ""
        except ValueError as error:
            refused[backend] = f"ValueError: {error}"
    return refused


def main() -> None:
    world_size = int(sys.argv[1])
    cases = json.loads(sys.argv[2])
    results, model = [], None
    with contextlib.redirect_stdout(sys.stderr):
        dist.init_process_group("fake", rank=0, world_size=world_size)
        first_accepted, backends = None, []
        for case in cases:
            result, built = check(case["flags"], world_size)
            results.append({"name": case["name"], **result})
            if built is not None and first_accepted is None:
                first_accepted = built
            compiled = result.get("compile", {})
            if compiled.get("enable") and compiled["backend"] not in backends:
                backends.append(compiled["backend"])
        if first_accepted is not None:
            model, built_model = model_on_meta(*first_accepted)
            model["compile_refused"] = compile_refusals(built_model, backends)
        dist.destroy_process_group()
        # The peak TorchTitan divides by for MFU, per device, by device name.
        peaks = {name: get_peak_flops(name) for name in TPU_NAMES}
    print(json.dumps({"results": results, "model": model, "peaks": peaks}))


if __name__ == "__main__":
    main()
