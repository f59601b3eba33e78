"""The tools around the notebooks: the executor's stored-sample rule and the nbval time budget."""

from __future__ import annotations

import re
import subprocess
import textwrap
from pathlib import Path

import nbformat
import pytest
from conftest import REPOSITORY, load_script
from notebook_time_budget import notebook_of, over_budget

pytest_plugins = ["pytester"]


executor = load_script("notebooks")


def _notebook(*cells: tuple[str, str]) -> nbformat.NotebookNode:
    notebook = nbformat.v4.new_notebook()
    for source, printed in cells:
        cell = nbformat.v4.new_code_cell(source)
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=printed)]
        notebook.cells.append(cell)
    return notebook


TIMING = "# NBVAL_IGNORE_OUTPUT\n# Why: a wall-clock time\nprint(elapsed)"


def test_an_unchanged_timing_cell_keeps_its_stored_sample() -> None:
    stored = _notebook(("print(1)", "1\n"), (TIMING, "2.20 ms\n"))
    fresh = _notebook(("print(1)", "1\n"), (TIMING, "2.31 ms\n"))
    assert executor.keep_stored_samples(stored, fresh) == 1
    assert fresh.cells[1].outputs[0].text == "2.20 ms\n"


def test_a_your_turn_cell_is_stored_never_run_and_execution_goes_past_it(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    your_turn = nbformat.v4.new_code_cell('raise NotImplementedError("Your turn")')
    your_turn.metadata["tags"] = ["your-turn", "nbval-raises-exception", "remove-output"]
    notebook.cells = [
        nbformat.v4.new_code_cell("answer = 41"),
        your_turn,
        nbformat.v4.new_code_cell("print(answer + 1)"),  # the solution, after the stop
    ]
    path = tmp_path / "exercise.ipynb"
    nbformat.write(notebook, path)
    executed, _ = executor.run_notebook(path)
    stored = executed.cells[1]
    assert (stored.outputs, stored.execution_count) == ([], None)  # no stored traceback
    # The tag that lets nbclient (and Lab's Run All) carry on was lent for the run only.
    assert stored.metadata["tags"] == ["your-turn", "nbval-raises-exception", "remove-output"]
    assert executed.cells[2].outputs[0]["text"] == "42\n"


def test_compared_cells_and_changed_cells_take_the_new_output() -> None:
    stored = _notebook(("print(x)", "1\n"), (TIMING, "2.20 ms\n"))
    fresh = _notebook(("print(x)", "2\n"), (TIMING + " * 2", "4.62 ms\n"))
    assert executor.keep_stored_samples(stored, fresh) == 0
    assert [cell.outputs[0].text for cell in fresh.cells] == ["2\n", "4.62 ms\n"]


def test_a_timing_cell_whose_outputs_changed_kind_takes_the_new_output() -> None:
    stored = _notebook((TIMING, "2.20 ms\n"))
    fresh = _notebook((TIMING, "2.31 ms\n"))
    fresh.cells[0].outputs[0].name = "stderr"
    assert executor.keep_stored_samples(stored, fresh) == 0


def test_samples_come_from_the_committed_notebook_not_the_working_copy(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A timing cell edited since the last commit sits beside its old output in the working
    # copy; only the committed notebook shows which source made that output.
    def git(*arguments: str) -> None:
        subprocess.run(
            ["git", "-c", "user.name=book", "-c", "user.email=book@localhost", *arguments],
            cwd=tmp_path,
            check=True,
            capture_output=True,
            timeout=60,
        )

    git("init", "-q")
    chapter = tmp_path / "chapter.ipynb"
    nbformat.write(_notebook((TIMING, "2.20 ms\n")), chapter)
    git("add", "chapter.ipynb")
    git("commit", "-q", "-m", "chapter")
    nbformat.write(_notebook((TIMING + " * 2", "2.20 ms\n")), chapter)  # edited, not run
    untracked = tmp_path / "draft.ipynb"
    nbformat.write(_notebook((TIMING, "1.00 ms\n")), untracked)
    monkeypatch.setattr(executor, "REPOSITORY", tmp_path)

    committed = executor.committed_version(chapter)
    assert committed is not None and committed.cells[0].source == TIMING
    fresh = _notebook((TIMING + " * 2", "4.62 ms\n"))
    assert executor.keep_stored_samples(committed, fresh) == 0
    assert fresh.cells[0].outputs[0].text == "4.62 ms\n"
    assert executor.committed_version(untracked) is None


def test_the_tests_import_this_checkouts_tpuready() -> None:
    import tpuready

    assert Path(tpuready.__file__).resolve().is_relative_to(REPOSITORY.resolve())


def test_notebook_of_reads_nbval_node_ids() -> None:
    assert notebook_of("notebooks/01_a.ipynb::Cell 3") == "notebooks/01_a.ipynb"
    assert notebook_of("tests/test_x.py::test_y") is None


def test_over_budget_names_only_the_slow_notebooks() -> None:
    assert over_budget({"a.ipynb": 61.0, "b.ipynb": 59.0}, 60.0) == {"a.ipynb": 61.0}
    with pytest.raises(ValueError, match="-1"):
        over_budget({}, -1)


def test_a_slow_notebook_fails_the_run(pytester: pytest.Pytester) -> None:
    # Items named like nbval's (`x.ipynb::Cell 0`) that take 0.3 s, against a 0.2 s budget.
    pytester.makeconftest(
        textwrap.dedent(
            """
            import time, pytest
            class Cell(pytest.Item):
                def runtest(self):
                    time.sleep(0.15)
            class Notebook(pytest.File):
                def collect(self):
                    for index in range(2):
                        yield Cell.from_parent(self, name=f"Cell {index}")
            def pytest_collect_file(file_path, parent):
                if file_path.suffix == ".ipynb":
                    return Notebook.from_parent(parent, path=file_path)
            """
        )
    )
    pytester.makefile(".ipynb", slow="{}")
    slow = pytester.runpytest_inprocess("-p", "notebook_time_budget", "--notebook-budget", "0.2")
    assert slow.ret == pytest.ExitCode.TESTS_FAILED
    slow.stdout.fnmatch_lines(["*slow.ipynb  OVER BUDGET*"])
    fast = pytester.runpytest_inprocess("-p", "notebook_time_budget", "--notebook-budget", "5")
    assert fast.ret == pytest.ExitCode.OK


def test_a_cell_tagged_engine_start_is_reported_apart_from_the_budget(
    pytester: pytest.Pytester,
) -> None:
    # Cell 0 is slow but tagged engine-start; cell 1 is quick: the notebook stays in budget.
    pytester.makeconftest(
        textwrap.dedent(
            """
            import time, pytest
            class Cell(pytest.Item):
                def __init__(self, *, tags, **kwargs):
                    super().__init__(**kwargs)
                    self.cell = {"metadata": {"tags": tags}}
                def runtest(self):
                    time.sleep(0.3 if self.cell["metadata"]["tags"] else 0.01)
            class Notebook(pytest.File):
                def collect(self):
                    yield Cell.from_parent(self, name="Cell 0", tags=["engine-start"])
                    yield Cell.from_parent(self, name="Cell 1", tags=[])
            def pytest_collect_file(file_path, parent):
                if file_path.suffix == ".ipynb":
                    return Notebook.from_parent(parent, path=file_path)
            """
        )
    )
    pytester.makefile(".ipynb", engine="{}")
    run = pytester.runpytest_inprocess("-p", "notebook_time_budget", "--notebook-budget", "0.2")
    assert run.ret == pytest.ExitCode.OK
    run.stdout.fnmatch_lines(["*engine.ipynb: cells tagged engine-start, not in the budget*"])
    run.stdout.no_fnmatch_line("*OVER BUDGET*")


def test_audit_speed_reports_each_tool_against_ast_parse(tmp_path: Path) -> None:
    package = tmp_path / "package"
    package.mkdir()
    (package / "train.py").write_text("import torch\nx = torch.ones(1).cuda()\n" * 50)
    (package / "plain.py").write_text("y = 1\n" * 50)
    tree_line, audit_line, diff_line = executor.audit_speed([package], runs=1)
    assert "`package` (2 files, 150 lines)" in tree_line
    for line, goal in ((audit_line, "1.0x"), (diff_line, "3.0x")):
        assert re.search(rf"x `ast.parse` \((meets|misses) the goal of {re.escape(goal)}\)", line)
    assert (package / "train.py").read_text().count(".cuda()") == 50  # --diff writes nothing


def test_rewrite_section_replaces_one_section_and_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "statistics.md"
    page.write_text("# Stats\n\n### A\n\nnot a section\n\n## A\n\nold a\n\n## B\n\nold b\n")
    monkeypatch.setattr(executor, "STATISTICS_PAGE", page)
    monkeypatch.setattr(
        executor,
        "SECTIONS",
        {
            "a": ("## A", lambda runs: f"new a, {runs} runs\n"),
            "b": ("## B", lambda runs: "new b\n"),
            "c": ("## C", lambda runs: "new c\n"),
        },
    )
    executor.rewrite_section("a", 2)  # a section followed by another
    assert page.read_text() == (
        "# Stats\n\n### A\n\nnot a section\n\n## A\n\nnew a, 2 runs\n\n## B\n\nold b\n"
    )
    executor.rewrite_section("b", 1)  # the last section
    assert page.read_text().endswith("## A\n\nnew a, 2 runs\n\n## B\n\nnew b\n")
    executor.rewrite_section("c", 1)  # not on the page yet: it goes last
    assert page.read_text().endswith("## B\n\nnew b\n\n## C\n\nnew c\n")
    assert page.read_text().count("## C") == 1


def test_rewrite_section_names_a_missing_page(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(executor, "STATISTICS_PAGE", tmp_path / "missing.md")
    with pytest.raises(SystemExit, match=re.escape("missing.md is missing: run the full")):
        executor.rewrite_section("toolkit", 1)
