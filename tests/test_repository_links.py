"""`repository: url:` drives the buttons and the {get-the-code} directive (book/_ext).

Each test builds a one-page site with the book's theme, so what it checks is the HTML a
reader gets, for the address set and unset.
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

import pytest
from conftest import REPOSITORY
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError

EXTENSIONS = REPOSITORY / "book/_ext"
URL = "https://github.com/example-org/tpu-ready-pytorch"


def _build(tmp_path: Path, url: str) -> str:
    """Build a page that holds the directive, with the book's theme; return its HTML."""
    source = tmp_path / "source"
    source.mkdir()
    (source / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(EXTENSIONS)!r})\n"
        "extensions = ['myst_parser', 'repository_links']\n"
        "html_theme = 'sphinx_book_theme'\n"
        f"html_theme_options = {{'repository_url': {url!r}, 'repository_branch': 'main'}}\n"
    )
    (source / "index.md").write_text("# Setup\n\n```{get-the-code}\n```\n")
    app = Sphinx(
        str(source), str(source), str(tmp_path / "html"), str(tmp_path / "doctrees"), "html",
        status=None, warning=None, freshenv=True,
    )  # fmt: skip
    app.build()
    return (tmp_path / "html/index.html").read_text(encoding="utf-8")


def _text(page: str) -> str:
    """What a reader sees: the page without its tags (highlighting splits a command up)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


@pytest.fixture(autouse=True)
def _forget_the_extension() -> None:
    """Each build imports book/_ext afresh, as jupyter-book does."""
    yield
    sys.modules.pop("repository_links", None)
    sys.path[:] = [entry for entry in sys.path if entry != str(EXTENSIONS)]


def test_with_an_address_the_page_clones_it_and_shows_the_buttons(tmp_path: Path) -> None:
    page = _build(tmp_path, URL)
    assert f"git clone {URL}.git\ncd tpu-ready-pytorch" in _text(page)
    assert "workshop bundle" not in _text(page)
    assert f'href="{URL}"' in page  # the repository button
    assert f"{URL}/issues/new" in page  # the issue button
    assert f"{URL}/edit/main/index.md" in page  # the edit button


def test_without_an_address_the_page_offers_the_bundle_and_no_button(tmp_path: Path) -> None:
    page = _build(tmp_path, "")
    assert 'href="downloads/tpuready-workshop.zip"' in page
    assert "names no public repository yet" in _text(page)
    assert "git clone" not in _text(page)
    assert "github.com" not in page
    assert "/issues/new" not in page


@pytest.mark.parametrize(
    "url",
    [
        "github.com/example-org/tpu-ready-pytorch",
        f"{URL}.git",
        f"{URL}/tree/main/notebooks",
        "git@github.com:example-org/tpu-ready-pytorch.git",
    ],
)
def test_an_address_that_is_not_a_repository_page_is_refused_by_value(
    tmp_path: Path, url: str
) -> None:
    with pytest.raises(ExtensionError, match=re.escape("https://github.com/OWNER/NAME")) as raised:
        _build(tmp_path, url)
    assert repr(url) in str(raised.value)


def test_the_book_names_no_address_yet_and_its_setup_page_uses_the_directive() -> None:
    """The shipped setting is empty: the site offers the bundle (tests/test_site.py sees it)."""
    config = (REPOSITORY / "_config.yml").read_text()
    assert '\nrepository:\n  url: ""\n' in config
    assert "use_repository_button" not in config  # the address alone drives the buttons
    assert "```{get-the-code}" in (REPOSITORY / "book/setup.md").read_text()
