"""Checks of the emulated TPU that need an interpreter where it is loaded: run by
tests/test_emulator.py as `TPUREADY_EMULATE_TPU=1 python tests/emulator_battery.py`.

Each check stores what it saw (a value or an error's text), never a verdict, in one JSON
object printed last, so the tests make the assertions and a failing check does not hide the
others.
"""

from __future__ import annotations

import copy
import io
import json
import os
import sys
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import torch

from tpuready import emulator
from tpuready.inspection.check import matmul_in_bf16_passes

results: dict[str, Any] = {}


def check(name: str) -> Callable[[Callable[[], Any]], None]:
    """Run the function now and store its value (or its error, as `{"error": ...}`)."""

    def run(function: Callable[[], Any]) -> None:
        try:
            results[name] = function()
        except Exception as error:  # the tests read the error
            results[name] = {"error": f"{type(error).__name__}: {error}"}
            results[f"{name}.traceback"] = traceback.format_exc()

    return run


def error_of(call: Callable[[], Any]) -> str | None:
    try:
        call()
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    return None


@check("device")
def _() -> dict[str, Any]:
    return {
        "accelerator": str(torch.accelerator.current_accelerator()),
        "count": torch.accelerator.device_count(),
        "is_emulated": emulator.is_emulated(),
        "name": torch.tpu.get_device_name(),
        "host": emulator.emulated_host().describe(),
        "tensor": str(torch.ones(2, device="tpu").device),
    }


@check("legacy")
def _() -> dict[str, str | None]:
    calls = {
        "is_available": lambda: torch.tpu.is_available(),
        "device_count": lambda: torch.tpu.device_count(),
        "current_device": lambda: torch.tpu.current_device(),
        "set_device": lambda: torch.tpu.set_device(0),
        "device": lambda: torch.tpu.device(0).__enter__(),
        "set_stream": lambda: torch.tpu.set_stream(None),
        "current_stream": lambda: torch.tpu.current_stream(),
        "synchronize": lambda: torch.tpu.synchronize(),
        "initial_seed": lambda: torch.tpu.initial_seed(),
        "get_rng_state": lambda: torch.tpu.get_rng_state(),
    }
    return {name: error_of(call) for name, call in calls.items()}


@check("legacy_allowed")
def _() -> dict[str, Any]:
    os.environ["TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS"] = "1"
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            counts = [torch.tpu.device_count(), torch.tpu.device_count()]
        return {"counts": counts, "warnings": [str(w.message) for w in caught]}
    finally:
        del os.environ["TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS"]


@check("portable_calls")
def _() -> dict[str, Any]:
    torch.accelerator.synchronize()
    return {
        "count": torch.accelerator.device_count(),
        "index": torch.accelerator.current_device_index(),
        "set_0": error_of(lambda: torch.accelerator.set_device_index(0)),
        "set_1": error_of(lambda: torch.accelerator.set_device_index(1)),
        "to_int": str(torch.ones(2).to(1).device),
        "to_tpu_3": str(torch.ones(2).to("tpu:3").device),
    }


@check("matmul_passes")
def _() -> dict[str, Any]:
    generator = torch.Generator().manual_seed(0)
    left = torch.randn(64, 96, generator=generator)
    right = torch.randn(96, 32, generator=generator)
    exact = left.double() @ right.double()
    found = {}
    for precision, passes in (("medium", 1), ("high", 3), ("highest", 6)):
        torch.set_float32_matmul_precision(precision)
        on_device = (left.to("tpu") @ right.to("tpu")).cpu()
        model = matmul_in_bf16_passes(left, right, passes)
        error = float((on_device.double() - exact).norm() / exact.norm())
        found[str(passes)] = {"equals_model": torch.equal(on_device, model), "error": error}
    torch.set_float32_matmul_precision("highest")
    with torch.tpu.precision(torch.tpu.Precision.DEFAULT):
        block = (left.to("tpu") @ right.to("tpu")).cpu()
    found["precision_block_equals_1_pass"] = torch.equal(
        block, matmul_in_bf16_passes(left, right, 1)
    )
    torch.set_float32_matmul_precision("medium")
    linear = torch.nn.functional.linear(left.to("tpu"), right.t().to("tpu")).cpu()
    found["linear_equals_1_pass"] = torch.equal(linear, matmul_in_bf16_passes(left, right, 1))
    found["bf16_inputs_unchanged"] = torch.equal(
        (left.bfloat16().to("tpu") @ right.bfloat16().to("tpu")).cpu(),
        left.bfloat16() @ right.bfloat16(),
    )
    return found


@check("convolution")
def _() -> dict[str, Any]:
    """A convolution: the backend hook PyTorch calls for a device it does not know."""
    generator = torch.Generator().manual_seed(2)
    images = torch.randn(2, 3, 9, 9, generator=generator)
    weight = torch.randn(4, 3, 3, 3, generator=generator, requires_grad=True)
    bias = torch.randn(4, generator=generator)
    torch.set_float32_matmul_precision("medium")
    on_device = torch.nn.functional.conv2d(images.to("tpu"), weight.to("tpu"), bias.to("tpu"))
    model = torch.nn.functional.conv2d(
        images.bfloat16().float(), weight.detach().bfloat16().float(), bias
    )
    on_device.sum().backward()
    return {
        "equals_one_pass_model": torch.equal(on_device.detach().cpu(), model),
        "weight_grad_shape": list(weight.grad.shape),
        "bf16": str(
            torch.nn.functional.conv2d(
                images.to("tpu").bfloat16(), weight.detach().to("tpu").bfloat16()
            ).dtype
        ),
    }


@check("autocast")
def _() -> dict[str, str]:
    left = torch.randn(8, 8, device="tpu")
    with torch.autocast("tpu"):
        product = left @ left
        softmax = torch.softmax(product, dim=-1)
    return {
        "default_dtype": str(torch.get_autocast_dtype("tpu")),
        "matmul": str(product.dtype),
        "softmax": str(softmax.dtype),
    }


@check("mixed_device")
def _() -> dict[str, str | None]:
    on_device = torch.ones(3, device="tpu")
    return {
        "tensor": error_of(lambda: on_device + torch.ones(3)),
        "matmul": error_of(lambda: on_device.reshape(1, 3) @ torch.ones(3, 1)),
        "scalar": error_of(lambda: on_device + torch.tensor(2.0)),
        "cpu_index": error_of(lambda: on_device[torch.tensor([0, 2])]),
    }


@check("save_load")
def _() -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1)
    state = {"weight": torch.randn(5, 7, generator=generator).to("tpu"), "step": 3}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    to_host = torch.load(buffer, map_location="cpu", weights_only=True)
    buffer.seek(0)
    to_device = torch.load(buffer, map_location="tpu", weights_only=True)
    return {
        "host_bits_equal": torch.equal(to_host["weight"], state["weight"].cpu()),
        "device": str(to_device["weight"].device),
        "device_bits_equal": torch.equal(to_device["weight"].cpu(), state["weight"].cpu()),
    }


@check("modules")
def _() -> dict[str, Any]:
    embedding = torch.nn.Embedding(11, 4)
    head = torch.nn.Linear(4, 11, bias=False)
    head.weight = embedding.weight
    model = torch.nn.Sequential(embedding, head)
    parameter = embedding.weight
    model.to("tpu")
    clone = copy.deepcopy(model)
    clone[0].weight.data.add_(1)
    return {
        "tied": model[0].weight is model[1].weight,
        "same_parameter_object": model[0].weight is parameter,
        "device": str(model[0].weight.device),
        "deepcopy_tied": clone[0].weight is clone[1].weight,
        "deepcopy_device": str(clone[0].weight.device),
        "deepcopy_independent": not torch.equal(clone[0].weight.cpu(), model[0].weight.cpu()),
    }


@check("training")
def _() -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    inputs, targets = torch.randn(16, 6), torch.randn(16, 1)
    model.to("tpu")
    inputs, targets = inputs.to("tpu"), targets.to("tpu")
    losses = []
    for _ in range(5):
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@check("not_emulated")
def _() -> str | None:
    return error_of(lambda: torch.batch_norm_stats(torch.ones(2, 3, device="tpu"), 1e-5))


@check("storage_and_pinning")
def _() -> dict[str, Any]:
    storage = torch.UntypedStorage(16, device="tpu")
    pinned = torch.arange(4.0).pin_memory()
    return {"storage_device": str(storage.device), "pinned": pinned.tolist()}


@check("resize")
def _() -> dict[str, Any]:
    """FSDP2's free and refill: a storage shrinks to nothing and grows again, and a storage
    that grows keeps its bytes."""
    tensor = torch.arange(4.0, device="tpu")
    storage = tensor.untyped_storage()
    before = emulator.memory_allocated()
    storage.resize_(64)
    grown = torch.empty(0, device="tpu").set_(storage, 0, (16,), (1,))
    kept = grown[:4].cpu().tolist()
    storage.resize_(0)
    freed = before - emulator.memory_allocated()
    storage.resize_(16)
    return {"kept": kept, "freed": freed, "refilled": storage.nbytes()}


@check("compile")
def _() -> dict[str, Any]:
    emulator.report().clear()

    def step(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2

    compiled = torch.compile(step)
    for length in (3, 4, 5, 4):
        compiled(torch.ones(length, device="tpu"))
    counts = emulator.report().as_dict()

    def refused(**options: Any) -> str | None:
        torch._dynamo.reset()  # a fresh cache: each call compiles
        return error_of(lambda: torch.compile(step, **options)(torch.ones(3, device="tpu")))

    def under_inference_mode() -> str | None:
        with torch.inference_mode():
            return refused()

    torch._dynamo.reset()
    return {
        "graphs": sum(entry["count"] for entry in counts["graphs"]),
        "recompiles": sum(entry["count"] for entry in counts["recompiles"]),
        "dynamic_true": refused(dynamic=True),
        "mode": refused(mode="reduce-overhead"),
        "inductor_option": refused(options={"max_autotune": True}),
        "own_option": refused(options={"bucket_size": 128}),
        "inductor": refused(backend="inductor"),
        "aot_eager": refused(backend="aot_eager"),
        "inference_mode": under_inference_mode(),
    }


def numbers_for_tensors() -> dict[str, Any]:
    """`x % 2`: the dispatcher hands a Python kernel the 2 itself, not a tensor."""
    values = torch.arange(4, device="tpu", dtype=torch.int32)
    return {
        "remainder": (values % 2).tolist(),
        "dtype": str((values % 2).dtype),  # a wrapped number does not widen int32
        "bitwise_and": (values & 1).tolist(),
        "fmod": values.float().fmod(3).tolist(),
    }


def break_reasons_after_tolist() -> list[str]:
    """A graph break runs the rest eagerly: Dynamo must not trace the emulator meanwhile."""

    def largest_error(left: torch.Tensor, right: torch.Tensor) -> float:
        return max((left - right).abs().flatten().tolist())

    left, right = torch.randn(8, device="tpu"), torch.randn(8, device="tpu")
    explained = torch._dynamo.explain(largest_error)(left, right)
    torch._dynamo.reset()
    return [str(reason.reason).splitlines()[0] for reason in explained.break_reasons]


@check("pitfalls")
def _() -> dict[str, Any]:
    """What a Python backend gets wrong unless it takes care (the issue's list)."""
    from torch.profiler import ProfilerActivity, profile

    left = torch.randn(8, 8, device="tpu")
    with profile(activities=[ProfilerActivity.CPU]) as profiled:
        left @ left + 1
    events = sorted({event.name for event in profiled.events()})
    counts = torch.histc(torch.tensor([0, 1, 1, 3], device="tpu"), bins=4, min=0, max=3)

    def block(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ x) + 1

    explained = torch._dynamo.explain(block)(left)
    torch._dynamo.reset()
    emulator.report().clear()
    first, second = torch.nn.Linear(8, 8).to("tpu"), torch.nn.Linear(8, 8).to("tpu")
    torch.compile(first)(left)
    torch.compile(second)(left)  # the same code: Dynamo's cache, not a second compile
    graphs = emulator.report().total("graphs")
    torch._dynamo.reset()
    return {
        "profiler_events": events,
        "integer_histc": [str(counts.dtype), counts.tolist()],
        "graph_breaks": explained.graph_break_count,
        "graphs": explained.graph_count,
        "two_compiled_blocks_graphs": graphs,
        "wrapped_number": (torch.ones(2, device="tpu") * 3 + 0.5).tolist(),
        "numbers_for_tensors": numbers_for_tensors(),
        "break_reasons_after_tolist": break_reasons_after_tolist(),
    }


@check("fork")
def _() -> dict[str, Any]:
    """A forked child may not use the device (TorchTPU's workers are spawned)."""
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # the child: report what a device operation did, then leave at once
        try:
            torch.ones(2, device="tpu") + 1
            message = "ran"
        except RuntimeError as error:
            message = str(error)
        os.write(write, message.encode()[:4000])
        os._exit(0)
    os.close(write)
    os.waitpid(child, 0)
    with os.fdopen(read) as pipe:
        in_child = pipe.read()
    return {"child": in_child, "parent_still_works": (torch.ones(2, device="tpu") + 1).tolist()}


@check("report")
def _() -> dict[str, Any]:
    emulator.report().clear()
    values = torch.tensor([0.0, 1.0, 2.0], device="tpu")
    values.sum().item()
    torch.nonzero(values)
    repeats = torch.tensor([1, 2, 0], device="tpu")
    torch.repeat_interleave(values, repeats)  # its size depends on the repeats: a sync
    torch.repeat_interleave(values, repeats, output_size=3)  # its size is given: none
    values.double()
    matrix = torch.eye(3, device="tpu") * 2
    torch.linalg.cholesky(matrix)
    print(values, file=io.StringIO())  # one print: one sync, however many reads
    data = emulator.report().as_dict()
    return {
        section: [entry["what"] for entry in data[section]] for section in data if section != "host"
    }


@check("prints")
def _() -> dict[str, Any]:
    """Each print of a tensor is one sync, and a printed tensor is freed once deleted."""
    import gc

    emulator.report().clear()
    kind = "print(tensor) or repr (reads values on the host)"
    doubled = torch.arange(1024.0, device="tpu") * 2
    print(doubled, file=io.StringIO())
    del doubled
    once = emulator.report().total("host_syncs", kind)
    printed = torch.arange(1024.0, device="tpu")
    print(printed, file=io.StringIO())
    twice = emulator.report().total("host_syncs", kind)
    held = emulator.memory_allocated()
    del printed
    gc.collect()
    return {"once": once, "twice": twice, "freed": held - emulator.memory_allocated()}


@check("default_group")
def _() -> dict[str, Any]:
    """`init_process_group()` with no backend: TorchTPU's idiom, the group gets tpu_dist."""
    import torch.distributed as dist

    dist.init_process_group(store=dist.HashStore(), rank=0, world_size=1)
    try:
        values = torch.ones(2, device="tpu") * 3
        dist.all_reduce(values)
        return {"config": str(dist.get_backend_config()), "all_reduce": values.tolist()}
    finally:
        dist.destroy_process_group()


@check("launch_rules")
def _() -> dict[str, str | None]:
    from datetime import timedelta

    from torch.tpu.distributed import set_tpu_launch_env

    from tpuready.emulator.distributed import create_backend

    results = {
        "2": error_of(lambda: set_tpu_launch_env(nnodes=1, nproc_per_node=2)),
        "4": error_of(lambda: set_tpu_launch_env(nnodes=1, nproc_per_node=4)),
        "16": error_of(lambda: set_tpu_launch_env(nnodes=1, nproc_per_node=16)),
        "default_backend": torch.distributed.Backend.default_device_backend_map.get("tpu"),
    }
    # This process set the variables itself, after it started: too late for a rank of it.
    store = torch.distributed.HashStore()
    results["set_in_the_rank"] = error_of(lambda: create_backend(store, 0, 2, timedelta(1)))
    return results


print(json.dumps(results), file=sys.stdout)
