"""`torch.compile` under the emulator, patched as TorchTPU 0.2.0 patches it.

- With no `backend=`, a graph whose inputs live on the TPU goes to the `tpu` backend, and
  others to torch's default (inductor); on the TPU, `dynamic` defaults to False, so every new
  input shape compiles a new graph.
- On TPU inputs, `dynamic=True` raises NotImplementedError, `mode=` and any option but the tpu
  backend's own (`TPU_BACKEND_OPTIONS`, accepted and ignored here) raise TypeError (so
  `mode="reduce-overhead"` fails, an upstream bug), `backend="inductor"` raises
  (upstream issue #4300), and compiling under `torch.inference_mode` raises (TorchTPU crashes
  there: use `torch.no_grad`).

The emulated `tpu` backend captures the forward and backward graphs as AOTAutograd does and runs
them op by op on the emulator: it counts graphs and recompiles for the report. It does not
fuse, so no time measured under it says anything about a compiled TPU program.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, cast

import torch

from tpuready.emulator.findings import report

__all__ = ["emulated_tpu_backend", "patch_compile"]

_ORIGINAL_COMPILE: Callable[..., Any] | None = None
# The options TorchTPU's tpu backend takes; any other raises TypeError there.
TPU_BACKEND_OPTIONS = (
    "async_compile",
    "num_dynamic_buckets",
    "bucket_size",
    "serializable",
    "debug_callback",
)


def _has_tpu_tensor(values: Any) -> bool:
    from torch.utils._pytree import tree_leaves

    return any(isinstance(v, torch.Tensor) and v.device.type == "tpu" for v in tree_leaves(values))


def _graph_on_tpu(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> bool:
    """Whether a captured graph touches the TPU: its inputs, its constants, or a tensor it makes
    (a graph can take no device input and build its tensors on the device)."""
    if _has_tpu_tensor(example_inputs):
        return True
    if any(t.device.type == "tpu" for t in (*gm.parameters(), *gm.buffers())):
        return True
    for node in gm.graph.nodes:
        value = node.meta.get("example_value", node.meta.get("val"))
        if _has_tpu_tensor(value):
            return True
        device = node.kwargs.get("device")
        if device is not None and torch.device(device).type == "tpu":
            return True
    return False


def _graph_name(gm: torch.fx.GraphModule) -> str:
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    frame = getattr(compile_id, "frame_id", None)
    return f"graph of frame {frame}" if frame is not None else "graph"


def emulated_tpu_backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Callable:
    """The emulated `tpu` compiler: capture forward and backward, run them op by op."""
    from torch._dynamo.backends.registry import lookup_backend
    from torch._guards import CompileContext

    compile_id = CompileContext.current_compile_id()
    report().record("graphs", _graph_name(gm))
    if compile_id is not None and getattr(compile_id, "frame_compile_id", None):
        report().record("recompiles", _graph_name(gm))
    return lookup_backend("aot_eager")(gm, example_inputs)


def _tpu_or_default(gm: torch.fx.GraphModule, example_inputs: list[Any], **options: Any) -> Any:
    """TorchTPU's default backend: `tpu` for TPU inputs, inductor for the others."""
    if not _graph_on_tpu(gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        patches = dict(options.get("options") or {})
        if options.get("mode"):
            patches.update(torch._inductor.list_mode_options(options["mode"]))
        return compile_fx(gm, example_inputs, config_patches=patches)
    refused = sorted(set(options.get("options") or {}) - set(TPU_BACKEND_OPTIONS))
    if options.get("mode"):
        refused.insert(0, f"mode={options['mode']!r}")
    if refused:
        report().record("refused", f"torch.compile({', '.join(refused)}) on tpu")
        raise TypeError(
            f"TorchTPU's tpu backend takes no {', '.join(refused)}: its options are "
            f"{', '.join(TPU_BACKEND_OPTIONS)} (which the emulator accepts and ignores); drop "
            "mode= and any other option for TPU inputs"
        )
    # Dynamo leaves inference mode while it compiles; the inputs it traced still say so.
    if torch.is_inference_mode_enabled() or any(
        isinstance(t, torch.Tensor) and t.is_inference() for t in example_inputs
    ):
        report().record("refused", "torch.compile under torch.inference_mode")
        raise RuntimeError(
            "TorchTPU 0.2.0 crashes compiling under torch.inference_mode(): compile under "
            "torch.no_grad() instead"
        )
    return emulated_tpu_backend(gm, example_inputs)


def _refuse_on_tpu(name: str, why: str, error: type[Exception]) -> Callable[..., Any]:
    """A backend that refuses TPU inputs and hands others to the named backend."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **options: Any) -> Any:
        if _graph_on_tpu(gm, example_inputs):
            report().record("refused", f"torch.compile({why}) on tpu")
            raise error(f"TorchTPU refuses torch.compile({why}) for TPU inputs: {name}")
        if why.startswith("backend"):
            from torch._dynamo.backends.registry import lookup_backend

            return lookup_backend("inductor")(gm, example_inputs, **options)
        return _tpu_or_default(gm, example_inputs, **options)

    return backend


_INDUCTOR_ON_TPU = _refuse_on_tpu(
    "drop backend='inductor' (upstream issue #4300) and let it pick its tpu backend",
    "backend='inductor'",
    RuntimeError,
)
_DYNAMIC_ON_TPU = _refuse_on_tpu(
    "use dynamic=False with bucketed shapes, or torch._dynamo.mark_dynamic(t, dim, min=, max=)",
    "dynamic=True",
    NotImplementedError,
)


def _module_on_tpu(model: Any) -> bool | None:
    """Whether a module keeps its tensors on the TPU (None: it holds none, or not a module)."""
    if not isinstance(model, torch.nn.Module):
        return None
    tensors = [*model.parameters(), *model.buffers()]
    if not tensors:
        return None
    return any(t.device.type == "tpu" for t in tensors)


def _patched_compile(model: Any = None, **kwargs: Any) -> Any:
    """torch.compile as TorchTPU patches it (see the module's docstring)."""
    # patch_compile sets it before it installs this function in torch.compile's place
    original = cast("Callable[..., Any]", _ORIGINAL_COMPILE)
    if model is None:  # @torch.compile(...) with arguments
        return lambda function: _patched_compile(function, **kwargs)
    backend = kwargs.get("backend")
    if backend == "inductor":
        kwargs["backend"] = _INDUCTOR_ON_TPU
        return original(model, **kwargs)
    if backend not in (None, "tpu"):
        return original(model, **kwargs)
    if kwargs.get("dynamic") is True:
        kwargs["backend"] = _DYNAMIC_ON_TPU
        return original(model, **kwargs)
    kwargs["backend"] = _tpu_or_default
    if kwargs.get("dynamic") is not None:
        return original(model, **kwargs)
    on_tpu = _module_on_tpu(model)
    if on_tpu is not None:
        return original(model, **{**kwargs, "dynamic": False if on_tpu else None})
    # A function (or an empty module): its inputs decide, at the first call.
    compiled: Callable[..., Any] | None = None

    @functools.wraps(model)
    def first_call_decides(*args: Any, **call_kwargs: Any) -> Any:
        nonlocal compiled
        if compiled is None:
            dynamic = False if _has_tpu_tensor((args, call_kwargs)) else None
            compiled = original(model, **{**kwargs, "dynamic": dynamic})
        return compiled(*args, **call_kwargs)

    return first_call_decides


def patch_compile() -> None:
    """Install the patched `torch.compile` (which also takes `backend="tpu"`)."""
    global _ORIGINAL_COMPILE
    if _ORIGINAL_COMPILE is not None:
        return
    _ORIGINAL_COMPILE = torch.compile
    _patched_compile.__doc__ = (torch.compile.__doc__ or "") + "\n(Patched by the emulated TPU.)"
    torch.compile = _patched_compile
