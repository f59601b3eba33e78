"""Citations in round brackets: "Shoeybi et al. (2019)" and "(Shoeybi et al., 2019)".

sphinxcontrib-bibtex's `author_year` style puts the year in square brackets
("Shoeybi et al. [2019]"). This registers `author_year_round`, the same style with round
brackets, which `_config.yml` selects (`bibtex_reference_style`). The learners' notebooks
write their citations the same way (book/_ext/workshop_bundle.py).
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


def setup(app: Any) -> dict[str, Any]:
    # sphinxcontrib-bibtex looks the style up when the builder starts, after every setup().
    register_plugin("sphinxcontrib.bibtex.style.referencing", STYLE_NAME, RoundAuthorYearStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
