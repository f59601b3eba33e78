"""Read the compilations a run recorded under `TORCH_TRACE`: one record per graph, with why.

Taught in `notebooks/12_padding_and_bucketing.ipynb`. Run any script with
`TORCH_TRACE=/some/dir python train.py` and PyTorch writes a structured log of every
`torch.compile` event into that directory; `tlparse` (a separate tool, `pip install tlparse`)
turns it into HTML pages. What PyTorch lacks is a way to read the log from Python, in a test
or a notebook: `read_compilations` reads each compilation's `compilation_metrics` entry, whose
`compile_id` is "frame/attempt" (attempt 1 and up are recompiles of the same code) and whose
`recompile_reason` names the guard that failed ("tensor 'x' size mismatch at index 0.
expected 3, actual 4").

The log format is PyTorch's, not a stable API: each line is a glog-style prefix, then one
JSON object (some followed by indented payload lines, which are skipped). Checked with
torch 2.13.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from tpuready.validate import InputError

__all__ = ["Compilation", "CompileTraceError", "read_compilations"]

# "V1203 17:32:16.790000 19690 torch/_dynamo/utils.py:2350] {...}"
_RECORD = re.compile(r"^[A-Z]\d{4} [\d:.]+ \d+ [^\]]+\] (\{.*\})\s*$")


class CompileTraceError(InputError):
    """Raised for a trace directory that does not exist or holds no trace log."""


@dataclass(frozen=True)
class Compilation:
    """One graph Dynamo compiled: its id, the function, why it recompiled, how long it took."""

    compile_id: str
    function: str
    recompile_reason: str | None
    seconds: float | None

    @property
    def is_recompile(self) -> bool:
        """True from the second compilation of the same code on ("0/1", "0/2", ...)."""
        return not self.compile_id.endswith("/0")


def _compilation(metrics: dict) -> Compilation:
    return Compilation(
        compile_id=str(metrics.get("compile_id")),
        function=str(metrics.get("co_name")),
        recompile_reason=metrics.get("recompile_reason"),
        seconds=metrics.get("entire_frame_compile_time_s"),
    )


def read_compilations(trace_dir: str | Path) -> list[Compilation]:
    """Every compilation recorded under `trace_dir` (the `TORCH_TRACE` directory), in the order
    the run made them; failed compilations are included with their reason as PyTorch gave it."""
    directory = Path(trace_dir)
    if not directory.is_dir():
        raise CompileTraceError(
            f"trace_dir {str(directory)!r} is not a directory: run the script with "
            f"TORCH_TRACE={directory} first"
        )
    logs = sorted(directory.glob("*.log"))
    if not logs:
        raise CompileTraceError(
            f"trace_dir {str(directory)!r} holds no .log file: did the run compile anything, "
            "and was TORCH_TRACE set before torch was imported?"
        )
    compilations = []
    for log in logs:
        for line in log.read_text().splitlines():
            match = _RECORD.match(line)
            if match is None:
                continue  # an indented payload line
            record = json.loads(match.group(1))
            if "compilation_metrics" in record:
                compilations.append(_compilation(record["compilation_metrics"]))
    return compilations
