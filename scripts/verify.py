"""Execute the book's notebooks on this machine and record where they ran: `make verify`.

    python scripts/verify.py run [NOTEBOOK ...]   # execute (all by default), write a record
    python scripts/verify.py page                 # write book/verification.md from the records

`run` executes each notebook of `notebooks/` (or the ones named) with nbclient in a temporary
copy of the folder, so nothing is written into `notebooks/`, on whatever accelerator this
machine has (the notebooks choose it through `torch.accelerator`) with the packages installed
here. It prints one line per notebook, writes one JSON record into `verification/` (the
machine's kind, device, driver, package versions and each notebook's result: no hostname, no
path) and exits 1 when a notebook failed. A failure does not stop the run: the next notebook
still runs. A notebook is ok when every cell ran, so every `assert` in it held; cells expected
to raise (tagged `raises-exception`, as every exercise's "Your turn" cell is, or holding the
line `# NBVAL_RAISES_EXCEPTION`) may raise, as under nbval.

`make verify` runs it under the conditions of `make notebooks` (the Makefile's NOTEBOOK_ENV and
scripts/no_network: offline guard, one torch thread, no network), then runs `page`. `page`
rebuilds "Where this book was verified" from every record in `verification/`; a cell of that
page is only ever filled from a record. What a record is, how its file is read and checked, and
the page itself live in `tpuready.pages.verification`, which the site build imports too.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tpuready.pages.verification import (
    DATE_FORMAT,
    KINDS,
    Failure,
    NotebookResult,
    Record,
    failure_text,
    load_records,
    record_file_name,
    record_to_json,
    verification_page,
)

REPOSITORY = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPOSITORY / "notebooks"
RECORDS = REPOSITORY / "verification"
PAGE = REPOSITORY / "book" / "verification.md"
CELL_TIMEOUT_SECONDS = 300  # as nbval's --nbval-cell-timeout and scripts/notebooks.py
KERNEL_SPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
# A cell that may fail on the emulated TPU only (a CPU kernel it lacks, an upstream gap) carries
# this metadata key; its value names the upstream cause. Keep the list short.
EMULATED_MAY_FAIL_KEY = "emulated_tpu_may_fail"
EMULATE_VARIABLE = "TPUREADY_EMULATE_TPU"
RAISES_TAG = "raises-exception"  # nbclient, nbval and JupyterLab: carry on past its error
# nbval alone lets a cell with this tag raise; JupyterLab's Run All still stops there, as it
# must at an exercise's "Your turn" cell.
NBVAL_RAISES_TAG = "nbval-raises-exception"
RAISES_MARKER = "# NBVAL_RAISES_EXCEPTION"
MESSAGE_LENGTH = 100  # characters of an error message kept in a record
# Copied with the notebooks: everything they read (data/, examples/, workers/), not what a
# previous run left behind.
COPY_IGNORES = shutil.ignore_patterns("traces", ".ipynb_checkpoints", "__pycache__")


# ---------------------------------------------------------------------------------------------
# Running notebooks


def expected_to_raise(cell: nbformat.NotebookNode) -> bool:
    """Whether nbval lets this code cell raise: the `raises-exception` or
    `nbval-raises-exception` tag, or the marker line."""
    lines = [line.strip() for line in cell.get("source", "").splitlines()]
    tags = cell.metadata.get("tags", [])
    return RAISES_TAG in tags or NBVAL_RAISES_TAG in tags or RAISES_MARKER in lines


def let_expected_cells_raise(
    notebook: nbformat.NotebookNode, emulated: bool = False
) -> list[nbformat.NotebookNode]:
    """Give nbclient's `raises-exception` tag, in memory, to every cell nbval lets raise, so
    that executing the notebook carries on past it as nbval does; returns the cells that got
    it, to take it off again before the notebook is saved. `emulated`: also the cells that may
    fail on the emulated TPU (EMULATED_MAY_FAIL_KEY)."""
    tagged = []
    for cell in notebook.cells:
        may_fail = emulated and EMULATED_MAY_FAIL_KEY in cell.metadata
        if cell.cell_type == "code" and (expected_to_raise(cell) or may_fail):
            tags = cell.metadata.setdefault("tags", [])
            if RAISES_TAG not in tags:
                tags.append(RAISES_TAG)
                tagged.append(cell)
    return tagged


def _first_line(text: str, scrub: Mapping[str, str] | None = None) -> str:
    """The first non-empty line of `text`, paths replaced (no machine's paths in a record), at
    most MESSAGE_LENGTH long."""
    for path, replacement in (scrub or {}).items():
        if len(path) > 1:  # never "/" (a home folder can be the root)
            text = text.replace(path, replacement)
    line = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return line if len(line) <= MESSAGE_LENGTH else line[: MESSAGE_LENGTH - 1] + "…"


def _plain(text: str) -> str:
    """Text without the terminal colour codes IPython puts in tracebacks."""
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def execute_notebook(path: Path, emulated: bool = False) -> NotebookResult:
    """Execute one notebook from its own folder, in memory (the file is not written), until
    its first unexpected error. `emulated`: it runs on the emulated TPU (TPUREADY_EMULATE_TPU
    is set in this environment), where the cells marked as allowed to fail there may."""
    notebook = nbformat.read(path, as_version=4)
    notebook.metadata["kernelspec"] = KERNEL_SPEC
    let_expected_cells_raise(notebook, emulated)
    client = NotebookClient(
        notebook,
        timeout=CELL_TIMEOUT_SECONDS,
        kernel_name="python3",
        record_timing=False,
        resources={"metadata": {"path": str(path.parent)}},
    )
    scrub = {  # most specific first: the copy lives in a temporary folder, maybe under home
        str(path.parent.resolve()): "notebooks",
        str(path.parent): "notebooks",
        str(REPOSITORY): ".",
        str(Path.home()): "~",
    }
    failure = None
    code_index: int | None = None  # nbval's number of the code cell running now
    started = time.perf_counter()
    # The kernel's own log (a notice that it talks over the loopback without encryption, and
    # what a dying kernel says) is kept, and shown only with the error of a dead kernel.
    with tempfile.TemporaryFile("w+") as kernel_log:
        try:
            with client.setup_kernel(stderr=kernel_log):
                for index, cell in enumerate(notebook.cells):
                    if cell.cell_type == "code":
                        code_index = 0 if code_index is None else code_index + 1
                    client.execute_cell(cell, index)
        except CellExecutionError as error:
            failure = Failure(
                code_index, error.ename, _first_line(error.evalue, scrub), _plain(str(error))
            )
        except Exception as error:  # a cell timeout, a dead kernel, a kernel that never started
            kernel_log.seek(0)
            failure = Failure(
                code_index,
                type(error).__name__,
                _first_line(str(error), scrub),
                f"{_plain(str(error))}\nThe kernel's log:\n{kernel_log.read()}",
            )
    seconds = time.perf_counter() - started
    code_cells = sum(cell.cell_type == "code" for cell in notebook.cells)
    return NotebookResult(failure is None, round(seconds, 1), code_cells, failure)


# The facts only a process that imports torch can give. It runs as a child that exits before
# the first notebook starts: on a TPU VM the process that initialises the device holds it, so
# this script never imports torch itself.
PROBE = """
import importlib.metadata, json, platform
import torch

def version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None

from tpuready.emulator import is_emulated

accelerator = torch.accelerator.current_accelerator(check_available=True)
kind = "cpu" if accelerator is None else accelerator.type
name = None
if kind == "cuda":
    name = torch.cuda.get_device_name(0)
elif kind == "tpu" and is_emulated():
    kind = "emulated-tpu"
elif kind == "tpu":
    name = torch.tpu.get_device_name()
print(json.dumps({
    "kind": kind, "device_name": name, "torch": torch.__version__,
    "transformers": version("transformers"), "torch_tpu": version("torch-tpu"),
    "python": platform.python_version(),
}))
"""


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and ":" in line:
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def nvidia_driver_version() -> str | None:
    """nvidia-smi's driver version, or None where there is no NVIDIA driver."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        shown = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = shown.stdout.strip().splitlines()
    return lines[0].strip() if shown.returncode == 0 and lines else None


def probe_machine() -> dict[str, str | None]:
    """Kind, device name, driver and versions of this machine, from a child Python."""
    probed = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600
    )
    if probed.returncode != 0:
        raise RuntimeError(f"could not import torch to probe the machine:\n{probed.stderr}")
    facts = json.loads(probed.stdout.strip().splitlines()[-1])
    if facts["kind"] not in KINDS:
        raise RuntimeError(
            f"this machine's accelerator is {facts['kind']!r}; the page has columns for "
            f"{', '.join(KINDS)} only"
        )
    if facts["kind"] == "cpu":
        facts["device_name"] = cpu_model()
    elif facts["kind"] == "emulated-tpu":  # the CPU that ran it, not a TPU
        facts["device_name"] = f"Emulated TPU on {cpu_model()}"
    facts["driver_version"] = nvidia_driver_version()
    return facts


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime(DATE_FORMAT)


def summary_line(name: str, result: NotebookResult, width: int = 0) -> str:
    """'ok   01_device_agnostic_basics  23.4 s' or 'FAIL 05_...  cell 38: RuntimeError: ...'."""
    if result.ok:
        return f"ok   {name:<{width}}  {result.seconds:.1f} s"
    assert result.failure is not None
    return f"FAIL {name:<{width}}  {failure_text(result.failure)}"


def run(paths: list[Path], records: Path = RECORDS) -> tuple[Record, Path]:
    """Execute the notebooks (each from a temporary copy of notebooks/) and write the record."""
    facts = probe_machine()
    date = _utc_now()
    print(f"{facts['kind']}: {facts['device_name']}, torch {facts['torch']}", flush=True)
    width = max(len(path.stem) for path in paths)
    results: dict[str, NotebookResult] = {}
    with tempfile.TemporaryDirectory(prefix="tpuready-verify-") as folder:
        copy = Path(folder) / "notebooks"
        shutil.copytree(NOTEBOOKS, copy, ignore=COPY_IGNORES)
        # The set-up check reads the pins beside the notebooks' folder, as in a clone.
        shutil.copy2(NOTEBOOKS.parent / "requirements.txt", Path(folder) / "requirements.txt")
        for path in paths:
            results[path.stem] = result = execute_notebook(
                copy / path.name, emulated=facts["kind"] == "emulated-tpu"
            )
            print(summary_line(path.stem, result, width), flush=True)
    record = Record(date=date, notebooks=results, **facts)
    records.mkdir(exist_ok=True)
    target = records / record_file_name(record)
    target.write_text(json.dumps(record_to_json(record), indent=2) + "\n", encoding="utf-8")
    return record, target


def starts_ranks(path: Path) -> bool:
    """Whether a notebook starts ranks (`run_workers`): such notebooks run alone, with both
    cores, as `make nbval` runs them."""
    return "run_workers" in path.read_text(encoding="utf-8")


def check(paths: list[Path], jobs: int = 2) -> int:
    """Execute notebooks on the emulated TPU (the caller sets TPUREADY_EMULATE_TPU) from a
    temporary copy, `jobs` at a time and those that start ranks alone, afterwards; print one
    line each, and the end of the error of each that failed. 0 when all ran, else 1."""
    from concurrent.futures import ProcessPoolExecutor

    width = max(len(path.stem) for path in paths)
    failed = 0
    with tempfile.TemporaryDirectory(prefix="tpuready-emulated-") as folder:
        copy = Path(folder) / "notebooks"
        shutil.copytree(NOTEBOOKS, copy, ignore=COPY_IGNORES)
        shutil.copy2(NOTEBOOKS.parent / "requirements.txt", Path(folder) / "requirements.txt")
        alone = [copy / p.name for p in paths if starts_ranks(p)]
        shared = [copy / p.name for p in paths if not starts_ranks(p)]
        context = multiprocessing.get_context("spawn")
        for group, workers in ((shared, jobs), (alone, 1)):
            if not group:
                continue
            with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
                futures = [pool.submit(execute_notebook, path, True) for path in group]
                for path, future in zip(group, futures, strict=True):
                    result = future.result()
                    print(summary_line(path.stem, result, width), flush=True)
                    if not result.ok:
                        failed += 1
                        assert result.failure is not None
                        tail = result.failure.detail.strip().splitlines()[-40:]
                        print("\n".join(f"    {line}" for line in tail), flush=True)
    print(f"{len(paths) - failed} of {len(paths)} notebooks ran in full on the emulated TPU")
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------------
# The page


def book_notebooks() -> list[tuple[str, str]]:
    """(file stem, title) of every notebook of the book, chapters in order, then references."""
    rows = []
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        notebook = nbformat.read(path, as_version=4)
        heading = next(
            (
                line[2:].strip()
                for cell in notebook.cells
                if cell.cell_type == "markdown"
                for line in cell.source.splitlines()
                if line.startswith("# ")
            ),
            path.stem,
        )
        rows.append((path.stem, heading))
    return rows


def write_page(page: Path = PAGE, records: Path = RECORDS) -> None:
    """Rewrite the page from every record in `records`."""
    found = load_records(records)
    page.write_text(verification_page(found, book_notebooks()), encoding="utf-8")
    print(f"wrote {page.name} from {len(found)} record(s)")


# ---------------------------------------------------------------------------------------------


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="execute notebooks, write a record")
    run_parser.add_argument("notebooks", nargs="*", type=Path)
    commands.add_parser("page", help="write book/verification.md from the records")
    check_parser = commands.add_parser(
        "check", help="execute notebooks on the emulated TPU, write no record (make emulated)"
    )
    check_parser.add_argument("notebooks", nargs="*", type=Path)
    check_parser.add_argument("--jobs", type=int, default=2)
    check_parser.add_argument(
        "--skip", action="append", type=Path, default=[], help="leave this notebook out"
    )
    arguments = parser.parse_args(argv)
    if arguments.command == "page":
        write_page()
        return 0
    paths = [path.resolve() for path in arguments.notebooks] or sorted(NOTEBOOKS.glob("*.ipynb"))
    skipped = {path.resolve() for path in getattr(arguments, "skip", [])}
    paths = [path for path in paths if path not in skipped]
    wrong = [str(p) for p in paths if p.parent != NOTEBOOKS or p.suffix != ".ipynb"]
    if wrong:
        parser.error(f"not a notebook in notebooks/: {', '.join(wrong)}")
    missing = [str(path) for path in paths if not path.is_file()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    if arguments.command == "check":
        if not os.environ.get(EMULATE_VARIABLE, "").strip() or arguments.jobs < 1:
            parser.error(
                f"check runs on the emulated TPU: set {EMULATE_VARIABLE} (and --jobs >= 1)"
            )
        import torch  # noqa: F401  (its backend autoload installs the emulator, or not)

        from tpuready.emulator import is_emulated

        if not is_emulated():
            parser.error(
                "the emulated TPU stepped aside: another backend owns the tpu device here "
                "(TorchTPU on a TPU VM); check runs notebooks on the emulator only, so run it "
                "on a machine without that backend, or `make verify` to record this one"
            )
        return check(paths, arguments.jobs)
    if os.environ.get("TPUREADY_OFFLINE") != "1":
        print(
            "note: TPUREADY_OFFLINE is not set: `make verify` runs the notebooks under the "
            "tests' conditions (offline guard, one torch thread, no network)",
            file=sys.stderr,
        )
    try:
        record, target = run(paths)
    except RuntimeError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    failed = [name for name, result in record.notebooks.items() if not result.ok]
    print(
        f"wrote {target.relative_to(REPOSITORY)}: {len(record.notebooks) - len(failed)} of "
        f"{len(record.notebooks)} notebooks ok"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
