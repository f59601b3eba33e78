"""Execute the book's notebooks: the only way their stored outputs are made.

    python scripts/notebooks.py execute [NOTEBOOK ...]   # re-run in place, store outputs
    python scripts/notebooks.py bench [--runs 3]         # time every notebook, write the page

The Makefile runs this with the environment the tests use (offline guard, one thread,
fixed hash seed), so stored outputs and nbval's re-runs see the same conditions.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

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
        resources={"metadata": {"path": str(path.parent)}},
    )
    started = time.perf_counter()
    client.execute()
    return notebook, time.perf_counter() - started


def execute(paths: list[Path]) -> None:
    """Re-execute notebooks in place and store the execution time in their metadata."""
    for path in paths:
        print(f"executing {path.relative_to(REPOSITORY)} ...", flush=True)
        notebook, seconds = run_notebook(path)
        notebook.metadata["tpuready"] = {"execution_seconds": round(seconds, 1)}
        nbformat.write(notebook, path)
        print(f"  {seconds:.1f} s", flush=True)


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
    print(f"wrote {STATISTICS_PAGE.relative_to(REPOSITORY)}; total median {total:.1f} s")


def _machine_description() -> str:
    import os
    import platform

    return f"{os.cpu_count()} CPU cores, {platform.machine()}, Python {platform.python_version()}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    execute_parser = commands.add_parser("execute", help="re-execute notebooks in place")
    execute_parser.add_argument("notebooks", nargs="*", type=Path)
    bench_parser = commands.add_parser("bench", help="time every notebook, write the page")
    bench_parser.add_argument("--runs", type=int, default=3)
    arguments = parser.parse_args(argv)
    if arguments.command == "execute":
        paths = [path.resolve() for path in arguments.notebooks] or all_notebooks()
        missing = [str(path) for path in paths if not path.is_file()]
        if missing:
            parser.error(f"no such notebook: {', '.join(missing)}")
        execute(paths)
    else:
        if arguments.runs < 1:
            parser.error(f"--runs must be at least 1, got {arguments.runs}")
        bench(all_notebooks(), arguments.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
