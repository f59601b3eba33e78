"""Build the book with zero warnings, then check the site as a reader's browser sees it.

Runs Debian's Chromium (installed by `make test`) through playwright against the site served
over http on 127.0.0.1. Screenshots land in `_build/screenshots/` for a person to look at.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urljoin, urlparse

import pytest
from conftest import REPOSITORY

SITE = REPOSITORY / "_build" / "html"
SCREENSHOTS = REPOSITORY / "_build" / "screenshots"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
BUILD_BUDGET_SECONDS = 60.0
CHAPTER_1 = "notebooks/01_device_agnostic_basics.html"
# External hosts a page may ask for; the test answers them with an empty body, since the
# machine is offline. MathJax renders the book's formulas from its CDN in a reader's browser.
ALLOWED_EXTERNAL_HOSTS = {"cdn.jsdelivr.net"}
# Logged by the theme's dark-mode switch on a first visit, before it stores a mode; the
# theme recovers by itself ("Resetting to auto"). Every other console message is an error.
THEME_FIRST_VISIT_MESSAGE = "Got invalid theme mode"


@pytest.fixture(scope="session")
def built_site() -> Path:
    """Build the book as `make book` does, and fail on any warning."""
    jupyter_book = Path(os.environ.get("VIRTUAL_ENV", REPOSITORY / ".venv")) / "bin/jupyter-book"
    shutil.rmtree(SITE.parent, ignore_errors=True)
    started = time.perf_counter()
    result = subprocess.run(
        [str(jupyter_book), "build", str(REPOSITORY), "-W", "-n", "--keep-going"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.perf_counter() - started
    log = result.stdout + result.stderr
    warnings = [line for line in log.splitlines() if re.search(r"\b(WARNING|ERROR)\b", line)]
    assert warnings == [], "\n".join(warnings)
    assert result.returncode == 0, log[-4000:]
    print(f"book built in {seconds:.1f} s")
    assert seconds <= BUILD_BUDGET_SECONDS, f"the book build took {seconds:.1f} s"
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

    def handle_starttag(self, tag: str, attributes: list[tuple[str, str | None]]) -> None:
        values = dict(attributes)
        if values.get("id"):
            self.ids.add(values["id"] or "")
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
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture(scope="session")
def browser():
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


class PageProblems:
    """Console errors, page errors, failed requests and unexpected hosts seen by one page."""

    def __init__(self, page, site_url: str) -> None:
        self.messages: list[str] = []
        self.external_hosts: set[str] = set()
        site_host = urlparse(site_url).netloc
        page.on("console", self._on_console)
        page.on("pageerror", lambda error: self.messages.append(f"page error: {error}"))
        page.on("requestfailed", lambda r: self.messages.append(f"request failed: {r.url}"))
        page.on(
            "response",
            lambda r: r.status >= 400 and self.messages.append(f"HTTP {r.status}: {r.url}"),
        )

        def route(route_request) -> None:
            host = urlparse(route_request.request.url).netloc
            if host == site_host or route_request.request.url.startswith("data:"):
                route_request.continue_()
            else:
                self.external_hosts.add(host)
                route_request.fulfill(status=200, body="", content_type="text/plain")

        page.route("**/*", route)

    def _on_console(self, message) -> None:
        if message.type == "error" and THEME_FIRST_VISIT_MESSAGE not in message.text:
            self.messages.append(f"console {message.type}: {message.text}")


def test_every_page_opens_without_console_errors(built_site, site_url, browser) -> None:
    context = browser.new_context()
    problems_by_page = {}
    for path in site_pages(built_site):
        relative = path.relative_to(built_site).as_posix()
        page = context.new_page()
        problems = PageProblems(page, site_url)
        # networkidle: index.html redirects to the introduction, and search loads its index.
        page.goto(urljoin(site_url, relative), wait_until="networkidle")
        broken_images = page.evaluate(
            "Array.from(document.images).filter(i => i.complete && i.naturalWidth === 0)"
            ".map(i => i.src)"
        )
        problems.messages += [f"image did not load: {src}" for src in broken_images]
        unexpected = problems.external_hosts - ALLOWED_EXTERNAL_HOSTS
        problems.messages += [f"asked an unexpected external host: {h}" for h in unexpected]
        if problems.messages:
            problems_by_page[relative] = problems.messages
        page.close()
    context.close()
    assert problems_by_page == {}


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


@pytest.mark.parametrize(("name", "relative"), [("home", "index.html"), ("chapter-01", CHAPTER_1)])
def test_screenshot_for_a_person_to_look_at(site_url, browser, name, relative) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.goto(urljoin(site_url, relative), wait_until="networkidle")
    title = page.title()
    target = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(target), full_page=False)
    page.close()
    assert "TPU-ready PyTorch" in title
    assert target.stat().st_size > 20_000, "the screenshot looks blank"
