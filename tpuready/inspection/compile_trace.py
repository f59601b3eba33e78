"""Read the compilations a run recorded under `TORCH_TRACE`: one record per graph, with why.

Taught in `notebooks/17_padding_and_bucketing.ipynb`. Run any script with
`TORCH_TRACE=/some/dir python train.py` and PyTorch writes a structured log of every
`torch.compile` event into that directory; `tlparse` (a separate tool, `pip install tlparse`)
turns it into HTML pages. What PyTorch lacks is a way to read the log from Python, in a test
or a notebook: `read_compilations` reads each compilation's `compilation_metrics` entry, whose
`compile_id` is "frame/attempt" (attempt 1 and up are recompiles of the same code) and whose
`recompile_reason` names the guard that failed ("tensor 'x' size mismatch at index 0.
expected 3, actual 4"). A failed attempt keeps PyTorch's `fail_type` and `fail_reason`: past
`torch._dynamo.config.recompile_limit` that is "Dynamo recompile limit exceeded", after which
new shapes run eagerly (shapes already compiled keep their graphs) and the trace records
nothing more for that code. A process that has joined `torch.distributed` before its first
compile names its log after its rank (`dedicated_log_torch_trace_rank_N_*.log`), and each
record here says which rank made it.

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
# "dedicated_log_torch_trace_rank_3_k2j4x9.log": a process that had joined torch.distributed
# when it wrote its first trace record (a torchrun rank, usually)
_RANK_LOG = re.compile(r"_rank_(\d+)_")


class CompileTraceError(InputError):
    """Raised for a trace directory that does not exist or holds no trace log."""


@dataclass(frozen=True)
class Compilation:
    """One compilation attempt of Dynamo's: its id, the function, why it recompiled, how long it
    took, how many ops its graph holds, why it failed if it did, and the rank whose log holds it
    (None for a process outside torch.distributed)."""

    compile_id: str
    function: str | None
    recompile_reason: str | None
    seconds: float | None
    graph_op_count: int | None = None
    fail_type: str | None = None
    fail_reason: str | None = None
    rank: int | None = None

    @property
    def is_recompile(self) -> bool:
        """True from the second attempt at the same code on ("0/1", "0/2", ...), compiled or
        not."""
        return not self.compile_id.endswith("/0")

    @property
    def compiled(self) -> bool:
        """True when the attempt produced a graph. False for a failure such as the recompile
        limit, after which new shapes run eagerly, and for a frame Dynamo skipped (no graph)."""
        return self.fail_type is None and self.graph_op_count is not None


def _compilation(metrics: dict, rank: int | None) -> Compilation:
    function = metrics.get("co_name")
    return Compilation(
        compile_id=str(metrics.get("compile_id")),
        function=None if function is None else str(function),
        recompile_reason=metrics.get("recompile_reason"),
        seconds=metrics.get("entire_frame_compile_time_s"),
        graph_op_count=metrics.get("graph_op_count"),
        fail_type=metrics.get("fail_type"),
        fail_reason=metrics.get("fail_reason"),
        rank=rank,
    )


def _rank_of(log: Path) -> int | None:
    """The rank in a log's name; None for a process outside torch.distributed."""
    rank_in_name = _RANK_LOG.search(log.name)
    return None if rank_in_name is None else int(rank_in_name.group(1))


def read_compilations(trace_dir: str | Path) -> list[Compilation]:
    """Every compilation attempt recorded under `trace_dir` (the `TORCH_TRACE` directory), rank
    by rank in the order each made them; failed attempts are included with PyTorch's reason."""
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
    for log in sorted(logs, key=lambda log: (_rank_of(log) or 0, log.name)):
        rank = _rank_of(log)
        for line in log.read_text().splitlines():
            match = _RECORD.match(line)
            if match is None:
                continue  # an indented payload line
            record = json.loads(match.group(1))
            if "compilation_metrics" in record:
                compilations.append(_compilation(record["compilation_metrics"], rank))
    return compilations
