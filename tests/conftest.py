"""Shared paths and helpers for the test suite."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

REPOSITORY = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = REPOSITORY / "notebooks"


def all_notebook_paths() -> list[Path]:
    """Every notebook of the book (chapters and reference pages), sorted by name."""
    return sorted(NOTEBOOK_DIR.glob("*.ipynb"))


@pytest.fixture(scope="session")
def repository() -> Path:
    return REPOSITORY


def read_notebook(path: Path) -> nbformat.NotebookNode:
    return nbformat.read(path, as_version=4)
