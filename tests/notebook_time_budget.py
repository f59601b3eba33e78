"""pytest plugin: fail an nbval run in which a notebook took longer than its time budget.

`make nbval` and `make test` load it with `-p notebook_time_budget`. It adds up the durations
pytest measures for every cell of a notebook (setup, which starts the kernel, and call), so the
budget is checked on the run that enforces it, not on a number stored in the notebook.

A cell tagged `engine-start` starts another program whose start-up a CPU cannot shorten (chapter
25's vLLM engines, each about 20 s of imports). Its time is reported on its own line and kept out
of the notebook's budget; the cell bounds it with its own timeout, and its prose says why.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

NOTEBOOK_BUDGET_SECONDS = 60.0
ENGINE_START_TAG = "engine-start"


def notebook_of(nodeid: str) -> str | None:
    """The notebook path in an nbval node id (`notebooks/01_x.ipynb::Cell 3`), else None."""
    path = nodeid.split("::", 1)[0]
    return path if path.endswith(".ipynb") else None


def over_budget(seconds_per_notebook: dict[str, float], budget: float) -> dict[str, float]:
    """The notebooks whose total exceeds `budget` seconds."""
    if budget <= 0:
        raise ValueError(f"the budget must be positive seconds, got {budget!r}")
    return {name: total for name, total in seconds_per_notebook.items() if total > budget}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--notebook-budget",
        type=float,
        default=NOTEBOOK_BUDGET_SECONDS,
        help="seconds one notebook may take under nbval (default %(default)s)",
    )


class _NotebookTimes:
    """Adds up, per notebook, the durations of its cells' reports (one per pytest session)."""

    def __init__(self, budget: float) -> None:
        over_budget({}, budget)  # validates the budget
        self.budget = budget
        self.seconds: dict[str, float] = defaultdict(float)
        self.engine_start_seconds: dict[str, float] = defaultdict(float)

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        # Runs where the cell runs (an xdist worker too); the mark travels with the reports.
        cell = getattr(item, "cell", None)
        if cell is not None and ENGINE_START_TAG in cell.get("metadata", {}).get("tags", []):
            item.user_properties.append((ENGINE_START_TAG, True))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        notebook = notebook_of(report.nodeid)
        if notebook is None:
            return
        if (ENGINE_START_TAG, True) in report.user_properties and report.when == "call":
            self.engine_start_seconds[notebook] += report.duration
        else:
            self.seconds[notebook] += report.duration

    def pytest_terminal_summary(self, terminalreporter) -> None:  # type: ignore[no-untyped-def]
        if not self.seconds:
            return
        terminalreporter.section(f"notebook times (budget {self.budget:.0f} s each)")
        for name, total in sorted(self.seconds.items()):
            flag = "  OVER BUDGET" if total > self.budget else ""
            terminalreporter.write_line(f"{total:6.1f} s  {name}{flag}")
        for name, total in sorted(self.engine_start_seconds.items()):
            terminalreporter.write_line(
                f"{total:6.1f} s  {name}: cells tagged {ENGINE_START_TAG}, not in the budget"
            )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):
            return  # an xdist worker: the controller sees every report and decides
        if over_budget(self.seconds, self.budget) and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(
        _NotebookTimes(config.getoption("--notebook-budget")), "notebook-times"
    )
