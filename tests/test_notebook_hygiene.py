"""Checks on the stored notebooks that nbval does not make: structure, metadata, hygiene.

nbval re-runs every notebook and compares outputs; these tests check what a reader and the
website rely on beyond that (see CONTRIBUTING.md, "The notebook contract").
"""

from __future__ import annotations

import ast
import getpass
import re
from pathlib import Path

import pytest
import yaml
from conftest import REPOSITORY, all_notebook_paths, read_notebook

from tpuready.audit.sources import CUDA_ON_PURPOSE_TAG

# 00_setup_check is a tool a learner runs first, not a lesson: it has no exercises.
CHAPTER_NAME = re.compile(r"^(?!00_)\d\d_[a-z0-9_]+\.ipynb$")
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
        # An exercise's "your turn" cell raises on purpose, and is stored never run (below).
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
        # A "Your turn" cell ran too, but is stored as never run (see the exercises below).
        cells = code_cells(path)
        counts = [cell.get("execution_count") for cell in cells]
        expected = [
            None if "your-turn" in tags_of(cell) else number
            for number, cell in enumerate(cells, start=1)
        ]
        assert counts == expected, (
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

    def test_no_per_run_metadata(self, path: Path) -> None:
        # Per-run data (timings, timestamps) would make every re-execution a diff. The time
        # budget is enforced where it is measured: tests/notebook_time_budget.py under nbval.
        notebook = read_notebook(path)
        assert "tpuready" not in notebook.metadata
        for cell in notebook.cells:
            assert "execution" not in cell.get("metadata", {}), "no per-cell timings"

    def test_an_engine_start_cell_bounds_its_start_with_a_timeout(self, path: Path) -> None:
        # The time budget leaves these cells out (tests/notebook_time_budget.py): their own
        # clock is what bounds them.
        unbounded = [
            index
            for index, cell in enumerate(code_cells(path), start=1)
            if "engine-start" in cell.get("metadata", {}).get("tags", [])
            and not re.search(r"\b(start_)?timeout_seconds=", cell["source"])
        ]
        assert unbounded == [], f"cells tagged engine-start with no timeout_seconds=: {unbounded}"

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
        # The number the prose calls it by ("chapter 4") is in the title and the sidebar.
        number = int(path.name[:2])
        assert first.source.startswith(f"# {number}. "), f"the title lacks '{number}. '"
        for heading in ("What you'll do", "What you'll learn", "What you'll need"):
            assert heading in first.source, f"the opening lacks '{heading}'"

    def test_closes_with_summary_exercises_and_further_reading(self, path: Path) -> None:
        markdown = "\n".join(
            c.source for c in read_notebook(path).cells if c.cell_type == "markdown"
        )
        for heading in ("## Summary", "## Exercises", "## Further reading"):
            assert heading in markdown, f"missing '{heading}'"
        assert "{exercise}" in markdown


# ---------------------------------------------------------------------------------------------
# Numbers in prose come from outputs (myst-nb glue). See CONTRIBUTING.md, "Numbers in prose".

# A number right after one of these words is a name, not a result: "chapter 4", "step 4",
# "Python 3.11", "PEP 8", "PCIe 4.0". Lists after them count too ("chapters 1 and 4").
NAME_WORDS = (
    "chapter|chapters|Chapter|Chapters|Part|Parts|part|step|steps|Step|Steps|exercise|Exercise|"
    "exercises|Exercises|PEP|issue|Issue|issues|#|version|Python|torch|PyTorch|TorchTPU|"
    "transformers|Transformers|PCIe|CUDA|Jupyter Book|jupyter-book|myst-nb|nbval|rank|ranks|"
    "cell|cells|Cell|line|lines|rule|rules|item|items|layer|layers|index|tpu:|cuda:|cpu:"
)
AFTER_NAME_WORD = re.compile(rf"(?:{NAME_WORDS})\s*(?:\d+\s*(?:,|and|or|to|\u2013|-)\s*)*$")
# A unit, a percent or a times sign after a digit makes even a single digit a result.
UNIT_AFTER = re.compile(
    r"^\s?(%|\u00d7|x(?![A-Za-z0-9])|ms\b|µs\b|us\b|s\b|seconds?\b|minutes?\b|GB|GiB|MB|MiB|KiB|"
    r"kB|TB|TiB|bytes?\b|FLOP|TFLOP|PFLOP|GFLOP|times\b)"
)
NUMBER = re.compile(r"(?<![\w.\-/^])\d+(?:,\d{3})*(?:\.\d+)*(?:[eE][-+]?\d+)?")
FENCE = re.compile(r"^(`{3,}|~{3,}|:{3,})(.*)$")


def prose_of(markdown: str) -> str:
    """The reader-visible prose of a markdown cell, without code, math, links and glue roles."""
    kept: list[str] = []
    code_fence: str | None = None
    directive_fences: list[str] = []  # open directives, innermost last: their body is prose
    for line in markdown.splitlines():
        stripped = line.strip()
        fence = FENCE.match(stripped)
        if code_fence is not None:
            if fence and fence.group(1) == code_fence and not fence.group(2).strip():
                code_fence = None
            continue
        if fence:
            info = fence.group(2).strip()
            if info.startswith("{") or (fence.group(1).startswith(":") and info):
                directive_fences.append(fence.group(1))
                kept.append(re.sub(r"^\{[\w:-]+\}", "", info))  # a directive: keep its title
            elif not info and directive_fences and fence.group(1) == directive_fences[-1]:
                directive_fences.pop()
            else:
                code_fence = fence.group(1)
            continue
        if re.match(r"^:[\w-]+:", stripped) or re.match(r"^\(.+\)=$", stripped):
            continue  # directive options (`:label: ch01-x`) and targets
        line = re.sub(r"^\s*#{1,6}\s+\d+\.\s", "", line)  # "## 3. Verb ..." step headings
        line = re.sub(r"^\s*\d+\.\s", "", line)  # numbered list items
        kept.append(line)
    text = "\n".join(kept)
    text = re.sub(r"\$\$.*?\$\$", " ", text, flags=re.DOTALL)
    text = re.sub(r"\$[^$\n]+\$", " ", text)
    text = re.sub(r"(\{[\w:-]+\})?`+[^`]*`+", " ", text)  # code spans and roles, glue included
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    text = re.sub(r"<https?://[^>]*>|https?://\S+", " ", text)
    text = re.sub(r"<!--.*?-->", " ", text, flags=re.DOTALL)
    return re.sub(r"\[\^[\w-]+\]", " ", text)  # footnote references


def unglued_numbers(markdown: str) -> list[str]:
    """Numbers in prose that look like results rather than names, years or versions."""
    text = prose_of(markdown)
    found = []
    for match in NUMBER.finditer(text):
        token, after = match.group(), text[match.end() : match.end() + 12]
        before = text[max(0, match.start() - 40) : match.start()]
        unit = UNIT_AFTER.match(after)
        is_ratio_or_unit = unit is not None
        if after[:1].isalpha() and not is_ratio_or_unit:
            continue  # part of a word: "2D", "3rd", "8B"
        if re.fullmatch(r"\d+\.\d+\.\d+", token) or re.fullmatch(r"(19|20)\d\d", token):
            continue  # a version (0.2.0) or a year
        if re.match(r"^-[Dd]\b", after) or AFTER_NAME_WORD.search(before):
            continue  # "2-D", "chapter 4", "Python 3.11"
        if re.fullmatch(r"\d", token) and not is_ratio_or_unit:
            continue  # a small count such as "4 ranks"
        spaced = unit is not None and unit.group()[:1].isspace()
        found.append(token + (" " if spaced else "") + (unit.group().strip() if unit else ""))
    return found


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("It took 14.75 ms, 7\u00d7 slower.", ["14.75 ms", "7\u00d7"]),
        ("11,000 times faster; 676 overloads", ["11,000 times", "676"]),
        ("See chapter 4, steps 2 and 4, Python 3.11, torch 2.13 and 0.2.0 (2026).", []),
        ("float32 and bf16 on v5e, a 2-D mesh of 4 ranks", []),
        ("Glued: {glue:text}`ch01_ratio:.1f` and `x = 128` and $2^{-8}$", []),
        ("```python\nx = 1234\n```\nafter 99 steps", ["99"]),
        ("```{exercise} Port 1 script\n:label: ch01-port\nDo 3 things in 5 s\n```", ["5 s"]),
        ("## 4. Measure\n1. First\n2. Second with 128 tiles", ["128"]),
        ("a loss near 4e-5", ["4e-5"]),
        ("````{admonition} Takeaway\n```python\nx = 99\n```\n````\nthen 77 steps", ["77"]),
    ],
)
def test_unglued_numbers_finds_results_not_names(markdown: str, expected: list[str]) -> None:
    assert unglued_numbers(markdown) == expected


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_numbers_in_prose_are_glued(path: Path) -> None:
    offenders = {
        index: numbers
        for index, cell in enumerate(read_notebook(path).cells, start=1)
        if cell.cell_type == "markdown" and (numbers := unglued_numbers(cell.source))
    }
    assert offenders == {}, (
        f"numbers in prose that are not glued (cell: numbers): {offenders}. Compute them in a "
        "cell, `glue('key', value, display=False)`, and write {glue:text}`key:.1f` in the prose"
    )


# ---------------------------------------------------------------------------------------------
# Exercises a workshop can use. See CONTRIBUTING.md, "Exercises".

YOUR_TURN_TAGS = {"your-turn", "nbval-raises-exception", "remove-output"}
SOLUTION_TAGS = {"solution", "hide-input"}
DEFINE_LINE = re.compile(r"^\*\*Define:\*\*\s*(.+)$", re.MULTILINE)


def tags_of(cell: dict) -> set[str]:
    return set(cell.get("metadata", {}).get("tags", []))


def assigned_names(source: str) -> set[str]:
    """Names a cell binds: assignments, loop targets, defs, classes, imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


def loaded_names(source: str) -> set[str]:
    return {
        node.id
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
    }


def exercises_of(path: Path) -> list[tuple[str, list[str], list[dict], list[dict]]]:
    """(label, defined names, cells before the exercise, the exercise's cells) per exercise."""
    cells = read_notebook(path).cells
    starts = [
        i for i, c in enumerate(cells) if c.cell_type == "markdown" and "{exercise}" in c.source
    ]
    reading = (i for i, c in enumerate(cells) if c.source.startswith("## Further reading"))
    ends = [*starts[1:], next(reading, len(cells))]
    exercises = []
    for start, end in zip(starts, ends, strict=True):
        prompt = cells[start].source
        label = re.search(r"^:label:\s*(\S+)", prompt, re.MULTILINE)
        define = DEFINE_LINE.search(prompt)
        names = re.findall(r"`([A-Za-z_]\w*)`", define.group(1)) if define else []
        exercises.append(
            (label.group(1) if label else "", names, cells[:start], cells[start + 1 : end])
        )
    return exercises


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda path: path.name)
class TestExercises:
    def test_prompts_are_labelled_and_name_what_to_define(self, path: Path) -> None:
        exercises = exercises_of(path)
        assert exercises, "a chapter closes with exercises"
        prefix = f"ch{path.name[:2]}-"
        for label, names, _, _ in exercises:
            assert label.startswith(prefix), f"exercise label {label!r} must start with {prefix}"
            assert names, f"{label}: the prompt needs a line '**Define:** `name`, ...'"

    def test_no_gated_solutions(self, path: Path) -> None:
        # `{solution-start}` blocks show as raw text in Jupyter Lab and run on Run All.
        text = "\n".join(c.source for c in read_notebook(path).cells)
        assert "{solution-start}" not in text and "{solution-end}" not in text

    def test_each_exercise_has_your_turn_solution_and_check_in_order(self, path: Path) -> None:
        for label, _, _, cells in exercises_of(path):
            roles = [
                role
                for cell in cells
                if cell.cell_type == "code"
                for role in ("your-turn", "solution", "check")
                if role in tags_of(cell)
            ]
            assert roles[:1] == ["your-turn"] and roles[-1:] == ["check"], (label, roles)
            assert roles.count("your-turn") == 1 and roles.count("check") == 1, (label, roles)
            assert roles[1:-1] and set(roles[1:-1]) == {"solution"}, (label, roles)

    def test_your_turn_cells_raise_until_the_reader_writes_code(self, path: Path) -> None:
        for label, _, _, cells in exercises_of(path):
            for cell in cells:
                if "your-turn" not in tags_of(cell):
                    continue
                assert tags_of(cell) >= YOUR_TURN_TAGS, f"{label}: tags {YOUR_TURN_TAGS}"
                assert "raise NotImplementedError" in cell.source, label
                # Stored as never run: Lab opens it empty, not under a red traceback.
                assert (cell.outputs, cell.execution_count) == ([], None), label

    def test_run_all_stops_at_the_first_your_turn_cell(self, path: Path) -> None:
        # JupyterLab's Run All carries on past a cell tagged `raises-exception` (and would run
        # the solutions); nbval's own `nbval-raises-exception` lets the cell raise under test.
        carried_on = [
            index
            for index, cell in enumerate(code_cells(path), start=1)
            if "raises-exception" in tags_of(cell)
        ]
        assert carried_on == [], f"code cells {carried_on} tell Lab's Run All to carry on"

    def test_solutions_are_collapsed_in_lab_and_a_dropdown_on_the_site(self, path: Path) -> None:
        for label, _, _, cells in exercises_of(path):
            for cell in cells:
                if "solution" not in tags_of(cell):
                    continue
                assert tags_of(cell) >= SOLUTION_TAGS, f"{label}: tags {SOLUTION_TAGS}"
                assert cell.metadata.get("jupyter", {}).get("source_hidden") is True, label
                # An output would show outside the site's closed dropdown and under Lab's
                # collapsed cell, and a solution's output is its answer.
                assert cell.outputs == [], f"{label}: a solution cell shows an output"
                # Lab shows a collapsed cell's first line: let it warn, not give the answer.
                assert cell.source.startswith("# Solution"), f"{label}: {cell.source[:40]!r}"
                assert "code_prompt_show" in cell.metadata.get("mystnb", {}), label

    def test_check_cells_grade_the_names_the_prompt_gave(self, path: Path) -> None:
        for label, names, before, cells in exercises_of(path):
            solutions = [c.source for c in cells if "solution" in tags_of(c)]
            check = next(c for c in cells if "check" in tags_of(c))
            solved = set().union(*(assigned_names(source) for source in solutions))
            assert set(names) <= solved, (
                f"{label}: the solution never defines {set(names) - solved}"
            )
            known_before = set().union(
                *(
                    assigned_names(c.source)
                    for c in before + cells
                    if c.cell_type == "code" and not tags_of(c) & {"solution", "check", "your-turn"}
                )
            )
            used = loaded_names(check.source)
            assert set(names) <= used, f"{label}: the check ignores {set(names) - used}"
            leaked = (used & solved) - set(names) - known_before
            assert leaked == set(), f"{label}: the check reads solution-only names {leaked}"
            assert any(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(check.source)))
            assert "Check passed" in outputs_text(check), f"{label}: the check did not pass"


# ---------------------------------------------------------------------------------------------
# Outputs fit the page: the book's column holds about 80 characters of code at 1280 px.

MAX_OUTPUT_LINE = 79


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_text_outputs_fit_the_column(path: Path) -> None:
    wide = {}
    for index, cell in enumerate(code_cells(path), start=1):
        for output in cell.get("outputs", []):
            text = output.get("text", "") if output["output_type"] == "stream" else ""
            if "text/html" not in output.get("data", {}) and "text/markdown" not in output.get(
                "data", {}
            ):
                plain = output.get("data", {}).get("text/plain", "")
                text += plain if isinstance(plain, str) else "".join(plain)
            longest = max((len(line) for line in text.splitlines()), default=0)
            if longest > MAX_OUTPUT_LINE:
                wide[index] = longest
    assert wide == {}, (
        f"output lines longer than {MAX_OUTPUT_LINE} characters (cell: width): {wide}"
    )


# Plots: a reader who cannot see one hears its description (the site's alt text, which
# myst-nb takes from the cell's `mystnb.image.alt`); without one the site reads out a file name.


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_every_plot_has_a_description(path: Path) -> None:
    undescribed = []
    for index, cell in enumerate(code_cells(path), start=1):
        if not any("image/png" in output.get("data", {}) for output in cell.get("outputs", [])):
            continue
        alt = cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt", "")
        if len(alt) < 40 or not alt.endswith(".") or re.search(r"\.(png|svg)\b", alt):
            undescribed.append(index)
    assert undescribed == [], (
        f"code cells {undescribed} draw a plot without a description: set metadata "
        "mystnb.image.alt to a sentence that says what the plot shows on any machine"
    )


# Loader and loading options this book has run only on a CPU: a notebook that uses one in
# code must say, in its prose, that it is untested on TorchTPU.
# (A signature's `pin_memory=None`, as chapter 3 prints one, is not a use.) `torch.load` to a
# device makes torch.serialization call `torch.tpu.is_available()` and `device_count()` for a
# `tpu` location (chapter 2, step 4); loading to the host is the tested route.
UNTESTED_ON_TPU = {
    "pin_memory": re.compile(r"\bpin_memory=(?!None\b|False\b)"),
    "device_map": re.compile(r"\bdevice_map=(?!None\b)"),
    "map_location": re.compile(r"\bmap_location=(?!None\b|(torch\.device\()?[\"']cpu[\"'])"),
}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda path: path.name)
def test_options_untested_on_a_tpu_are_labelled(path: Path) -> None:
    notebook = read_notebook(path)
    used = sorted(
        {
            option
            for option, pattern in UNTESTED_ON_TPU.items()
            for cell in notebook.cells
            if cell.cell_type == "code" and pattern.search(cell.source)
        }
    )
    prose = " ".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")
    assert not used or "untested on torchtpu" in prose.lower(), (
        f"{path.name} uses {used} in code but never says it is untested on TorchTPU"
    )
