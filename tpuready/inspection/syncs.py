"""Count host syncs and graph breaks on any machine, a CPU-only laptop included.

Taught in `notebooks/06_graph_breaks.ipynb` (`explain_graphs`) and
`notebooks/07_host_syncs.ipynb` (`HostSyncCounter`). On an accelerator the host
queues work and runs ahead; a call that needs a tensor's values in Python (a value read, a
copy to the host, an output whose shape depends on the data) makes the host wait for the
device. On a CPU nothing waits, so we count those calls instead of timing them: the count is
what costs on a TPU, and it is the same number on every machine.

- `HostSyncCounter` counts the calls that would make the host wait, with the call's name.
- `explain_graphs` runs a function once under `torch._dynamo.explain` and returns the graph
  count, the break count and every break reason (with the source line) as plain data.
- `adam_step_counter_reads` says how many of those reads one Adam or AdamW step makes per
  parameter on a device: the count follows the implementation PyTorch picks there.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._foreach_utils as foreach_utils
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "COPY_TO_HOST",
    "DATA_DEPENDENT_SHAPE",
    "VALUE_READ",
    "GraphBreak",
    "GraphReport",
    "HostSync",
    "HostSyncCounter",
    "adam_step_counter_reads",
    "explain_graphs",
    "quiet_compiler_logs",
]

VALUE_READ = "value read"
COPY_TO_HOST = "copy to host"
DATA_DEPENDENT_SHAPE = "data-dependent shape"

# Python-level calls that hand a tensor's values to Python. They are counted where the user
# wrote them (a TorchFunctionMode sees them), because below that level some are invisible:
# tensor printing switches dispatch modes off, and `.cpu()` / `.tolist()` / `.numpy()` of a
# tensor that is already on the CPU never reach the dispatcher.
_PYTHON_LEVEL_READS: dict[Any, tuple[str, str]] = {
    torch.Tensor.item: ("Tensor.item", VALUE_READ),
    torch.Tensor.__bool__: ("Tensor.__bool__", VALUE_READ),
    torch.Tensor.__float__: ("Tensor.__float__", VALUE_READ),
    torch.Tensor.__int__: ("Tensor.__int__", VALUE_READ),
    torch.Tensor.__index__: ("Tensor.__index__", VALUE_READ),
    torch.Tensor.__complex__: ("Tensor.__complex__", VALUE_READ),
    torch.Tensor.__contains__: ("Tensor.__contains__", VALUE_READ),
    torch.Tensor.__format__: ("Tensor.__format__", VALUE_READ),
    torch.Tensor.__repr__: ("Tensor.__repr__", VALUE_READ),
    torch.Tensor.tolist: ("Tensor.tolist", COPY_TO_HOST),
    torch.Tensor.numpy: ("Tensor.numpy", COPY_TO_HOST),
    torch.Tensor.__array__: ("Tensor.__array__", COPY_TO_HOST),
    torch.Tensor.cpu: ("Tensor.cpu", COPY_TO_HOST),
}

# aten ops that return a Python value (not a tensor) computed from the data.
_ATEN_VALUE_READS = {
    torch.ops.aten._local_scalar_dense.default,
    torch.ops.aten.equal.default,
    torch.ops.aten.allclose.default,
}
# aten ops whose output shape depends on the data: the host must learn the size to allocate it.
_ATEN_DATA_DEPENDENT = {
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten._unique.default,
    torch.ops.aten._unique2.default,
    torch.ops.aten.unique_dim.default,
    torch.ops.aten.unique_consecutive.default,
    torch.ops.aten.bincount.default,
}
# Indexing ops that are data-dependent only when an index is a boolean mask.
_ATEN_MASK_INDEXING = {
    torch.ops.aten.index.Tensor,
    torch.ops.aten.index_put.default,
    torch.ops.aten.index_put_.default,
    torch.ops.aten._index_put_impl_.default,
}
_ATEN_COPIES = {torch.ops.aten._to_copy.default, torch.ops.aten.copy_.default}


@dataclass(frozen=True)
class HostSync:
    """One call that makes the host wait for the device: its kind and where it came from, and
    whether only a CPU makes it (`cpu_only`: a check PyTorch skips on every other device)."""

    call: str
    kind: str
    cpu_only: bool = False


class HostSyncCounter:
    """Count the calls in a block of eager code that would make the host wait for the device.

    Use it as a context manager around eager code (not around a `torch.compile`d function)::

        with HostSyncCounter() as syncs:
            train(num_steps=10)
        syncs.count, syncs.by_call()

    What counts, once per call the code makes:

    - value reads: `.item()`, `bool(t)` (an `if` on a tensor), `float(t)`, `int(t)`, using a
      tensor as an index, `x in t`, formatting or printing a tensor, `torch.equal`,
      `torch.allclose`;
    - copies to the host: `.cpu()`, `.tolist()`, `.numpy()`, `np.asarray(t)`, and on an
      accelerator any copy from the device to the CPU (`.to("cpu")`, `cpu_tensor.copy_(t)`);
    - data-dependent shapes: `nonzero`, `torch.where(cond)`, `masked_select`, `unique`,
      `bincount`, `repeat_interleave` without `output_size`, and indexing or assigning with a
      boolean mask (`x[mask]`, `x[mask] = 0`).

    What it cannot see: it counts the calls the code in the block makes (in Python, and
    through PyTorch's dispatcher), not the operators a kernel calls itself, though those go
    through the dispatcher too and the profiler records them; and it times nothing on the
    device. A kernel that reads its inputs on the host itself waits unseen: `torch._grouped_mm`
    copies its offsets to the host inside its kernel wherever it falls back to a loop (a CPU;
    CUDA but for bfloat16 on compute capability 9 or 10). A count of zero means that no call
    the code made asked the host for a value, not that the host never waits.

    `device=None` treats every tensor as if it lived on the accelerator: the rehearsal on a
    CPU. It cannot tell host data from device data, so keep data loading outside the block;
    and on a CPU `.to("cpu")` looks exactly like `.to(device)`, so it is not counted there.
    Pass the accelerator (`choose_device()`) on a real device to count only its tensors.

    A CPU also makes checks an accelerator skips: `F.one_hot` reads CPU ids' range, two value
    reads that PyTorch leaves to the device's scatter elsewhere. They are counted, marked
    `cpu_only` and named "... in F.one_hot (CPU only)"; `accelerator_count` leaves them out.

    `optimizers`: optimizers whose step counters are host data. Without `fused` or
    `capturable`, PyTorch's Adam-family optimizers keep each parameter's step counter on the
    CPU on every device and read it with `.item()` each step (once or twice per parameter,
    depending on the device: `adam_step_counter_reads`); that read never waits for an
    accelerator, but a CPU rehearsal cannot tell it apart from one that does. Every read of a
    named optimizer's step counter is skipped, however many the implementation makes.
    """

    def __init__(
        self,
        device: torch.device | str | None = None,
        *,
        optimizers: Iterable[torch.optim.Optimizer] = (),
    ) -> None:
        self.device_type = None if device is None else torch.device(device).type
        self.optimizers = tuple(optimizers)
        for optimizer in self.optimizers:
            if not isinstance(optimizer, torch.optim.Optimizer):
                raise TypeError(
                    f"optimizers must hold torch.optim.Optimizer objects, got "
                    f"{type(optimizer).__name__}; pass e.g. optimizers=[optimizer]"
                )
        self.syncs: list[HostSync] = []
        self._depth_inside_counted_call = 0
        self._cpu_only_call: str | None = None
        self._cpu_only_reads_left = 0
        self._modes: list[Any] = []

    @property
    def count(self) -> int:
        """How many host syncs the block made."""
        return len(self.syncs)

    @property
    def cpu_only_count(self) -> int:
        """The syncs only a CPU makes: value reads inside a call that PyTorch runs without them
        on every other device (`F.one_hot` with `num_classes`, whose range check reads the
        smallest and largest id on a CPU and leaves it to the device's scatter elsewhere)."""
        return sum(sync.cpu_only for sync in self.syncs)

    @property
    def accelerator_count(self) -> int:
        """The syncs the same code makes on an accelerator: `count` less `cpu_only_count`."""
        return self.count - self.cpu_only_count

    def by_call(self) -> dict[str, int]:
        """Host syncs per call name, most frequent first (ties by name, so the order is stable)."""
        counts = Counter(sync.call for sync in self.syncs)
        return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))

    def by_kind(self) -> dict[str, int]:
        """Host syncs per kind: value read, copy to host, data-dependent shape."""
        counts = Counter(sync.kind for sync in self.syncs)
        return {kind: counts[kind] for kind in (VALUE_READ, COPY_TO_HOST, DATA_DEPENDENT_SHAPE)}

    def __enter__(self) -> HostSyncCounter:
        if self._modes:
            raise RuntimeError("this HostSyncCounter is already active; create a new one")
        self._modes = [_PythonLevelReads(self), _AtenLevelReads(self)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc_info: object) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc_info)
        self._modes = []

    def _counts_tensor(self, value: object) -> bool:
        """True for a tensor whose values would have to come back from the device."""
        if not isinstance(value, torch.Tensor):
            return False
        if self.device_type is not None and value.device.type != self.device_type:
            return False
        return not self._is_optimizer_step_counter(value)

    def _is_optimizer_step_counter(self, tensor: torch.Tensor) -> bool:
        return any(
            state.get("step") is tensor
            for optimizer in self.optimizers
            for state in optimizer.state.values()
        )

    def _record(self, call: str, kind: str) -> None:
        cpu_only = self._cpu_only_reads_left > 0 and kind == VALUE_READ
        if cpu_only:
            self._cpu_only_reads_left -= 1
            call = f"{call} in {self._cpu_only_call} (CPU only)"
        self.syncs.append(HostSync(call=call, kind=kind, cpu_only=cpu_only))

    @contextlib.contextmanager
    def _inside_cpu_only_check(self, call: str, reads: int) -> Iterator[None]:
        """While `call` runs on a CPU tensor, its first `reads` value reads are CPU-only."""
        outer = self._cpu_only_call, self._cpu_only_reads_left
        self._cpu_only_call, self._cpu_only_reads_left = call, reads
        try:
            yield
        finally:
            self._cpu_only_call, self._cpu_only_reads_left = outer

    @contextlib.contextmanager
    def _inside_counted_call(self) -> Iterator[None]:
        """While a counted Python call runs, its own aten ops are part of that one sync."""
        self._depth_inside_counted_call += 1
        try:
            yield
        finally:
            self._depth_inside_counted_call -= 1


class _PythonLevelReads(TorchFunctionMode):
    """Sees the calls as the user wrote them (`.item()`, `print(t)`, `.cpu()`)."""

    def __init__(self, counter: HostSyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(
        self, func: Any, types: tuple, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is torch.nn.functional.one_hot and (reads := _one_hot_cpu_only_reads(args, kwargs)):
            with self.counter._inside_cpu_only_check("F.one_hot", reads):
                return func(*args, **kwargs)
        read = _PYTHON_LEVEL_READS.get(func)
        if read is None or not args or not self.counter._counts_tensor(args[0]):
            return func(*args, **kwargs)
        self.counter._record(*read)
        with self.counter._inside_counted_call():
            return func(*args, **kwargs)


def _one_hot_cpu_only_reads(args: tuple, kwargs: Mapping[str, Any]) -> int:
    """How many of an `F.one_hot` call's value reads only a CPU makes. torch 2.13's
    `Onehot.cpp` reads CPU ids' smallest and largest value (two `.item()`s, the smallest first)
    to check their range; on every other device it leaves the check to the scatter's device-side
    asserts, and reads only the largest id, to size the output, when `num_classes` is -1."""
    ids = args[0] if args else kwargs.get("tensor", kwargs.get("input"))
    if not isinstance(ids, torch.Tensor) or ids.device.type != "cpu" or ids.numel() == 0:
        return 0
    num_classes = args[1] if len(args) > 1 else kwargs.get("num_classes", -1)
    return 2 if num_classes != -1 else 1


class _AtenLevelReads(TorchDispatchMode):
    """Sees the aten ops underneath: masks, `nonzero` inside `torch.where`, device copies."""

    def __init__(self, counter: HostSyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(
        self, func: Any, types: tuple, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if self.counter._depth_inside_counted_call == 0:
            read = _classify_aten_op(func, args, kwargs, self.counter)
            if read is not None:
                self.counter._record(*read)
        return func(*args, **kwargs)


def _aten_name(func: Any) -> str:
    """`aten.nonzero` for the overload `aten.nonzero.default`."""
    return f"aten.{func.overloadpacket.__name__}"


def _classify_aten_op(
    func: Any, args: tuple, kwargs: Mapping[str, Any], counter: HostSyncCounter
) -> tuple[str, str] | None:
    """The (call, kind) of an aten op that makes the host wait, or None."""
    source = args[0] if args else None
    if func in _ATEN_VALUE_READS:
        return (_aten_name(func), VALUE_READ) if counter._counts_tensor(source) else None
    if func in _ATEN_DATA_DEPENDENT:
        return (_aten_name(func), DATA_DEPENDENT_SHAPE) if counter._counts_tensor(source) else None
    if func is torch.ops.aten.repeat_interleave.Tensor:
        if kwargs.get("output_size") is None and counter._counts_tensor(source):
            return "aten.repeat_interleave (no output_size)", DATA_DEPENDENT_SHAPE
        return None
    if func in _ATEN_MASK_INDEXING:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        has_mask = any(
            isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)
            for index in indices
        )
        if has_mask and counter._counts_tensor(source):
            return f"{_aten_name(func)} (boolean mask)", DATA_DEPENDENT_SHAPE
        return None
    if func in _ATEN_COPIES:
        return _classify_copy(func, args, kwargs, counter)
    return None


def _classify_copy(
    func: Any, args: tuple, kwargs: Mapping[str, Any], counter: HostSyncCounter
) -> tuple[str, str] | None:
    """A copy from a non-CPU device to the CPU (only an accelerator ever makes one)."""
    if func is torch.ops.aten._to_copy.default:
        source, target_device = args[0], kwargs.get("device")
    else:
        destination, source = args[0], args[1]
        target_device = destination.device
    if target_device is None or torch.device(target_device).type != "cpu":
        return None
    if not isinstance(source, torch.Tensor) or source.device.type == "cpu":
        return None
    return (_aten_name(func), COPY_TO_HOST) if counter._counts_tensor(source) else None


def adam_step_counter_reads(device: torch.device | str) -> int:
    """How many times one default Adam or AdamW step (no `foreach`, `fused`, `capturable`)
    reads each parameter's step counter with `.item()`, its parameters being on `device`."""
    # torch 2.13 defaults to `foreach` on the devices of its foreach list (CUDA, XPU, MTIA and
    # the PrivateUse1 backend, which TorchTPU is); `_multi_tensor_adam` reads each step counter
    # twice, once per bias correction. The per-tensor loop run elsewhere (the CPU) reads it once.
    if not isinstance(device, torch.device | str):
        raise TypeError(
            f"device must be a torch.device or a device string, got {device!r} "
            f"({type(device).__name__}): pass e.g. choose_device() or 'cpu'"
        )
    try:
        device_type = torch.device(device).type
    except RuntimeError:
        raise ValueError(
            f"device must name a device type PyTorch knows, got {device!r}: "
            "pass e.g. choose_device() or 'cpu'"
        ) from None
    foreach_devices = foreach_utils._get_foreach_kernels_supported_devices()
    return 2 if device_type in foreach_devices else 1


@dataclass(frozen=True)
class GraphBreak:
    """One graph break: Dynamo's reason (first line), the function and the source line."""

    reason: str
    function: str
    code: str


@dataclass(frozen=True)
class GraphReport:
    """What Dynamo captured from one call: graphs, breaks and why each break happened.

    Read `breaks`, not only `graph_break_count`: Dynamo reports `graph_count - 1` breaks, so
    a break followed by no tensor operation (a `.item()` at the end, say) makes no new graph
    and is not counted, while `breaks` still holds its reason.
    """

    graph_count: int
    graph_break_count: int
    op_count: int
    breaks: tuple[GraphBreak, ...]

    @property
    def is_single_graph(self) -> bool:
        """True when the whole call became one graph with no break of any kind."""
        return self.graph_count == 1 and not self.breaks

    def __str__(self) -> str:
        """Counts, then per break its function, source line and reason, each line <= 79."""
        lines = [
            f"graphs: {self.graph_count}, graph breaks: {self.graph_break_count}, "
            f"break reasons: {len(self.breaks)}"
        ]
        for number, graph_break in enumerate(self.breaks, start=1):
            lines.append(_fit(f"  {number}. in {graph_break.function}():"))
            lines.append(_fit(f"     {graph_break.code}"))
            lines.append(_fit(f"     {graph_break.reason}"))
        return "\n".join(lines)


REPORT_WIDTH = 79


def _fit(line: str, width: int = REPORT_WIDTH) -> str:
    """The line, cut to `width` characters with a trailing "..." if longer (a page column)."""
    return line if len(line) <= width else line[: width - 3] + "..."


def _is_console_handler(handler: logging.Handler) -> bool:
    """A handler that prints (stderr or stdout), as opposed to one that writes a file."""
    return isinstance(handler, logging.StreamHandler) and not isinstance(
        handler, logging.FileHandler
    )


@contextlib.contextmanager
def quiet_compiler_logs() -> Iterator[list[logging.LogRecord]]:
    """Collect what PyTorch's loggers would print to the console into a list, for one block.

    Dynamo logs each graph break as a warning (`W1202 ... torch/_dynamo/...`) on stderr;
    a notebook that reports breaks as data does not need the same facts again there. Only
    console handlers of the `torch` loggers are swapped (file and trace handlers stay), and
    they are put back when the block ends.
    """
    records: list[logging.LogRecord] = []

    class _Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    collector = _Collect()
    names = [name for name in logging.root.manager.loggerDict if name.split(".")[0] == "torch"]
    saved: dict[str, list[logging.Handler]] = {}
    for name in names:
        logger = logging.getLogger(name)
        if any(_is_console_handler(handler) for handler in logger.handlers):
            saved[name] = logger.handlers[:]
            kept = [handler for handler in logger.handlers if not _is_console_handler(handler)]
            logger.handlers = [*kept, collector]
    try:
        yield records
    finally:
        for name, handlers in saved.items():
            logging.getLogger(name).handlers = handlers


# After a break Dynamo resumes in a generated function named after the original one.
_RESUME_FUNCTION = re.compile(r"^torch_dynamo_resume_in_(?P<name>.+)_at_\d+$")


def _graph_break(reason: Any) -> GraphBreak:
    """Dynamo's `GraphCompileReason` as plain strings, naming the user's function."""
    frame = reason.user_stack[-1] if reason.user_stack else None
    function = frame.name if frame is not None else ""
    resumed = _RESUME_FUNCTION.match(function)
    return GraphBreak(
        reason=reason.reason.strip().splitlines()[0],
        function=resumed["name"] if resumed else function,
        code=(frame.line or "").strip() if frame is not None else "",
    )


def explain_graphs(function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> GraphReport:
    """Run `function(*args, **kwargs)` once under `torch._dynamo.explain`; report its graphs.

    What it adds to `explain`'s own result: each break's reason cut to its first line (Dynamo's
    run on with hints and a link), the user's function rather than Dynamo's generated
    `torch_dynamo_resume_in_...` and the source line, `is_single_graph`, a printout that fits
    a page column, and Dynamo's warnings kept off stderr. The function really runs (its side
    effects happen); Dynamo's caches are reset before and after, so reports do not depend on
    earlier calls.
    """
    if not callable(function):
        raise TypeError(f"explain_graphs needs a callable, got {type(function).__name__}")
    with quiet_compiler_logs():
        explanation = torch._dynamo.explain(function)(*args, **kwargs)
    breaks = tuple(_graph_break(reason) for reason in explanation.break_reasons)
    return GraphReport(
        graph_count=explanation.graph_count,
        graph_break_count=explanation.graph_break_count,
        op_count=explanation.op_count,
        breaks=breaks,
    )
