"""Shared paths and helpers for the test suite."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPOSITORY / "notebooks"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


def all_notebook_paths() -> list[Path]:
    """Every notebook of the book (chapters and reference pages), sorted by name."""
    return sorted(NOTEBOOK_DIR.glob("*.ipynb"))


@pytest.fixture(scope="session")
def repository() -> Path:
    return REPOSITORY


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
