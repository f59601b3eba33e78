"""Check a learner's machine before a workshop: Python, the pins, the device, ranks, a model.

Taught by `notebooks/00_setup_check.ipynb`, which runs each check in its own cell; `make check`
(and the workshop bundle's `make check`) executes that notebook in a Jupyter kernel, as Lab
would, and prints one verdict: PASS, or each failed check with what to run to fix it. It needs
no browser and no network.

Each check returns a `CheckResult`; none raises on a broken machine, so one verdict names
every problem at once.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import sys
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import Specifier
from packaging.utils import canonicalize_name

__all__ = [
    "MINIMUM_PYTHON",
    "MYST_LAB_EXTENSION",
    "NOTEBOOK_SECONDS",
    "REINSTALL",
    "SMOKE_TEST_SECONDS",
    "CheckResult",
    "check_device",
    "check_lab_myst",
    "check_pins",
    "check_python",
    "check_ranks",
    "check_transformers",
    "main",
    "rank_count",
    "read_pins",
    "run_all",
    "run_notebook",
    "verdict",
]

MINIMUM_PYTHON = (3, 11, 5)  # the oldest release the pins install on (soupsieve needs it)
REINSTALL = "run `make venv` again (in the workshop bundle: `make venv`), then restart the kernel"
SMOKE_TEST_SECONDS = 60.0  # ranks start in 3-8 s on a 2-core laptop; this bounds a hang
NOTEBOOK_SECONDS = 120  # the whole notebook, kernel start included (under 20 s on a laptop)
# Where jupyterlab-myst puts its Lab extension inside the environment (its wheel's data files).
MYST_LAB_EXTENSION = Path("share/jupyter/labextensions/jupyterlab-myst/package.json")
# Where a requirement line's comment (`#`) or per-line options (`--hash=...`) begin, as pip reads.
_PIP_EXTRAS = re.compile(r"(?:^|\s)(?:#|--)")


@dataclass(frozen=True)
class CheckResult:
    """One check's outcome: what was found when it passed, what to do when it failed."""

    name: str
    passed: bool
    detail: str

    def __str__(self) -> str:
        return f"{'ok ' if self.passed else 'FIX'}  {self.name}: {self.detail}"


def read_pins(requirements: Path) -> dict[str, str]:
    """Every `name==version` pin of a requirements file whose marker holds here, keyed by the
    name as pip compares names (PEP 503: `Jinja2` is `jinja2`); read with `packaging`, as pip
    reads it. Comments, pip options and ranges are not pins."""
    if not requirements.is_file():
        raise FileNotFoundError(
            f"no requirements file at {requirements}: run the check from the repository's "
            "notebooks/ folder (or the bundle's), or pass --requirements PATH"
        )
    pins: dict[str, str] = {}
    for line in requirements.read_text().splitlines():
        # pip's comments start a line or follow a space; its per-line options follow one too.
        text = _PIP_EXTRAS.split(line, maxsplit=1)[0].strip()
        if not text or text.startswith("-"):
            continue  # a blank line, a comment, or an option such as -r or --index-url
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue  # not a requirement pip would install from this line either
        specifiers = list(requirement.specifier)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue  # pinned for another platform or Python
        if len(specifiers) == 1 and specifiers[0].operator == "==":
            pins[canonicalize_name(requirement.name)] = specifiers[0].version
    return pins


def _matches_pin(found: str, pinned: str) -> bool:
    """Whether installed version `found` is `==pinned` as pip reads it: a local label names
    a build of the pinned version (torch 2.13.0+cpu is torch==2.13.0), and 2.13 is 2.13.0."""
    return Specifier(f"=={pinned}").contains(found, prereleases=True)


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_python(version: Sequence[int] = tuple(sys.version_info[:3])) -> CheckResult:
    """Python must be 3.11.5 or newer: the pins install on it and `tpuready` needs it."""
    if tuple(version[:3]) >= MINIMUM_PYTHON:
        # The minor release only: the patch differs between machines, the verdict does not.
        return CheckResult("Python", True, f"Python {version[0]}.{version[1]}")
    shown = ".".join(str(part) for part in version[:3])
    return CheckResult(
        "Python",
        False,
        f"Python {shown} is older than 3.11.5: install a newer Python, delete .venv (it keeps "
        "the Python it was made with) and build it again with the new one "
        "(rm -rf .venv && make venv PYTHON_FOR_VENV=python3.12)",
    )


def check_pins(
    requirements: Path, installed: Callable[[str], str | None] = _installed_version
) -> CheckResult:
    """Every pinned package is installed at its pinned version (the outputs were made with them)."""
    try:
        pins = read_pins(requirements)
    except FileNotFoundError as error:  # a check reports, it does not raise
        return CheckResult("pins", False, str(error))
    wrong = []
    for name, pinned in pins.items():
        found = installed(name)
        if found is None or not _matches_pin(found, pinned):
            wrong.append(f"{name} {found or 'missing'} (pinned {pinned})")
    if not wrong:
        # No count: the output stays the same when a pin is added.
        return CheckResult("pins", True, "every package pinned in requirements.txt matches")
    shown = ", ".join(wrong[:5]) + (f" and {len(wrong) - 5} more" if len(wrong) > 5 else "")
    return CheckResult("pins", False, f"{len(wrong)} of {len(pins)} differ: {shown}; {REINSTALL}")


def check_device() -> CheckResult:
    """Name the device the notebooks will use; a CPU passes (every notebook runs on one)."""
    import torch

    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is None:
        return CheckResult("device", True, "cpu (no accelerator: the book's CPU rehearsal)")
    count = torch.accelerator.device_count()
    return CheckResult(
        "device", True, f"{accelerator.type}, {count} device{'s' if count > 1 else ''}"
    )


def _sum_of_ranks(rank: int, world_size: int) -> tuple[str, str, float]:
    """Worker of the ranks check: all-reduce rank + 1 and report backend, device, sum."""
    import torch
    import torch.distributed as dist

    from tpuready.runtime.launch import rank_device

    device = rank_device()
    total = torch.tensor([rank + 1.0], device=device)
    dist.all_reduce(total)
    return dist.get_backend(), device.type, total.item()


def rank_count() -> int:
    """Two ranks; on a TPU the fewest its generation runs on a host, which even a one-chip VM
    holds (1 on v4, v5e, v5p and v6e; 2 on v7, whose chip is two devices)."""
    from tpuready.runtime.launch import allowed_rank_counts

    allowed = allowed_rank_counts()
    return 2 if allowed is None else min(allowed)


def check_ranks(seconds: float = SMOKE_TEST_SECONDS) -> CheckResult:
    """Start ranks through `tpuready.runtime.launch` and all-reduce one number, as Part II does."""
    from tpuready.runtime.launch import run_workers

    world_size = rank_count()
    try:
        results = run_workers(
            _sum_of_ranks, world_size, timeout_seconds=seconds, startup_timeout_seconds=seconds
        )
    except Exception as error:  # a check reports, it does not raise
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        return CheckResult(
            "ranks",
            False,
            f"{type(error).__name__}: {first_line}; check that nothing blocks connections "
            "to 127.0.0.1 (a firewall or VPN client), then run the check again",
        )
    expected = world_size * (world_size + 1) / 2  # each rank adds its rank + 1
    if any(total != expected for _, _, total in results):
        return CheckResult(
            "ranks", False, f"all_reduce gave {[r[2] for r in results]}, not {expected}"
        )
    backend, device, _ = results[0]
    return CheckResult(
        "ranks",
        True,
        f"{backend} on {device}, all_reduce gave {expected:g}"
        + ("" if world_size == 2 else f" over {world_size} ranks"),
    )


def check_transformers() -> CheckResult:
    """Build a tiny Qwen3 from a config (no download) and run one forward pass, as chapter 4."""
    import torch

    with warnings.catch_warnings():
        # tqdm's note, in a kernel without ipywidgets, that progress bars fall back to text.
        warnings.filterwarnings("ignore", message="IProgress not found")
        from transformers import AutoModelForCausalLM

    from tpuready.runtime.tiny_models import tiny_qwen3_config

    config = tiny_qwen3_config()  # the book's smallest Qwen3 (TINY_QWEN3)
    try:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config).eval()
        with torch.no_grad():
            logits = model(torch.arange(8).unsqueeze(0)).logits
    except Exception as error:
        return CheckResult("transformers", False, f"{type(error).__name__}: {error}; {REINSTALL}")
    return CheckResult(
        "transformers",
        True,
        f"Qwen3 built from a config, logits of shape {tuple(logits.shape)}",
    )


def check_lab_myst(prefix: Path = Path(sys.prefix)) -> CheckResult:
    """jupyterlab-myst's Lab extension is in this environment: Lab renders the book's MyST."""
    version = _installed_version("jupyterlab-myst")
    if version is None or not (prefix / MYST_LAB_EXTENSION).is_file():
        return CheckResult(
            "MyST in Lab",
            False,
            "jupyterlab-myst is not installed in this environment, so Lab shows exercises "
            f"and notes as raw text; {REINSTALL}",
        )
    return CheckResult("MyST in Lab", True, f"jupyterlab-myst {version} installed")


def verdict(results: Sequence[CheckResult]) -> str:
    """One line when every check passed; otherwise one line per check to fix."""
    failed = [result for result in results if not result.passed]
    if not failed:
        return f"PASS: all {len(results)} checks passed. This machine is ready for the workshop."
    lines = [f"NOT READY: {len(failed)} of {len(results)} checks failed. Fix them in this order:"]
    lines += [f"- {result.name}: {result.detail}" for result in failed]
    return "\n".join(lines)


def run_all(requirements: Path) -> list[CheckResult]:
    """Every check, in the notebook's order."""
    return [
        check_python(),
        check_pins(requirements),
        check_device(),
        check_ranks(),
        check_transformers(),
        check_lab_myst(),
    ]


def run_notebook(notebook: Path, seconds: int = NOTEBOOK_SECONDS) -> int:
    """Execute the set-up notebook in a Jupyter kernel and print its verdict; 0 when it passed."""
    import nbclient
    import nbformat

    if not notebook.is_file():
        print(f"NOT READY: no notebook at {notebook}", file=sys.stderr)
        return 1
    cells = nbformat.read(notebook, as_version=4)
    client = nbclient.NotebookClient(
        cells, timeout=seconds, resources={"metadata": {"path": str(notebook.parent)}}
    )
    # The kernel's own log (a notice that it talks over the loopback without encryption)
    # is shown only when the kernel fails.
    with tempfile.TemporaryFile("w+") as kernel_log:
        try:
            client.execute(stderr=kernel_log)
        except Exception as error:  # the kernel did not start, or a cell failed
            kernel_log.seek(0)
            print(kernel_log.read(), file=sys.stderr)
            print(f"NOT READY: {notebook.name} stopped: {error}", file=sys.stderr)
            return 1
    last_output = "".join(
        output.get("text", "") for output in cells.cells[-1].get("outputs", [])
    ).strip()
    print(last_output)
    return 0 if last_output.startswith("PASS") else 1


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tpuready.runtime.setup_check`: run the checks here, or in the notebook with
    --notebook."""
    parser = argparse.ArgumentParser(
        prog="python -m tpuready.runtime.setup_check", description=__doc__
    )
    parser.add_argument("--requirements", type=Path, default=Path("requirements.txt"))
    parser.add_argument("--notebook", type=Path, help="execute this notebook in a kernel")
    arguments = parser.parse_args(argv)
    if arguments.notebook is not None:
        return run_notebook(arguments.notebook)
    results = run_all(arguments.requirements)
    for result in results:
        print(result)
    print(verdict(results))
    return 0 if all(result.passed for result in results) else 1


if __name__ == "__main__":
    # Run the importable module, not this __main__ copy: the ranks check's spawned
    # processes import its worker by module name.
    from tpuready.runtime.setup_check import main as importable_main

    sys.exit(importable_main())
