"""Citations in round brackets, and a bibliography list that screen readers can walk.

sphinxcontrib-bibtex's `author_year` style puts the year in square brackets
("Shoeybi et al. [2019]"). This registers `author_year_round`, the same style with round
brackets, which `_config.yml` selects (`bibtex_reference_style`). The learners' notebooks
write their citations the same way (book/_ext/workshop_bundle.py).

Docutils writes the entries as `role="doc-biblioentry"` inside a `role="list"`: DPUB-ARIA 1.1
deprecated that role, and a list whose children are not list items is a serious violation for
axe-core (aria-required-children). Each entry is written as `role="listitem"` instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sphinxcontrib.bibtex.plugin import register_plugin
from sphinxcontrib.bibtex.style.referencing import BracketStyle
from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle

STYLE_NAME = "author_year_round"


def _round() -> BracketStyle:
    return BracketStyle(left="(", right=")")


@dataclasses.dataclass
class RoundAuthorYearStyle(AuthorYearReferenceStyle):
    """`author_year` with round brackets for every kind of citation."""

    bracket_textual: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_parenthetical: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_author: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_label: BracketStyle = dataclasses.field(default_factory=_round)
    bracket_year: BracketStyle = dataclasses.field(default_factory=_round)


def _entries_as_list_items(
    app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    if "body" in context:
        context["body"] = context["body"].replace('role="doc-biblioentry"', 'role="listitem"')


def setup(app: Any) -> dict[str, Any]:
    # sphinxcontrib-bibtex looks the style up when the builder starts, after every setup().
    register_plugin("sphinxcontrib.bibtex.style.referencing", STYLE_NAME, RoundAuthorYearStyle)
    app.connect("html-page-context", _entries_as_list_items)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
