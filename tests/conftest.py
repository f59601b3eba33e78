"""Shared paths and helpers for the test suite."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import nbformat
import pytest
from hypothesis import settings

from tpuready.calc.plan import ModelConfig

# Properties are about values, not speed: Hypothesis's 200 ms deadline per example failed tests
# on a busy two-core machine, so no test gets one (a test's own settings still apply on top).
settings.register_profile("tpuready", deadline=None)
settings.load_profile("tpuready")

# Qwen/Qwen3-235B-A22B's published config.json as a ModelConfig: the model chapters 14, 21 and 26
# plan, shared by the tests of the planner, the rooflines and the TorchTitan flags.
QWEN3_235B = ModelConfig(
    name="Qwen3-235B-A22B",
    num_layers=94,
    hidden_size=4096,
    num_heads=64,
    num_kv_heads=4,
    head_dim=128,
    num_experts=128,
    experts_per_token=8,
    expert_ffn_size=1536,
    vocab_size=151936,
    tied_embeddings=False,
)


REPOSITORY = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPOSITORY / "notebooks"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def all_notebook_paths() -> list[Path]:
    """Every notebook of the book (chapters and reference pages), sorted by name."""
    return sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def unpadded(markdown: str) -> str:
    """Markdown whose tables lose tabulate's column padding, so a test can look for `| a | b |`."""

    def one_row(row: re.Match[str]) -> str:
        return re.sub(r" +\|", " |", re.sub(r"-+\|", "---|", row[0]))

    return re.sub(r"(?m)^\|.*$", one_row, markdown)


@pytest.fixture(scope="session")
def repository() -> Path:
    return REPOSITORY


def refuse_to_list(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Make `folder` unreadable to os.walk: chmod 000 does not stop root, so scandir refuses."""
    real_scandir = os.scandir

    def scandir(path: Any = ".") -> Any:
        if Path(os.fsdecode(path)) == folder:
            raise PermissionError(13, "Permission denied", os.fsdecode(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)


def read_notebook(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)


@pytest.fixture(scope="session")
def browser():
    """Debian's Chromium through playwright, one per session: the site and Lab tests share it."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: run `make chromium` (as root) first")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
            ],
        )
        yield browser
        browser.close()


TORCHRUN = ("-m", "torch.distributed.run")
"""The standard launcher, as `python -m` runs it."""


def run_torchrun(
    script: Path,
    num_ranks: int,
    *arguments: object,
    timeout_seconds: float,
    launcher: Sequence[str] = TORCHRUN,
) -> Any:
    """Run `script` under the standard launcher on `num_ranks` CPU processes, one thread each.

    Returns the one JSON line (an object or a list) that rank 0 printed. The Part II tests
    compare it with what the same worker returns through `tpuready.runtime.launch.run_workers`.
    `launcher` is what follows `python` (`("-m", "tpuready", "torchrun")`: the book's wrapper).
    """
    printed, _ = run_torchrun_with_stderr(
        script, num_ranks, *arguments, timeout_seconds=timeout_seconds, launcher=launcher
    )
    return printed


def run_torchrun_with_stderr(
    script: Path,
    num_ranks: int,
    *arguments: object,
    timeout_seconds: float,
    extra_env: dict[str, str] | None = None,
    launcher: Sequence[str] = TORCHRUN,
) -> tuple[Any, str]:
    """`run_torchrun`, with `extra_env` set for every rank: rank 0's JSON and all stderr."""
    completed = subprocess.run(
        [
            sys.executable,
            *launcher,
            "--standalone",
            f"--nproc-per-node={num_ranks}",
            str(script),
            *map(str, arguments),
        ],
        cwd=REPOSITORY,
        env=dict(os.environ, OMP_NUM_THREADS="1", **(extra_env or {})),
        capture_output=True,
        text=True,
        timeout=timeout_seconds,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    json_lines = [line for line in completed.stdout.splitlines() if line.startswith(("{", "["))]
    assert len(json_lines) == 1, f"expected one JSON line from rank 0:\n{completed.stdout}"
    return json.loads(json_lines[0]), completed.stderr


def load_script(name: str) -> ModuleType:
    """`scripts/<name>.py` as a module, with `scripts/` on the path while it loads, as when it
    runs (the scripts import their siblings)."""
    scripts = str(REPOSITORY / "scripts")
    sys.path.insert(0, scripts)
    try:
        spec = importlib.util.spec_from_file_location(name, f"{scripts}/{name}.py")
        assert spec and spec.loader, name
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(scripts)
    return module
