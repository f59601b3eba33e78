"""Open chapter 1 in Jupyter Lab, as a workshop participant does, and check what they see.

Starts a Jupyter Lab server on 127.0.0.1 (a free port, a token, `--allow-root` for containers),
serving a copy of the notebook so the repository is never written, and drives Debian's
Chromium through playwright. `jupyterlab-myst` (pinned in requirements.txt) must render the
book's MyST: every `{exercise}` prompt shows its title, no directive shows as a raw block, and
every solution cell (`jupyter.source_hidden`) opens collapsed. "Run All" stops at the first
"Your turn" cell, as the book tags it, and runs no solution after it.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import nbformat
import pytest
from conftest import NOTEBOOK_DIR, REPOSITORY, read_notebook

pytestmark = pytest.mark.browser

NOTEBOOK = NOTEBOOK_DIR / "01_device_agnostic_basics.ipynb"
# The learners' copy of chapter 17 (the chapter with the most glued numbers), as the workshop
# bundle and the site's download button give it: book/_ext/workshop_bundle.py.
LEARNER_SOURCE = NOTEBOOK_DIR / "17_padding_and_bucketing.ipynb"
LEARNER_NOTEBOOK = "12_learner_copy.ipynb"
GLUE_KEY = re.compile(r"\b(?:ch\d\d|hw)_[a-z0-9_]+\b")
STARTUP_TIMEOUT_SECONDS = 60.0
RENDER_TIMEOUT_MS = 60_000
EXERCISE_DIRECTIVE = re.compile(
    r"^```\{exercise\}\s*(?P<title>.+?)\s*\n:label:\s*(?P<label>\S+)", re.MULTILINE
)
# Text that only appears when Lab shows MyST source instead of rendering it.
RAW_MYST = re.compile(r"```\{|^:(label|class):", re.MULTILINE)
RENDERED_MARKDOWN = ".myst, .jp-RenderedMarkdown"


def exercises(notebook: Path) -> list[tuple[str, str]]:
    """(title, label) of every `{exercise}` directive in the notebook, in order."""
    found = []
    for cell in read_notebook(notebook).cells:
        if cell.cell_type == "markdown":
            found += [(m["title"], m["label"]) for m in EXERCISE_DIRECTIVE.finditer(cell.source)]
    return found


def solution_cell_indices(notebook: Path) -> list[int]:
    """Positions of the cells tagged `solution` (the ones Lab must open collapsed)."""
    cells = read_notebook(notebook).cells
    return [i for i, cell in enumerate(cells) if "solution" in cell.metadata.get("tags", [])]


RUN_ALL_NOTEBOOK = "run_all_stops.ipynb"


def run_all_notebook() -> dict:
    """A three-cell notebook: a cell, chapter 1's first "Your turn" cell (its tags and
    source as the book stores them), and a cell standing for the solution after it."""
    notebook = read_notebook(NOTEBOOK)
    your_turn = next(c for c in notebook.cells if "your-turn" in c.metadata.get("tags", []))
    first = nbformat.v4.new_code_cell('print("before the exercise")')
    after = nbformat.v4.new_code_cell('print("the solution ran")')
    notebook.cells = [first, your_turn, after]
    return notebook


def learner_copy() -> nbformat.NotebookNode:
    """Chapter 17 with its numbers in the text, as the workshop bundle holds it."""
    sys.path.insert(0, str(REPOSITORY / "book" / "_ext"))
    try:
        from workshop_bundle import learner_notebook
    finally:
        sys.path.pop(0)
    return learner_notebook(read_notebook(LEARNER_SOURCE), LEARNER_SOURCE.name)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def lab_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Jupyter Lab server on 127.0.0.1 serving a copy of chapter 1; yields its notebook URL."""
    home = tmp_path_factory.mktemp("lab")
    root = home / "notebooks"
    root.mkdir()
    shutil.copy2(NOTEBOOK, root / NOTEBOOK.name)
    nbformat.write(run_all_notebook(), root / RUN_ALL_NOTEBOOK)
    nbformat.write(learner_copy(), root / LEARNER_NOTEBOOK)
    port, token = _free_port(), secrets.token_hex(16)
    # Lab's own state (config, runtime files, workspaces, settings) stays in the temporary
    # folder. The settings turn off autosave and the news prompt (the test only reads), and
    # windowing: Lab then attaches every cell at once instead of as a reader scrolls to it,
    # through the same renderers.
    settings = home / "settings"
    for plugin, values in {
        "@jupyterlab/docmanager-extension/plugin": '{"autosave": false}',
        "@jupyterlab/apputils-extension/notification": '{"fetchNews": "false"}',
        "@jupyterlab/notebook-extension/tracker": '{"windowingMode": "none"}',
    }.items():
        path = settings / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(values, encoding="utf-8")
    env = dict(
        os.environ,
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTER_PLATFORM_DIRS="1",
    )
    log_path = home / "lab.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                "--allow-root",
                "--ip=127.0.0.1",
                f"--port={port}",
                "--port-retries=0",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
                f"--LabApp.workspaces_dir={home / 'workspaces'}",
                f"--LabApp.user_settings_dir={settings}",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
        while True:
            if server.poll() is not None:
                pytest.fail(f"Jupyter Lab exited with {server.returncode}:\n{log_path.read_text()}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail(
                        f"Jupyter Lab did not answer within {STARTUP_TIMEOUT_SECONDS:.0f} s:\n"
                        + log_path.read_text()
                    )
                time.sleep(0.25)
        yield f"{base}/lab/tree/{NOTEBOOK.name}?token={token}"
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=15)


@pytest.fixture(scope="module")
def lab_page(lab_url: str, browser) -> Iterator[object]:
    """Chapter 1 open in Lab in Chromium, with every markdown cell rendered."""
    lab_host = urlparse(lab_url).netloc
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    external: list[str] = []

    def route(route_request) -> None:
        url = route_request.request.url
        if urlparse(url).netloc == lab_host or url.startswith("data:"):
            route_request.continue_()
        else:
            external.append(url)
            route_request.abort()

    page.route("**/*", route)
    page.goto(lab_url, wait_until="load")
    page.wait_for_selector(".jp-Notebook .jp-MarkdownCell", timeout=RENDER_TIMEOUT_MS)
    # Wait until every markdown cell shows its rendering: jupyterlab-myst's (`.myst`) or,
    # were the extension missing, Lab's plain CommonMark one, which the tests then reject.
    page.wait_for_function(
        "() => Array.from(document.querySelectorAll('.jp-Notebook .jp-MarkdownCell'))"
        f".every(cell => cell.querySelector('{RENDERED_MARKDOWN}'))",
        timeout=RENDER_TIMEOUT_MS,
    )
    yield page
    page.close()
    assert external == [], f"Lab asked for non-loopback URLs: {external}"


def test_chapter_1_has_exercises_and_solutions_to_check() -> None:
    """Guards the tests below against passing vacuously on a notebook with no exercises."""
    assert exercises(NOTEBOOK), f"no {{exercise}} directive with a :label: in {NOTEBOOK.name}"
    assert solution_cell_indices(NOTEBOOK), f"no cell tagged 'solution' in {NOTEBOOK.name}"


def test_lab_renders_every_exercise_title(lab_page) -> None:
    boxes = lab_page.locator(".jp-Notebook aside.myst-exercise")
    # MyST renders an apostrophe typographically (TPU's as TPU\u2019s); the words are what count.
    titles = [
        " ".join(text.replace("\u2019", "'").split())
        for text in boxes.locator(".myst-exercise-title").all_inner_texts()
    ]
    labels = boxes.evaluate_all("boxes => boxes.map(box => box.id)")
    expected = exercises(NOTEBOOK)
    assert len(titles) == len(expected), f"rendered exercise titles: {titles}"
    assert labels == [label for _, label in expected]
    for title, (wanted, _) in zip(titles, expected, strict=True):
        assert re.fullmatch(rf"Exercise \d+ \({re.escape(wanted)}\)", title), (title, wanted)


def test_lab_shows_no_raw_myst_directive(lab_page) -> None:
    rendered = lab_page.locator(".jp-Notebook .jp-MarkdownCell").locator(RENDERED_MARKDOWN)
    rendered = rendered.all_inner_texts()
    raw = [text[:200] for text in rendered if RAW_MYST.search(text)]
    assert raw == []
    assert lab_page.locator(".jp-Notebook aside.myst-admonition").count() > 0, (
        "no admonition (Takeaway box) rendered"
    )


def test_lab_opens_every_solution_collapsed(lab_page) -> None:
    cells = lab_page.locator(".jp-Notebook .jp-Notebook-cell")
    assert cells.count() == len(read_notebook(NOTEBOOK).cells), "Lab did not attach every cell"
    for index in solution_cell_indices(NOTEBOOK):
        cell = cells.nth(index)
        assert "jp-CodeCell" in (cell.get_attribute("class") or ""), index
        assert cell.locator(".jp-InputPlaceholder").count() == 1, f"cell {index} is not collapsed"
        assert cell.locator(".jp-InputArea .cm-editor").count() == 0, f"cell {index} shows code"


def test_run_all_stops_at_the_your_turn_cell(lab_url: str, browser) -> None:
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        # A workspace of its own, reset: only this notebook is open, so Run All runs it.
        alone = f"/lab/workspaces/run-all/tree/{RUN_ALL_NOTEBOOK}?reset&"
        page.goto(lab_url.replace(f"/lab/tree/{NOTEBOOK.name}?", alone), wait_until="load")
        page.wait_for_selector(".jp-Notebook .jp-CodeCell", timeout=RENDER_TIMEOUT_MS)
        # The kernel is up when the status bar says so; Run All before that may do nothing.
        page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=RENDER_TIMEOUT_MS)
        page.click(".lm-MenuBar-itemLabel:text-is('Run')")
        page.click(".lm-Menu-itemLabel:text-is('Run All Cells')")
        cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-CodeCell")
        assert cells.count() == 3
        cells.nth(1).locator("[data-mime-type='application/vnd.jupyter.stderr']").wait_for(
            timeout=RENDER_TIMEOUT_MS
        )
        assert "before the exercise" in cells.nth(0).inner_text()
        assert "NotImplementedError" in cells.nth(1).inner_text()
        page.wait_for_timeout(2_000)  # time for a cell Run All went on to, were there one
        assert cells.nth(2).locator(".jp-OutputArea-output").count() == 0
        assert cells.nth(2).locator(".jp-InputPrompt").inner_text().strip() == "[ ]:"
    finally:
        page.close()


def _rendered_markdown(page) -> str:  # type: ignore[no-untyped-def]
    cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-MarkdownCell")
    return "\n".join(cells.locator(RENDERED_MARKDOWN).all_inner_texts())


def test_the_book_notebooks_show_glue_keys_in_lab(lab_page) -> None:
    """What the learners' copies fix: a notebook of the book shows each number as its key."""
    assert GLUE_KEY.search(_rendered_markdown(lab_page))


def test_the_learners_copy_shows_numbers_in_lab(lab_url: str, browser) -> None:
    expected = next(
        cell.source for cell in learner_copy().cells if cell.source.startswith("## Summary")
    )
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    try:
        alone = f"/lab/workspaces/learner/tree/{LEARNER_NOTEBOOK}?reset&"
        page.goto(lab_url.replace(f"/lab/tree/{NOTEBOOK.name}?", alone), wait_until="load")
        page.wait_for_selector(".jp-Notebook .jp-MarkdownCell", timeout=RENDER_TIMEOUT_MS)
        page.wait_for_function(
            "() => Array.from(document.querySelectorAll('.jp-Notebook .jp-MarkdownCell'))"
            f".every(cell => cell.querySelector('{RENDERED_MARKDOWN}'))",
            timeout=RENDER_TIMEOUT_MS,
        )
        text = _rendered_markdown(page)
    finally:
        page.close()
    assert GLUE_KEY.findall(text) == []
    # The summary's numbers, as the site prints them: "wastes 57% of the tokens".
    numbers = re.findall(r"\d[\d,.]*%?", expected.split("\n", 2)[2])
    assert len(numbers) > 5
    missing = [number for number in numbers if number not in text]
    assert missing == []
