"""Execute the book's notebooks: the only way their stored outputs are made.

    python scripts/notebooks.py execute [NOTEBOOK ...]   # re-run in place, store outputs
    python scripts/notebooks.py bench [--runs 3]         # time every notebook, write the page
    python scripts/notebooks.py bench --only serving     # re-time one section of the page

The Makefile runs this with the environment the tests use (offline guard, one thread,
fixed hash seed), so stored outputs and nbval's re-runs see the same conditions.

Re-executing an unchanged notebook leaves it byte for byte as it was: the executor writes no
timestamps or timings into it, and a cell whose output nbval ignores (`# NBVAL_IGNORE_OUTPUT`,
a wall-clock measurement) keeps its committed output when its source is unchanged since the
last commit and the new run gave outputs of the same kinds. `--fresh` stores every new output
regardless.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from serving_bench import serving_section
from verify import RAISES_TAG, let_expected_cells_raise

REPOSITORY = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPOSITORY / "notebooks"
STATISTICS_PAGE = REPOSITORY / "book" / "execution-statistics.md"
CELL_TIMEOUT_SECONDS = 300
KERNEL_SPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def all_notebooks() -> list[Path]:
    """Every notebook of the book: chapters (numbered, so in book order), then reference pages."""
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def run_notebook(path: Path) -> tuple[nbformat.NotebookNode, float]:
    """Execute one notebook from its own folder; return it and the wall-clock seconds."""
    notebook = nbformat.read(path, as_version=4)
    notebook.metadata["kernelspec"] = KERNEL_SPEC
    client = NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_SECONDS,
        kernel_name="python3",
        record_timing=False,
        coalesce_streams=True,  # one stream output per cell, wherever the flush timer split it
        resources={"metadata": {"path": str(path.parent)}},
    )
    tagged = let_expected_cells_raise(notebook)
    started = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - started
    for cell in tagged:  # back as written: Lab's Run All must stop at these cells
        cell.metadata["tags"].remove(RAISES_TAG)
    clear_your_turn_cells(notebook)
    return notebook, seconds


YOUR_TURN_TAG = "your-turn"


def clear_your_turn_cells(notebook: nbformat.NotebookNode) -> None:
    """Store each exercise's "Your turn" cell as never run: a learner opens it in Lab empty,
    not under a red traceback, and nbval, which compares no output of a cell never run,
    still lets it raise (its `nbval-raises-exception` tag)."""
    for cell in notebook.cells:
        if cell.cell_type == "code" and YOUR_TURN_TAG in cell.metadata.get("tags", []):
            cell.outputs = []
            cell.execution_count = None


IGNORE_OUTPUT_MARKER = "# NBVAL_IGNORE_OUTPUT"
IGNORE_OUTPUT_TAG = "nbval-ignore-output"


def output_is_ignored_by_nbval(cell: nbformat.NotebookNode) -> bool:
    """Whether nbval skips comparing this code cell's outputs (marker line or tag)."""
    lines = [line.strip() for line in cell.get("source", "").splitlines()]
    return IGNORE_OUTPUT_MARKER in lines or IGNORE_OUTPUT_TAG in cell.metadata.get("tags", [])


def _output_kinds(cell: nbformat.NotebookNode) -> list[tuple[str, str, tuple[str, ...]]]:
    """What a cell's outputs are made of (types, stream names, MIME types), not their values."""
    return [
        (output["output_type"], output.get("name", ""), tuple(sorted(output.get("data", {}))))
        for output in cell.get("outputs", [])
    ]


def keep_stored_samples(stored: nbformat.NotebookNode, fresh: nbformat.NotebookNode) -> int:
    """Keep the stored output of unchanged cells whose output is a wall-clock sample.

    Such outputs differ on every run; both runs are honest, so keeping the stored one leaves
    `git diff` clean. Returns how many cells kept their stored output.
    """
    if len(stored.cells) != len(fresh.cells):
        return 0
    kept = 0
    for old, new in zip(stored.cells, fresh.cells, strict=True):
        if (
            new.cell_type == "code"
            and old.cell_type == "code"
            and old.source == new.source
            and output_is_ignored_by_nbval(new)
            and _output_kinds(old) == _output_kinds(new)
            and json.dumps(old.outputs) != json.dumps(new.outputs)
        ):
            new.outputs = old.outputs
            kept += 1
    return kept


def committed_version(path: Path) -> nbformat.NotebookNode | None:
    """The notebook as the last commit holds it, or None when git does not track it.

    Its outputs were made by executing its sources, so a timing cell whose source still equals
    the committed one may keep the committed sample. The working copy cannot vouch for that:
    a source edited since the last execution sits beside an output of the old source.
    """
    relative = path.resolve().relative_to(REPOSITORY).as_posix()
    shown = subprocess.run(
        ["git", "show", f"HEAD:{relative}"],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if shown.returncode != 0:
        return None
    return nbformat.reads(shown.stdout, as_version=4)


def execute(paths: list[Path], *, fresh: bool = False) -> None:
    """Re-execute notebooks in place; wall-clock samples of cells unchanged since the last
    commit stay as committed."""
    for path in paths:
        print(f"executing {path.relative_to(REPOSITORY)} ...", flush=True)
        committed = None if fresh else committed_version(path)
        notebook, seconds = run_notebook(path)
        notebook.metadata.pop("tpuready", None)  # no per-run data in the file
        kept = 0 if committed is None else keep_stored_samples(committed, notebook)
        nbformat.write(notebook, path)
        note = f"; {kept} timing cell(s) kept their stored sample" if kept else ""
        print(f"  {seconds:.1f} s{note}", flush=True)


TOOLKIT_HEADING = "## The toolkit"


def toolkit_section(runs: int = 3) -> str:
    """The toolkit's timings, as the page's bullet list: the audit and the bucket search."""
    import torch

    package = Path(torch.__file__).parent
    audit_lines = audit_speed([package / "distributed", package / "optim"], runs)
    return (
        f"Timed on {datetime.date.today().isoformat()}, on the machine above.\n\n"
        f"- The source audit, on torch {torch.__version__}'s own code. {audit_lines[0]}\n"
        + "".join(f"  - {line}\n" for line in audit_lines[1:])
        + f"- {_buckets_speed(runs)}\n"
    )


# The page's timed sections after the notebooks' table, in order: heading, what writes it.
SECTIONS = {
    "toolkit": (TOOLKIT_HEADING, toolkit_section),
    "serving": ("## Serving: vLLM and transformers", serving_section),
}


def rewrite_section(name: str, runs: int) -> None:
    """Re-time one section of the statistics page and replace it there (or add it last),
    the rest kept. Sections are the page's `## ` headings (the sections hold no code blocks)."""
    heading, write = SECTIONS[name]
    if not STATISTICS_PAGE.is_file():
        raise SystemExit(f"{STATISTICS_PAGE} is missing: run the full `make bench` first")
    page = STATISTICS_PAGE.read_text()
    body = write(runs)  # measured before the page is touched: a failure leaves it as it was
    found = re.search(rf"^{re.escape(heading)}[ \t]*$", page, flags=re.MULTILINE)
    if found is None:  # a new section goes last
        head, rest = f"{page.rstrip()}\n\n", ""
    else:
        head, rest = page[: found.start()], page[found.end() :]
    following = re.search(r"^## ", rest, flags=re.MULTILINE)  # the next section, kept
    tail = "\n" + rest[following.start() :] if following else ""
    STATISTICS_PAGE.write_text(f"{head}{heading}\n\n{body}{tail}")


def bench(paths: list[Path], runs: int) -> None:
    """Execute each notebook `runs` times (outputs discarded) and write the statistics page."""
    import torch

    rows = []
    for path in paths:
        times = [run_notebook(path)[1] for _ in range(runs)]
        rows.append((path.name, statistics.median(times), min(times), max(times)))
        print(f"{path.name}: median {rows[-1][1]:.1f} s over {runs} runs", flush=True)
    total = sum(row[1] for row in rows)
    table = "\n".join(
        f"| `{name}` | {median:.1f} | {low:.1f} | {high:.1f} |" for name, median, low, high in rows
    )
    STATISTICS_PAGE.write_text(
        f"""# Execution statistics

How long each chapter takes to execute on the machine that ran `make bench`, with the
same settings as the tests (one torch thread, offline guard). Each time runs from starting
the kernel to shutting it down, so it includes importing torch. The budget is 60 s per
notebook on a 2-core CPU.

- Date: {datetime.date.today().isoformat()}
- torch: {torch.__version__}
- Runs per notebook: {runs} (the table gives the median, fastest and slowest)
- Machine: {_machine_description()}

| Notebook | Median (s) | Fastest (s) | Slowest (s) |
|---|---|---|---|
{table}
| **Total** | **{total:.1f}** | | |
"""
    )
    # Each section after the table, added one at a time: one that fails keeps the rest.
    for name in SECTIONS:
        rewrite_section(name, runs)
    print(f"wrote {STATISTICS_PAGE.relative_to(REPOSITORY)}; total median {total:.1f} s")


# The speed each tool is held to, as a multiple of `ast.parse` of the same files (GC on).
AUDIT_SPEED_GOALS = {"audit": 1.0, "diff": 3.0}


def audit_speed(tree: list[Path], runs: int = 3) -> list[str]:
    """Time the audit and `--diff` against `ast.parse` of the same files, serial, in
    interleaved rounds (parse, audit, diff; `runs` times), medians; one report line each.

    The bench's tree is the installed torch's `distributed` and `optim` packages (about
    150,000 lines): real code written by others, with many CUDA ties, read from the venv so
    nothing is downloaded or shipped."""
    import ast
    import io
    import warnings

    from tpuready.audit import find_source_files, run_audit
    from tpuready.audit.fix import run_fix
    from tpuready.audit.sources import cycle_collection_paused

    files = find_source_files(tree)
    texts_lines = sum(len(path.read_text(encoding="utf-8").splitlines()) for path in files)

    def parse() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the parser's warnings about others' code
            for path in files:
                ast.parse(path.read_text(encoding="utf-8"))

    def parse_paused() -> None:  # the same, as the audit parses: cyclic GC paused
        with cycle_collection_paused():
            parse()

    def audit() -> None:
        run_audit(tree, use_config=False, jobs=1)

    def diff() -> None:
        output = io.StringIO()
        run_fix(
            [str(path) for path in tree],
            write=False,
            stdout=output,
            stderr=output,
            use_config=False,
        )

    kinds = {"parse": parse, "parse_paused": parse_paused, "audit": audit, "diff": diff}
    seconds: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(runs):
        for kind, work in kinds.items():
            started = time.perf_counter()
            work()
            seconds[kind].append(time.perf_counter() - started)
    median = {kind: statistics.median(times) for kind, times in seconds.items()}
    shown_tree = " and ".join(f"`{path.name}`" for path in tree)
    lines = [
        f"The tree: {shown_tree} ({len(files):,} files, {texts_lines:,} lines); medians of "
        f"{runs} interleaved rounds, one process, serial. `ast.parse` of every file takes "
        f"{median['parse']:.2f} s, or {median['parse_paused']:.2f} s with the cyclic garbage "
        "collector paused, as the audit pauses it (the goals are set against the first)."
    ]
    labels = {
        "audit": "`python -m tpuready audit-source`",
        "diff": "`python -m tpuready audit-source --diff`",
    }
    for kind, label in labels.items():
        ratio = median[kind] / median["parse"]
        paused_ratio = median[kind] / median["parse_paused"]
        goal = AUDIT_SPEED_GOALS[kind]
        verdict = "meets" if ratio <= goal else "misses"
        lines.append(
            f"{label}: {median[kind]:.2f} s, {ratio:.2f}x `ast.parse` ({verdict} the goal of "
            f"{goal:.1f}x), {paused_ratio:.2f}x `ast.parse` with the collector paused."
        )
    return lines


def _buckets_speed(runs: int = 3) -> str:
    """Time `optimal_buckets` on a million lengths, every length from 1 to 4,096 present."""
    import numpy as np

    from tpuready.calc.buckets import optimal_buckets

    lengths = np.random.default_rng(0).integers(1, 4097, size=1_000_000)
    best = float("inf")
    for _ in range(runs):
        started = time.perf_counter()
        optimal_buckets(lengths, 8)
        best = min(best, time.perf_counter() - started)
    return (
        f"`tpuready.calc.buckets.optimal_buckets` on 1,000,000 lengths drawn uniformly from 1 to "
        f"4,096 ({len(np.unique(lengths)):,} distinct), k = 8: {best:.2f} s, best of {runs}."
    )


def _machine_description() -> str:
    import os
    import platform

    cpuinfo = Path("/proc/cpuinfo")
    names = (
        re.findall(r"^model name\s*:\s*(.+)$", cpuinfo.read_text(), flags=re.MULTILINE)
        if cpuinfo.exists()
        else []
    )
    model = f" ({names[0].strip()})" if names else ""
    return (
        f"{os.cpu_count()} CPU cores{model}, {platform.machine()}, "
        f"Python {platform.python_version()}"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    execute_parser = commands.add_parser("execute", help="re-execute notebooks in place")
    execute_parser.add_argument("notebooks", nargs="*", type=Path)
    execute_parser.add_argument(
        "--fresh", action="store_true", help="store new timing samples too (see the docstring)"
    )
    bench_parser = commands.add_parser("bench", help="time every notebook, write the page")
    bench_parser.add_argument("--runs", type=int, default=3)
    bench_parser.add_argument(
        "--only", choices=list(SECTIONS), help="re-time only this section of the page"
    )
    arguments = parser.parse_args(argv)
    if arguments.command == "execute":
        paths = [path.resolve() for path in arguments.notebooks] or all_notebooks()
        missing = [str(path) for path in paths if not path.is_file()]
        if missing:
            parser.error(f"no such notebook: {', '.join(missing)}")
        execute(paths, fresh=arguments.fresh)
    else:
        if arguments.runs < 1:
            parser.error(f"--runs must be at least 1, got {arguments.runs}")
        if arguments.only:
            rewrite_section(arguments.only, arguments.runs)
        else:
            bench(all_notebooks(), arguments.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
