"""Build the book with zero warnings, then check the site as a reader's browser sees it.

Runs Debian's Chromium (installed by `make test`) through playwright against the site served
over http on 127.0.0.1, with every request to any other host refused, as on a machine with no
network. Screenshots land in `_build/screenshots/` for a person to look at. No test measures
wall-clock time (a loaded machine would make it flaky): speed is `make bench`'s business.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import TypedDict
from urllib.parse import unquote, urljoin, urlparse

import nbformat
import pytest
from axe_playwright_python.sync_playwright import Axe
from conftest import REPOSITORY
from filelock import FileLock
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError

SITE = REPOSITORY / "_build" / "html"
SCREENSHOTS = REPOSITORY / "_build" / "screenshots"
CHAPTER_1 = "notebooks/01_device_agnostic_basics.html"
CHAPTER_5 = "notebooks/05_bfloat16_and_float32_matmuls.html"  # the chapter with the most math
DESKTOP_WIDTH = 1280
PHONE_WIDTH = 390
# The notebooks keep code and text outputs within this many characters (notebooks/ruff.toml).
CODE_LINE_LENGTH = 79
# Logged by the theme's dark-mode switch on a first visit, before it stores a mode; the
# theme recovers by itself ("Resetting to auto"). Every other console message is an error.
THEME_FIRST_VISIT_MESSAGE = "Got invalid theme mode"


class BookBuild(TypedDict):
    returncode: int
    log: str


def _build_book() -> BookBuild:
    """Build the book as `make book` does; return jupyter-book's exit status and its log."""
    jupyter_book = Path(os.environ.get("VIRTUAL_ENV", REPOSITORY / ".venv")) / "bin/jupyter-book"
    shutil.rmtree(SITE.parent, ignore_errors=True)
    try:
        result = subprocess.run(
            [str(jupyter_book), "build", str(REPOSITORY), "-W", "-n", "--keep-going"],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.SubprocessError) as error:  # recorded: no second try
        return {"returncode": -1, "log": f"jupyter-book did not finish: {error!r}"}
    return {"returncode": result.returncode, "log": result.stdout + result.stderr}


@pytest.fixture(scope="session")
def built_site(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The book, built once per run (xdist workers wait for the first's record), with no warning."""
    if worker_id == "master":
        build = _build_book()
    else:
        record = tmp_path_factory.getbasetemp().parent / "book-build.json"
        with FileLock(f"{record}.lock"):
            if not record.exists():
                record.write_text(json.dumps(_build_book()), encoding="utf-8")
            build = json.loads(record.read_text(encoding="utf-8"))
    warnings = [
        line for line in build["log"].splitlines() if re.search(r"\b(WARNING|ERROR)\b", line)
    ]
    assert warnings == [], "\n".join(warnings)
    assert build["returncode"] == 0, build["log"][-4000:]
    return SITE


def site_pages(site: Path) -> list[Path]:
    """Every HTML page a reader can reach (not the theme's own static files)."""
    return sorted(
        path
        for path in site.rglob("*.html")
        if not path.relative_to(site).parts[0].startswith(("_static", "_sources", "_images"))
    )


class _LinkCollector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.references: list[str] = []
        self.ids: set[str] = set()
        self.image_alts: list[str] = []  # the alt text of each <img>

    def handle_starttag(self, tag: str, attributes: list[tuple[str, str | None]]) -> None:
        values = dict(attributes)
        if values.get("id"):
            self.ids.add(values["id"] or "")
        if tag == "img":
            self.image_alts.append(values.get("alt") or "")
        attribute = {"a": "href", "link": "href", "img": "src", "script": "src"}.get(tag)
        if attribute and values.get(attribute):
            self.references.append(values[attribute] or "")


@functools.cache
def _parse(path: Path) -> _LinkCollector:
    collector = _LinkCollector()
    collector.feed(path.read_text(encoding="utf-8"))
    return collector


def test_the_book_builds_without_warnings(built_site: Path) -> None:
    assert (built_site / "index.html").is_file()
    assert (built_site / CHAPTER_1).is_file()


def test_every_image_on_a_page_has_a_description(built_site: Path) -> None:
    # Sphinx writes the file name as the alt text of an image that has none.
    undescribed = {
        page.relative_to(built_site).as_posix(): alt
        for page in site_pages(built_site)
        for alt in _parse(page).image_alts
        if not alt or re.search(r"\.(png|svg|jpe?g)\b", alt)
    }
    assert undescribed == {}


def test_every_internal_link_and_image_resolves(built_site: Path) -> None:
    broken = []
    for page in site_pages(built_site):
        for reference in _parse(page).references:
            parsed = urlparse(reference)
            if parsed.scheme or reference.startswith(("//", "mailto:")):
                continue
            target = (page.parent / unquote(parsed.path)).resolve() if parsed.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.is_file():
                broken.append(f"{page.relative_to(built_site)}: {reference}")
            elif (
                parsed.fragment
                and target.suffix == ".html"
                and unquote(parsed.fragment) not in _parse(target).ids
            ):
                broken.append(f"{page.relative_to(built_site)}: {reference} (no anchor)")
    assert broken == []


@pytest.fixture(scope="session")
def site_url(built_site: Path) -> Iterator[str]:
    handler = functools.partial(_QuietHandler, directory=str(built_site))
    server = _QuietServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: object, client_address: object) -> None:
        """A page closed while it still loads drops its connections: not an error of the site."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def refuse_other_hosts(page, site_url: str) -> set[str]:
    """Abort every request that is not for the site on 127.0.0.1; return the hosts refused.

    The page then runs as on a machine with no network: anything it fetches from elsewhere
    (a CDN's MathJax, a web font) is missing, and the set names who was asked.
    """
    site_host = urlparse(site_url).netloc
    refused: set[str] = set()

    def route(route_request) -> None:
        url = route_request.request.url
        if urlparse(url).netloc == site_host or url.startswith("data:"):
            route_request.continue_()
        else:
            refused.add(urlparse(url).netloc or url)
            route_request.abort("internetdisconnected")

    page.route("**/*", route)
    return refused


class PageProblems:
    """Console errors, page errors, failed requests and other hosts asked by one page."""

    def __init__(self, page, site_url: str) -> None:
        self.messages: list[str] = []
        self.external_hosts = refuse_other_hosts(page, site_url)
        page.on("console", self._on_console)
        page.on("pageerror", lambda error: self.messages.append(f"page error: {error}"))
        page.on("requestfailed", lambda r: self.messages.append(f"request failed: {r.url}"))
        page.on(
            "response",
            lambda r: r.status >= 400 and self.messages.append(f"HTTP {r.status}: {r.url}"),
        )

    def _on_console(self, message) -> None:
        if message.type == "error" and THEME_FIRST_VISIT_MESSAGE not in message.text:
            self.messages.append(f"console {message.type}: {message.text}")


@pytest.mark.browser
def test_search_finds_accelerator(site_url, browser) -> None:
    page = browser.new_page()
    page.goto(urljoin(site_url, "search.html?q=accelerator"), wait_until="load")
    page.wait_for_selector("#search-results ul.search li", timeout=30_000)
    results = page.locator("#search-results ul.search li a").all_inner_texts()
    page.close()
    assert results, "the search page found nothing for 'accelerator'"
    assert any("device" in text.lower() for text in results), results


def test_chapter_pages_offer_the_notebook_download(built_site: Path) -> None:
    html = (built_site / CHAPTER_1).read_text(encoding="utf-8")
    assert "01_device_agnostic_basics.ipynb" in html, "no download link for the .ipynb"


def _linked(site: Path, page: str, suffix: str) -> Path:
    """The one file with `suffix` that `page` links to, resolved inside the built site."""
    (reference,) = {r for r in _parse(site / page).references if urlparse(r).path.endswith(suffix)}
    return ((site / page).parent / unquote(urlparse(reference).path)).resolve()


@pytest.mark.parametrize("chapter", [CHAPTER_1, "notebooks/17_padding_and_bucketing.html"])
def test_the_downloaded_notebook_is_valid_says_what_it_needs_and_shows_numbers(
    built_site: Path, chapter: str
) -> None:
    notebook = nbformat.read(_linked(built_site, chapter, ".ipynb"), as_version=4)
    nbformat.validate(notebook)
    assert notebook.cells[0].source.startswith("> *Downloaded from the TPU-ready PyTorch site.*")
    assert "workshop bundle" in notebook.cells[0].source.splitlines()[0]
    markdown = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
    assert "{glue" not in markdown


WORKSHOP_PAGE = "book/workshop/index.html"
BUNDLE_SETUP_CHECK = "notebooks/00_setup_check.ipynb"  # the bundle's `make check` runs it


def test_until_the_repository_has_an_address_setup_offers_the_bundle(built_site: Path) -> None:
    """_config.yml names no repository yet: no clone command, no buttons, the bundle instead."""
    setup = "book/setup.html"
    assert _linked(built_site, setup, ".zip") == _linked(built_site, WORKSHOP_PAGE, ".zip")
    assert _linked(built_site, setup, ".zip").is_file()
    html = (built_site / setup).read_text(encoding="utf-8")
    assert "git clone" not in html
    assert "/issues/new" not in html and "/edit/" not in html


@pytest.fixture(scope="session")
def unpacked_bundle(built_site: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundle the workshop page links to, unpacked as a learner would."""
    archive = _linked(built_site, WORKSHOP_PAGE, ".zip")
    target = tmp_path_factory.mktemp("bundle")
    with zipfile.ZipFile(archive) as bundle:
        assert bundle.testzip() is None
        bundle.extractall(target)
    return target / "tpuready-workshop"


def test_the_bundle_holds_what_a_room_needs(unpacked_bundle: Path) -> None:
    names = {path.name for path in unpacked_bundle.iterdir()}
    assert {"Makefile", "README.md", "requirements.txt", "fill_wheelhouse.py", "site"} <= names
    assert (unpacked_bundle / "requirements.txt").read_text() == (
        REPOSITORY / "requirements.txt"
    ).read_text()
    chapters = sorted(p.name for p in (unpacked_bundle / "notebooks").glob("*.ipynb"))
    assert chapters == sorted(p.name for p in (REPOSITORY / "notebooks").glob("*.ipynb"))
    for folder in ("workers", "data", "examples"):
        assert any((unpacked_bundle / "notebooks" / folder).iterdir()), folder
    assert (unpacked_bundle / "site" / "index.html").is_file()
    assert not (unpacked_bundle / "site" / "downloads").exists()  # no bundle in the bundle


def test_the_bundle_setup_check_passes_unpacked_with_no_network(unpacked_bundle: Path) -> None:
    """The bundle's own `make check` command, run with its wheel's tpuready, offline."""
    (wheel,) = unpacked_bundle.glob("tpuready-*-py3-none-any.whl")
    # A wheel is a zip that Python imports from: the bundle's tpuready, not the checkout's.
    env = dict(os.environ, PYTHONPATH=str(wheel), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop("VIRTUAL_ENV", None)
    python = str(Path(sys.executable))
    no_network = str(REPOSITORY / "scripts" / "no_network")
    where = subprocess.run(
        [no_network, python, "-c", "import tpuready.runtime.setup_check as m; print(m.__file__)"],
        cwd=unpacked_bundle,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert where.stdout.strip().startswith(str(wheel)), where.stdout + where.stderr
    check = subprocess.run(
        [
            no_network,
            python,
            "-m",
            "tpuready.runtime.setup_check",
            "--notebook",
            BUNDLE_SETUP_CHECK,
        ],
        cwd=unpacked_bundle,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.startswith("PASS"), check.stdout


HANDOUTS = [
    f"book/workshop/handouts/{name}.html"
    for name in ("part1-device-agnostic", "part2-sharding", "part3-shapes")
]
SCREENSHOT_PAGES = {
    "home": "index.html",
    "chapter-01": CHAPTER_1,  # one chapter per part
    "chapter-08": "notebooks/08_meshes_and_dtensor.html",
    "chapter-17": "notebooks/17_padding_and_bucketing.html",
    "workshop": WORKSHOP_PAGE,
    **{f"handout-{path.split('/')[-1][:5]}": path for path in HANDOUTS},
}


@pytest.mark.browser
@pytest.mark.parametrize("width", [DESKTOP_WIDTH, PHONE_WIDTH])
@pytest.mark.parametrize("name", SCREENSHOT_PAGES)
def test_screenshot_for_a_person_to_look_at(site_url, browser, name, width) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": width, "height": 900})
    refuse_other_hosts(page, site_url)
    page.goto(urljoin(site_url, SCREENSHOT_PAGES[name]), wait_until="networkidle")
    title = page.title()
    target = SCREENSHOTS / f"{name}-{'desktop' if width == DESKTOP_WIDTH else 'phone'}.png"
    page.screenshot(path=str(target), full_page=False)
    page.close()
    assert "TPU-ready PyTorch" in title
    assert target.stat().st_size > 20_000, "the screenshot looks blank"


@pytest.mark.browser
@pytest.mark.parametrize("paper", ["A4", "Letter"])
@pytest.mark.parametrize("handout", HANDOUTS)
def test_each_handout_prints_to_one_page(site_url, browser, handout: str, paper: str) -> None:
    page = browser.new_page()
    refuse_other_hosts(page, site_url)
    page.goto(urljoin(site_url, handout), wait_until="networkidle")
    pdf = page.pdf(format=paper, print_background=True)
    printed_text = page.evaluate("document.querySelector('.handout').innerText")
    page.close()
    assert len(re.findall(rb"/Type\s*/Page\b", pdf)) == 1
    assert len(printed_text) > 1500, "the handout printed (almost) nothing"
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    (SCREENSHOTS / f"{Path(handout).stem}-{paper}.pdf").write_bytes(pdf)


def test_handouts_hold_no_maintainer_notes(built_site: Path) -> None:
    for handout in HANDOUTS:
        source = (REPOSITORY / handout.replace(".html", ".md")).read_text()
        assert not re.search(r"[Rr]egenerate|make notebooks|CONTRIBUTING|tests/", source), handout


@pytest.mark.browser
def test_a_solution_dropdown_opens_on_the_site(site_url, browser) -> None:
    page = browser.new_page(viewport={"width": DESKTOP_WIDTH, "height": 900})
    try:
        page.goto(urljoin(site_url, CHAPTER_1), wait_until="load")
        dropdown = page.locator("details", has_text="Show the solution").first
        code = dropdown.locator("pre").first
        assert not code.is_visible()
        dropdown.locator("summary").click()
        code.wait_for(state="visible", timeout=10_000)
        assert "def " in code.inner_text()
    finally:
        page.close()


def chapter_pages(site: Path) -> list[str]:
    """Site-relative paths of every page a reader reads (chapters and book pages)."""
    return [
        path.relative_to(site).as_posix()
        for path in site_pages(site)
        if path.relative_to(site).parts[0] in {"notebooks", "book"}
    ]


@pytest.mark.browser
def test_math_renders_with_no_network(site_url, browser) -> None:
    """MathJax comes from the site itself: with every other host refused, formulas render."""
    page = browser.new_page()
    refused = refuse_other_hosts(page, site_url)
    page.goto(urljoin(site_url, CHAPTER_5), wait_until="networkidle")
    math = page.locator(".bd-article .math")
    assert math.count() > 0, f"no math on {CHAPTER_5}: pick a page with formulas"
    typeset = "() => Array.from(document.querySelectorAll('.bd-article .math'))" + (
        ".every(element => element.querySelector('mjx-container'))"
    )
    with contextlib.suppress(PlaywrightTimeoutError):  # the asserts below say what is missing
        page.wait_for_function(typeset, timeout=30_000)
    untypeset = page.locator(".bd-article .math:not(:has(mjx-container))").all_inner_texts()
    errors = page.locator(".bd-article mjx-merror").count()
    widths = page.locator(".bd-article mjx-container").evaluate_all(
        "elements => elements.map(element => element.getBoundingClientRect().width)"
    )
    page.close()
    assert refused == set(), f"the page asked other hosts: {sorted(refused)}"
    assert untypeset == [], f"formulas left as raw TeX: {untypeset[:5]}"
    assert errors == 0, "MathJax could not typeset some TeX"
    assert min(widths) > 0, "a formula rendered with no width (fonts missing?)"


# Everything that scrolls sideways on a page. `inputs` and `outputs` are code cells whose
# `<pre>` is wider than its box; `page` is the document's own width against the viewport's.
MEASURE_OVERFLOW = """() => {
  const label = element => element.innerText.split("\\n")[0].slice(0, 80);
  const wider = selector => Array.from(document.querySelectorAll(selector))
    .filter(element => element.scrollWidth > element.clientWidth)
    .map(element => `${element.scrollWidth} > ${element.clientWidth}: ${label(element)}`);
  const root = document.documentElement;
  return {
    page: root.scrollWidth > root.clientWidth ? [`${root.scrollWidth} > ${root.clientWidth}`] : [],
    inputs: wider(".bd-article div.cell_input pre"),
    outputs: wider(".bd-article div.cell_output pre"),
    blocks: wider(".bd-article pre").filter((_, index) =>
      !document.querySelectorAll(".bd-article pre")[index].closest(".cell")),
  };
}"""


# Colour contrast is four fifths of axe's time on a long chapter (every highlighted token is
# checked). The colours come from the theme's and Pygments' style sheets, the same on every
# page of a kind at every width, so contrast runs on one page of each kind at desktop width:
# prose, a chapter with every code style, a generated table, the workshop's tables, a handout.
CONTRAST_PAGES = {
    "book/intro.html",
    "notebooks/17_padding_and_bucketing.html",
    "notebooks/reference_hardware.html",
    WORKSHOP_PAGE,
    HANDOUTS[0],
}


def serious_violations(axe: Axe, page: Page, relative: str, width: int) -> list[str]:
    """axe-core's serious and critical findings on the open page (contrast on CONTRAST_PAGES)."""
    if relative == "index.html":  # only a redirect to book/intro.html, checked itself
        return []
    contrast = width == DESKTOP_WIDTH and relative in CONTRAST_PAGES
    options = {"resultTypes": ["violations"], "rules": {"color-contrast": {"enabled": contrast}}}
    return [
        f"{violation['id']}: {[node['target'] for node in violation['nodes'][:3]]}"
        for violation in axe.run(page, options=options).response["violations"]
        if violation["impact"] in ("serious", "critical")
    ]


BROKEN_IMAGES = (
    "() => Array.from(document.images).filter(i => i.complete && i.naturalWidth === 0)"
    ".map(i => i.src)"
)


@dataclasses.dataclass
class PageVisit:
    """What one visit to a page found, for each check that reads it."""

    problems: list[str]  # console errors, failed requests, broken images, other hosts asked
    overflow: dict[str, list[str]] | None  # MEASURE_OVERFLOW's; None off the reader's pages
    violations: list[str]  # axe's serious and critical findings


@functools.cache
def _axe() -> Axe:
    """axe-core, read from axe-playwright-python's bundle once per session."""
    return Axe()


def visit(
    page: Page, site_url: str, relative: str, width: int, measure_overflow: bool
) -> PageVisit:
    """Open one page and read what every check needs from it."""
    problems = PageProblems(page, site_url)
    # networkidle: index.html redirects to the introduction, search loads its index, and the
    # layout measured below is the one with fonts and math in.
    page.goto(urljoin(site_url, relative), wait_until="networkidle")
    found = list(problems.messages)  # before axe runs its own script in the page
    found += [f"image did not load: {src}" for src in page.evaluate(BROKEN_IMAGES)]
    found += [f"asked a host other than the site: {host}" for host in problems.external_hosts]
    return PageVisit(
        problems=sorted(found),
        overflow=page.evaluate(MEASURE_OVERFLOW) if measure_overflow else None,
        violations=serious_violations(_axe(), page, relative, width),
    )


@pytest.fixture(scope="session")
def survey(built_site, site_url, browser) -> Callable[[int], dict[str, PageVisit]]:
    """`survey(width)`: every page visited once at `width`, for the checks to share the visit.

    Opening a page is about half of each check's time. A page that cannot be visited is a
    problem of that page (the console check names it), and the others are still visited.
    """
    readers_pages = set(chapter_pages(built_site))

    @functools.cache
    def visit_every_page(width: int) -> dict[str, PageVisit]:
        context = browser.new_context(viewport={"width": width, "height": 900})
        visits = {}
        try:
            for path in site_pages(built_site):
                relative = path.relative_to(built_site).as_posix()
                page = context.new_page()
                try:
                    visits[relative] = visit(
                        page, site_url, relative, width, relative in readers_pages
                    )
                except PlaywrightError as error:
                    visits[relative] = PageVisit([f"could not be visited: {error}"], None, [])
                finally:
                    page.close()
        finally:
            context.close()
        return visits

    return visit_every_page


def _report(found: dict[str, list[str]]) -> str:
    return "\n".join(f"{where}: {line}" for where, lines in found.items() for line in lines)


def _overflow(visits: dict[str, PageVisit]) -> dict[str, dict[str, list[str]]]:
    """What scrolls sideways on each of the reader's pages."""
    found = {page: visit.overflow for page, visit in visits.items() if visit.overflow is not None}
    assert found, "no page measured"
    return found


class EveryPageAtOneWidth:
    """The checks that read one visit of every page at the subclass's `width`.

    `make site` runs `--dist loadscope`, which keeps a class's tests on one xdist worker: the
    class's first test runs the survey (in its setup, which `--durations` then shows), and the
    others read it.
    """

    width: int

    @pytest.fixture(scope="class")
    @classmethod
    def visits(cls, survey: Callable[[int], dict[str, PageVisit]]) -> dict[str, PageVisit]:
        """Every page's visit at this class's width."""
        visits = survey(cls.width)
        assert visits, "no page visited"
        return visits

    @pytest.mark.browser
    def test_every_page_opens_without_console_errors(self, visits: dict[str, PageVisit]) -> None:
        """No console error, failed request, broken image or other host asked, on any page."""
        assert {page: visit.problems for page, visit in visits.items() if visit.problems} == {}

    @pytest.mark.browser
    def test_no_page_pans_sideways(self, visits: dict[str, PageVisit]) -> None:
        """Long inline code wraps and wide tables scroll in their box: the page never pans."""
        found = _overflow(visits)
        panning = {page: overflow["page"] for page, overflow in found.items() if overflow["page"]}
        assert panning == {}, _report(panning)

    @pytest.mark.browser
    def test_axe_finds_no_serious_accessibility_violation(
        self, visits: dict[str, PageVisit]
    ) -> None:
        """axe-core (bundled by axe-playwright-python) on every page: nothing serious."""
        assert {page: visit.violations for page, visit in visits.items() if visit.violations} == {}
        # The pages the contrast rule runs on (at desktop width) are pages of the site.
        assert set(visits) >= CONTRAST_PAGES


class TestEveryPageOnADesktop(EveryPageAtOneWidth):
    width = DESKTOP_WIDTH

    @pytest.mark.browser
    def test_code_cells_fit_the_column(self, visits: dict[str, PageVisit]) -> None:
        """At 1280 px no code cell's input or output scrolls sideways (79-character lines)."""
        scrolling = {
            f"{page} {kind}": overflow[kind]
            for page, overflow in _overflow(visits).items()
            for kind in ("inputs", "outputs")
            if overflow[kind]
        }
        assert scrolling == {}, _report(scrolling)

    @pytest.mark.browser
    def test_code_blocks_of_prose_pages_fit_the_column(self, visits: dict[str, PageVisit]) -> None:
        """The shell and code blocks of prose pages (setup, workshop, handouts) do not scroll."""
        found = _overflow(visits)
        scrolling = {
            page: overflow["blocks"] for page, overflow in found.items() if overflow["blocks"]
        }
        assert scrolling == {}, _report(scrolling)


class TestEveryPageOnAPhone(EveryPageAtOneWidth):
    width = PHONE_WIDTH


# Put one line of `length` characters into a copy of the page's first code input and first
# text output, and report whether each copy scrolls sideways.
LINE_SCROLLS = """length => {
  const line = "x = [" + "1, ".repeat(length);
  const scrolls = selector => {
    const original = document.querySelector(selector);
    if (!original) return null;
    const copy = original.cloneNode(false);
    copy.textContent = line.slice(0, length);
    original.parentElement.appendChild(copy);
    const result = copy.scrollWidth > copy.clientWidth;
    copy.remove();
    return result;
  };
  return {
    input: scrolls(".bd-article div.cell_input pre"),
    output: scrolls(".bd-article div.cell_output pre"),
  };
}"""


@pytest.mark.browser
def test_a_79_character_line_fits_a_code_cell_at_desktop_width(site_url, browser) -> None:
    """The CSS promise behind the notebooks' line length, checked on chapter 1's cells."""
    page = browser.new_page(viewport={"width": DESKTOP_WIDTH, "height": 900})
    refuse_other_hosts(page, site_url)
    page.goto(urljoin(site_url, CHAPTER_1), wait_until="networkidle")
    fits = page.evaluate(LINE_SCROLLS, CODE_LINE_LENGTH)
    too_long = page.evaluate(LINE_SCROLLS, CODE_LINE_LENGTH + 25)
    page.close()
    assert fits == {"input": False, "output": False}, fits
    # The measurement can fail: a 104-character line does not fit (code does not wrap).
    assert too_long == {"input": True, "output": True}, too_long


@pytest.mark.browser
def test_wide_tables_scroll_inside_their_own_box(site_url, browser) -> None:
    """On a phone, chapter 1's tables are wider than the column and scroll in a box."""
    page = browser.new_page(viewport={"width": PHONE_WIDTH, "height": 900})
    refuse_other_hosts(page, site_url)
    page.goto(urljoin(site_url, CHAPTER_1), wait_until="networkidle")
    boxes = page.locator(".bd-article table").evaluate_all(
        """tables => tables.map(table => {
          const box = table.parentElement;
          return {
            wider: table.scrollWidth > box.clientWidth,
            scrolls: ["auto", "scroll"].includes(getComputedStyle(box).overflowX),
            fitsPage: box.getBoundingClientRect().right <= document.documentElement.clientWidth,
          };
        })"""
    )
    page.close()
    assert any(box["wider"] for box in boxes), "no table wider than a phone: nothing to check"
    assert all(box["scrolls"] and box["fitsPage"] for box in boxes if box["wider"]), boxes


TABLET_WIDTH = 900  # under the theme's 992 px breakpoint: the sidebars open as drawers


def _the_visible(page, selector: str):  # type: ignore[no-untyped-def]
    """The one element matching `selector` that a reader can see (the theme has its toggles
    bind to the first match in the page, so a hidden twin would take their clicks)."""
    matches = page.locator(selector)
    visible = [matches.nth(i) for i in range(matches.count()) if matches.nth(i).is_visible()]
    assert len(visible) == 1, f"{len(visible)} visible {selector} of {matches.count()}"
    assert matches.count() == 1, f"{matches.count()} {selector} in the page, one hidden"
    return visible[0]


@pytest.mark.parametrize("width", [PHONE_WIDTH, TABLET_WIDTH])
@pytest.mark.parametrize(
    ("toggle", "drawer"),
    [
        (".primary-toggle", "#pst-primary-sidebar-modal"),
        (".secondary-toggle", "#pst-secondary-sidebar-modal"),
    ],
)
def test_each_toggle_opens_and_closes_its_drawer_on_a_small_screen(
    site_url, browser, width: int, toggle: str, drawer: str
) -> None:
    page = browser.new_page(viewport={"width": width, "height": 800})
    try:
        page.goto(urljoin(site_url, CHAPTER_1), wait_until="load")
        _the_visible(page, toggle).click()
        page.wait_for_selector(f"{drawer}[open]", timeout=10_000)
        assert page.locator(f"{drawer} a").count() > 0, "the drawer opened empty"
        page.keyboard.press("Escape")
        page.wait_for_selector(f"{drawer}:not([open])", state="attached", timeout=10_000)
    finally:
        page.close()


def test_the_navigation_toggle_hides_and_shows_the_sidebar_on_a_desktop(site_url, browser) -> None:
    page = browser.new_page(viewport={"width": DESKTOP_WIDTH, "height": 800})
    try:
        page.goto(urljoin(site_url, CHAPTER_1), wait_until="load")
        sidebar = page.locator("#pst-primary-sidebar")
        assert sidebar.is_visible()
        toggle = _the_visible(page, ".primary-toggle")
        toggle.click()
        sidebar.wait_for(state="hidden", timeout=10_000)  # it slides out
        toggle.click()
        sidebar.wait_for(state="visible", timeout=10_000)
        # No empty band above the article: the theme's top bar is gone, not just emptied.
        assert page.locator("#pst-header .bd-header__inner").count() == 0
    finally:
        page.close()


def test_the_mapping_page_shows_every_entry_of_the_toolkits_table(built_site: Path) -> None:
    """Generated from tpuready.accelerator_api when the site builds, so it cannot drift."""
    from tpuready.accelerator_api import CUDA_TO_ACCELERATOR

    page = (built_site / "book/reference/cuda-to-accelerator.html").read_text(encoding="utf-8")
    text = re.sub(r"<[^>]+>", "", page)
    missing = [e.cuda_call for e in CUDA_TO_ACCELERATOR if f"{e.cuda_call} → " not in text]
    assert missing == []


def test_each_notebook_page_says_when_it_was_last_verified(built_site: Path) -> None:
    """The line under the title comes from the records, as the verification page does."""
    from tpuready.pages.verification import load_records, stamp

    records = load_records(REPOSITORY / "verification")
    for path in sorted((REPOSITORY / "notebooks").glob("*.ipynb")):
        page = (built_site / "notebooks" / f"{path.stem}.html").read_text(encoding="utf-8")
        found = re.search(r'<p class="verified-stamp">(.*?)<a [^>]*href="([^"]+)"', page, re.S)
        assert found, f"{path.name}: no verification line"
        assert " ".join(found.group(1).split()) == stamp(records, path.stem), path.name
        assert found.group(2) == "../book/verification.html"
