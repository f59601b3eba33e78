"""Checks on the stored notebooks that nbval does not make: structure, metadata, hygiene.

nbval re-runs every notebook and compares outputs; these tests check what a reader and the
website rely on beyond that (see CONTRIBUTING.md, "The notebook contract").
"""

from __future__ import annotations

import getpass
import re
from pathlib import Path

import pytest
import yaml
from conftest import REPOSITORY, all_notebook_paths, read_notebook

MAX_EXECUTION_SECONDS = 60.0
CUDA_ON_PURPOSE_TAG = "cuda-on-purpose"
CHAPTER_NAME = re.compile(r"^\d\d_[a-z0-9_]+\.ipynb$")
NBVAL_MARKERS = {"# NBVAL_IGNORE_OUTPUT", "# NBVAL_CHECK_OUTPUT", "# NBVAL_SKIP"}
CUDA_CALL = re.compile(r"\.cuda\(|torch\.cuda\.")
# Absolute paths that reveal the machine or the user who executed the notebook.
MACHINE_PATH = re.compile(r"(/home/|/root\b|/Users/|/tmp/|/work/|/private/var/|[A-Z]:\\Users\\)")

NOTEBOOKS = all_notebook_paths()
CHAPTERS = [path for path in NOTEBOOKS if CHAPTER_NAME.match(path.name)]


def toc_files() -> list[str]:
    """Every `file:` entry of _toc.yml, root included, without suffix."""
    toc = yaml.safe_load((REPOSITORY / "_toc.yml").read_text())
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [chapter["file"] for chapter in part.get("chapters", [])]
    return files


def resolve_toc_entry(entry: str) -> list[Path]:
    return [REPOSITORY / f"{entry}{suffix}" for suffix in (".md", ".ipynb")]


def outputs_text(cell: dict) -> str:
    """All text a code cell's stored outputs show (streams, reprs, tracebacks)."""
    pieces = []
    for output in cell.get("outputs", []):
        pieces.append(output.get("text", ""))
        for mime, value in output.get("data", {}).items():
            if mime.startswith("text/"):
                pieces.append(value if isinstance(value, str) else "".join(value))
        pieces += output.get("traceback", [])
    return "\n".join(pieces)


def code_cells(path: Path) -> list[dict]:
    return [cell for cell in read_notebook(path).cells if cell.cell_type == "code"]


def test_the_book_has_chapters() -> None:
    assert len(CHAPTERS) >= 1, "no chapter notebooks found in notebooks/"


def test_every_notebook_is_in_the_toc() -> None:
    listed = {entry for entry in toc_files() if entry.startswith("notebooks/")}
    on_disk = {f"notebooks/{path.stem}" for path in NOTEBOOKS}
    assert on_disk - listed == set(), "notebooks missing from _toc.yml"


def test_every_toc_entry_exists() -> None:
    missing = [e for e in toc_files() if not any(p.is_file() for p in resolve_toc_entry(e))]
    assert missing == [], f"_toc.yml lists files that do not exist: {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
class TestStoredNotebook:
    def test_kernelspec_is_python3(self, path: Path) -> None:
        assert read_notebook(path).metadata["kernelspec"]["name"] == "python3"

    def test_no_error_outputs(self, path: Path) -> None:
        errors = [
            index
            for index, cell in enumerate(code_cells(path), start=1)
            for output in cell.get("outputs", [])
            if output["output_type"] == "error"
        ]
        assert errors == [], f"code cells {errors} store an error output"

    def test_nothing_on_stderr(self, path: Path) -> None:
        noisy = [
            index
            for index, cell in enumerate(code_cells(path), start=1)
            for output in cell.get("outputs", [])
            if output["output_type"] == "stream" and output["name"] == "stderr"
        ]
        assert noisy == [], f"code cells {noisy} wrote to stderr (warnings must not leak)"

    def test_execution_counts_run_one_to_n_in_order(self, path: Path) -> None:
        counts = [cell.get("execution_count") for cell in code_cells(path)]
        assert counts == list(range(1, len(counts) + 1)), (
            f"execution counts {counts}: re-execute with `make notebooks NB={path.name}`"
        )

    def test_no_empty_code_cells(self, path: Path) -> None:
        empty = [i for i, c in enumerate(code_cells(path), 1) if not c["source"].strip()]
        assert empty == []

    def test_no_machine_paths_or_user_names_in_outputs(self, path: Path) -> None:
        user = getpass.getuser()
        for index, cell in enumerate(code_cells(path), start=1):
            text = outputs_text(cell)
            assert not MACHINE_PATH.search(text), f"cell {index} shows an absolute path"
            if user not in {"root", "runner", "user"} and len(user) > 2:
                assert user not in text, f"cell {index} shows the user name {user!r}"

    def test_stored_execution_time_is_within_budget(self, path: Path) -> None:
        metadata = read_notebook(path).metadata.get("tpuready", {})
        assert "execution_seconds" in metadata, "execute it with `make notebooks`"
        assert metadata["execution_seconds"] <= MAX_EXECUTION_SECONDS

    def test_cuda_calls_only_in_cells_tagged_on_purpose(self, path: Path) -> None:
        offenders = [
            index
            for index, cell in enumerate(code_cells(path), start=1)
            if CUDA_CALL.search(cell["source"])
            and CUDA_ON_PURPOSE_TAG not in cell.get("metadata", {}).get("tags", [])
        ]
        assert offenders == [], (
            f"code cells {offenders} use .cuda( or torch.cuda.; tag them "
            f"'{CUDA_ON_PURPOSE_TAG}' if shown on purpose, else use torch.accelerator"
        )

    def test_ignored_outputs_say_why(self, path: Path) -> None:
        # nbval honours the marker only when the comment is exactly `# NBVAL_IGNORE_OUTPUT`
        # (a reason on the same line silently switches it off), so the reason goes on the
        # next line as `# Why: ...`.
        for index, cell in enumerate(code_cells(path), start=1):
            lines = [line.strip() for line in cell["source"].splitlines()]
            tags = cell.get("metadata", {}).get("tags", [])
            for line in lines:
                if "NBVAL_" in line and line.startswith("#"):
                    assert line in NBVAL_MARKERS, f"cell {index}: nbval ignores {line!r}"
            if "# NBVAL_IGNORE_OUTPUT" in lines or "nbval-ignore-output" in tags:
                reasons = [line for line in lines if line.startswith("# Why: ")]
                assert reasons and len(reasons[0]) >= 17, (
                    f"cell {index} ignores its output: say why in a `# Why: ...` line"
                )


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda path: path.name)
class TestChapterShape:
    def test_opens_with_a_title_and_what_it_teaches(self, path: Path) -> None:
        first = read_notebook(path).cells[0]
        assert first.cell_type == "markdown" and first.source.startswith("# ")
        for heading in ("What you'll do", "What you'll learn", "What you'll need"):
            assert heading in first.source, f"the opening lacks '{heading}'"

    def test_closes_with_summary_exercises_and_further_reading(self, path: Path) -> None:
        markdown = "\n".join(
            c.source for c in read_notebook(path).cells if c.cell_type == "markdown"
        )
        for heading in ("## Summary", "## Exercises", "## Further reading"):
            assert heading in markdown, f"missing '{heading}'"
        assert "{exercise}" in markdown and "{solution-start}" in markdown

    def test_exercise_solutions_are_checked_by_asserts(self, path: Path) -> None:
        cells = read_notebook(path).cells
        start = next(i for i, c in enumerate(cells) if c.source.startswith("## Exercises"))
        solution_code = [c.source for c in cells[start:] if c.cell_type == "code"]
        assert any(re.search(r"^\s*assert ", s, re.MULTILINE) for s in solution_code)
