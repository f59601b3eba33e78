"""Record the operators a piece of PyTorch code sends through the dispatcher.

Taught in `notebooks/03_under_the_hood_dispatcher.ipynb`: the operators one forward pass
reaches are the operators a backend (TorchTPU, or the toy device built in that chapter) must
implement. The chapter first writes a `TorchDispatchMode` of a dozen lines that keeps only
operator names; `OpRecorder` sees the same calls and adds what that one lacks: input shapes,
dtypes and output shapes per call, counts per operator in a stable order, a table, `clear()`.
Reuse it to see what any model runs; to count the calls that make the host wait, use
`tpuready.inspection.syncs.HostSyncCounter` (chapter 7).

    with OpRecorder() as recorder:
        model(inputs)
    print(recorder.table())
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["OpRecorder", "RecordedOp", "format_counts"]


@dataclass(frozen=True)
class RecordedOp:
    """One operator call: its overload (`aten.addmm.default`), input shapes, dtypes, outputs."""

    name: str
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]

    @property
    def namespace(self) -> str:
        """The library that defines the operator: `aten` for PyTorch's own operators."""
        return self.name.split(".", 1)[0]

    @property
    def operator(self) -> str:
        """The operator without its overload: `aten.add` for `aten.add.Tensor`."""
        return ".".join(self.name.split(".")[:2])


def _tensors_in(tree: Any) -> list[torch.Tensor]:
    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class OpRecorder(TorchDispatchMode):
    """A `TorchDispatchMode` that writes down every operator call under it, then runs it as is.

    It sees operators after autograd and after composite operators such as `linear` have
    decomposed, i.e. the calls a backend's kernels receive. Calls accumulate across `with`
    blocks until `clear()`.
    """

    def __init__(self) -> None:
        super().__init__()
        self.records: list[RecordedOp] = []

    def __torch_dispatch__(
        self,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        inputs = _tensors_in((args, kwargs))
        result = func(*args, **kwargs)
        self.records.append(
            RecordedOp(
                name=str(func),
                input_shapes=tuple(tuple(tensor.shape) for tensor in inputs),
                input_dtypes=tuple(_dtype_name(tensor.dtype) for tensor in inputs),
                output_shapes=tuple(tuple(tensor.shape) for tensor in _tensors_in(result)),
            )
        )
        return result

    def __len__(self) -> int:
        return len(self.records)

    def clear(self) -> None:
        """Forget the calls recorded so far."""
        self.records.clear()

    def counts(self) -> dict[str, int]:
        """Calls per operator overload, sorted by name (the same order on every run)."""
        return dict(sorted(Counter(record.name for record in self.records).items()))

    def table(self, *, top: int | None = None) -> str:
        """The counts as aligned text, most-called first (ties by name); `top` keeps that many."""
        return format_counts(self.counts(), top=top)


def format_counts(counts: Mapping[str, int], *, top: int | None = None) -> str:
    """Two aligned columns, `operator` and `calls`, most calls first, ties broken by name.

    `top` keeps the first `top` rows and adds a line saying how many were left out.
    """
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or top < 1):
        raise ValueError(f"top must be a positive int or None, got {top!r}")
    bad = {name: calls for name, calls in counts.items() if not isinstance(calls, int) or calls < 0}
    if bad:
        raise ValueError(f"counts must be non-negative ints, got {bad!r}")
    if not counts:
        return "(no operators recorded)"
    rows = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    shown = rows if top is None else rows[:top]
    width = max(len("operator"), *(len(name) for name, _ in shown))
    lines = [f"{'operator':<{width}}  calls", f"{'-' * width}  -----"]
    lines += [f"{name:<{width}}  {calls:>5}" for name, calls in shown]
    if len(shown) < len(rows):
        hidden = rows[len(shown) :]
        lines.append(
            f"... {len(hidden)} more operators ({sum(c for _, c in hidden)} calls) not shown"
        )
    return "\n".join(lines)
