"""What would hurt on a real TPU: the emulated TPU's report of one process.

The emulator records, with the place in your code each came from (the first frame outside
torch and the emulator):

- `refused`: calls TorchTPU 0.2.0 refuses (legacy `torch.tpu.*` device calls, `set_device` of
  another index, `torch.compile` options it rejects), which raised here as they would there;
- `mixed_device`: operations given tensors on two devices, which raised as on CUDA;
- `host_syncs`: where the host waited for the device, by kind (`.item()`, a copy to the host,
  an operator whose output shape depends on the data), each a stall on a TPU;
- `graphs`: graphs the emulated `tpu` compiler built, and `recompiles` among them;
- `float64`: tensors of 64-bit floats made on the device (the report's own heuristic, not
  in the notes: TPUs are built for bfloat16 and float32, so keep float64 on the host unless
  you have checked);
- `known_gaps`: operators on the reference notes' list of gaps in TorchTPU's coverage;
- `ignored_indices`: device indices other than 0 that `.to()` dropped (one device per process).

`report()` returns the record so far; the process prints it to stderr when it exits
(`TPUREADY_EMULATE_TPU_REPORT=off` silences it, a path ending in `.json` also writes it as JSON
there, `report.rank1.json` in rank 1 of a job of several). A place is the innermost line of your
code on the way to the event; an event with none (autograd's backward runs in torch) says so.
One print of a tensor counts as one host sync, however many reads torch makes to format it. No
time, memory or speed figure is recorded, because the emulator knows none of a TPU's.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

__all__ = [
    "REPORT_VARIABLE",
    "SECTIONS",
    "EmulationReport",
    "place_in_user_code",
    "report",
    "report_path",
]

REPORT_VARIABLE = "TPUREADY_EMULATE_TPU_REPORT"
_TORCH_DIR = None  # set lazily: the folder of the torch package
_EMULATOR_DIR = str(Path(__file__).parent)
# Frames from these never count as the user's place: the emulator and torch themselves.
_SKIPPED_PREFIXES: tuple[str, ...] = (_EMULATOR_DIR,)
SECTIONS = (
    "refused",
    "mixed_device",
    "host_syncs",
    "graphs",
    "recompiles",
    "float64",
    "known_gaps",
    "ignored_indices",
)
_TITLES = {
    "refused": "calls TorchTPU refuses",
    "mixed_device": "operations on two devices",
    "host_syncs": "host syncs",
    "graphs": "graphs compiled",
    "recompiles": "recompiles",
    "float64": "float64 tensors on the device",
    "known_gaps": "operators on TorchTPU's known-gap list",
    "ignored_indices": "device indices ignored (one device per process)",
}


def _skipped_prefixes() -> tuple[str, ...]:
    global _TORCH_DIR, _SKIPPED_PREFIXES
    if _TORCH_DIR is None:
        import torch

        _TORCH_DIR = str(Path(torch.__file__).parent)
        _SKIPPED_PREFIXES = (_EMULATOR_DIR, _TORCH_DIR, "<frozen")
    return _SKIPPED_PREFIXES


OUTSIDE_USER_CODE = "(inside torch: no frame of your code, e.g. autograd's backward)"


def _user_frame(frame: FrameType | None) -> tuple[str, bool]:
    """(`file:line` of the innermost frame outside torch and the emulator, whether torch was
    formatting a tensor for printing on the way there)."""
    prefixes = _skipped_prefixes()
    printing = False
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename.endswith("_tensor_str.py"):
            printing = True
        elif not filename.startswith(prefixes) and "/contextlib.py" not in filename:
            return f"{Path(filename).name}:{frame.f_lineno}", printing
        frame = frame.f_back
    return OUTSIDE_USER_CODE, printing


# Per thread: how deep torch's tensor formatting is, and whether the print under way has had
# its host sync counted. Flags, not frames: a kept frame would keep the printed tensor alive.
_PRINTS = threading.local()


def _formatting_a_tensor(original: Callable[..., str]) -> Callable[..., str]:
    """`torch._tensor_str._str` marked: its outermost call is one print of one tensor."""

    @functools.wraps(original)
    def formatted(*args: Any, **kwargs: Any) -> str:
        depth = getattr(_PRINTS, "depth", 0)
        if depth == 0:
            _PRINTS.counted = False
        _PRINTS.depth = depth + 1
        try:
            return original(*args, **kwargs)
        finally:
            _PRINTS.depth = depth

    formatted._tpuready_counts_prints = True  # type: ignore[attr-defined]  # marks it as wrapped
    return formatted


def count_each_print_once() -> None:
    """Wrap torch's tensor formatting so that one print of a tensor counts as one host sync,
    however many reads torch makes to format it."""
    import torch._tensor_str as tensor_str

    if not getattr(tensor_str._str, "_tpuready_counts_prints", False):
        tensor_str._str = _formatting_a_tensor(tensor_str._str)


def place_in_user_code(frame: FrameType | None = None) -> str:
    """`file:line` of the innermost frame outside torch and the emulator (the caller's code)."""
    return _user_frame(frame or sys._getframe(1))[0]


@dataclass
class EmulationReport:
    """Counts per (what, where) for each section; see the module's docstring."""

    host: str = ""
    counts: dict[str, Counter] = field(default_factory=lambda: {s: Counter() for s in SECTIONS})
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, section: str, what: str, where: str | None = None) -> None:
        """Count one event of `section` (one of SECTIONS) at `where` (default: the user's code)."""
        if section not in self.counts:
            raise ValueError(f"section must be one of {SECTIONS}, got {section!r}")
        if where is None:
            where, printing = _user_frame(sys._getframe(1))
            if printing:  # torch formats a tensor with many reads and float64 ops
                if section != "host_syncs":
                    return
                if getattr(_PRINTS, "depth", 0) and _PRINTS.counted:
                    return  # one print, one sync
                _PRINTS.counted = True
                what = "print(tensor) or repr (reads values on the host)"
        with self._lock:
            self.counts[section][(what, where)] += 1

    def total(self, section: str, what: str | None = None) -> int:
        """How many events `section` holds (of kind `what` only, when given)."""
        return sum(n for (kind, _), n in self.counts[section].items() if what in (None, kind))

    def clear(self) -> None:
        """Forget everything recorded so far (a notebook's exercise starts from zero)."""
        with self._lock:
            for counter in self.counts.values():
                counter.clear()

    def as_dict(self) -> dict[str, object]:
        """The report as plain data: each section a list of {what, where, count}, largest first."""
        return {
            "host": self.host,
            **{
                section: [
                    {"what": what, "where": where, "count": count}
                    for (what, where), count in counter.most_common()
                ]
                for section, counter in self.counts.items()
            },
        }

    def text(self, limit: int = 5) -> str:
        """A few lines per non-empty section, the most frequent places first."""
        lines = [f"Emulated TPU report ({self.host}): what would need attention on a real TPU"]
        empty = []
        for section in SECTIONS:
            counter = self.counts[section]
            if not counter:
                empty.append(_TITLES[section])
                continue
            lines.append(f"- {_TITLES[section]}: {sum(counter.values())}")
            for (what, where), count in counter.most_common(limit):
                lines.append(f"    {count:>5} x {what} at {where}")
            if len(counter) > limit:
                lines.append(f"    ... and {len(counter) - limit} more places")
        if empty:
            lines.append(f"- none: {', '.join(empty)}")
        lines.append("(No speed, memory or compile time is measured: the emulator knows none.)")
        return "\n".join(lines)


_REPORT = EmulationReport()


def report() -> EmulationReport:
    """This process's record so far (empty when the emulated TPU is not loaded)."""
    return _REPORT


def report_path(setting: str, environment: dict[str, str]) -> Path | None:
    """Where the JSON report goes for a `TPUREADY_EMULATE_TPU_REPORT` value: a path ending in
    `.json`, with `.rank<R>` before the suffix in a rank of a job of several (ranks would
    otherwise write over each other); None for any other value (`off` also silences the
    printed report)."""
    if not setting.strip().lower().endswith(".json"):
        return None
    path = Path(setting.strip())
    world_size = environment.get("WORLD_SIZE", "1").strip()
    if world_size.isdigit() and int(world_size) > 1 and "RANK" in environment:
        path = path.with_name(f"{path.stem}.rank{environment['RANK']}{path.suffix}")
    return path


def _at_exit() -> None:
    setting = os.environ.get(REPORT_VARIABLE, "")
    path = report_path(setting, dict(os.environ))
    if path is not None:
        path.write_text(json.dumps(_REPORT.as_dict(), indent=2) + "\n")
    if setting.strip().lower() != "off":
        print(_REPORT.text(), file=sys.stderr)


def print_at_exit(host: str) -> None:
    """Arrange for the report to be printed (and written, when asked) when the process exits."""
    _REPORT.host = host
    atexit.register(_at_exit)
