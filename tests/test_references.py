"""Glossary links and citations: every {term} and {cite} resolves, and nothing goes unused.

The site build checks the same resolution with warnings; these tests say which key is wrong in
a second, without a build, and check what a build cannot: that every glossary term is linked
from a chapter and every entry of the bibliography is cited.
"""

from __future__ import annotations

import re

import pytest
import yaml
from conftest import REPOSITORY, read_notebook
from pybtex.database import parse_file

GLOSSARY = REPOSITORY / "book" / "reference" / "glossary.md"
BIBLIOGRAPHY = REPOSITORY / "book" / "references.bib"
BIBLIOGRAPHY_PAGE = "book/reference/bibliography"
# {term}`MXU` or {term}`the mesh <device mesh>`; any {cite...} role, to check its kind too.
TERM_ROLE = re.compile(r"\{term\}`([^`]*)`")
CITE_ROLE = re.compile(r"\{cite(?::(\w+))?\}`([^`]*)`")
# The citation roles the learners' notebooks can write out (book/_ext/workshop_bundle.py).
CITE_KINDS = {"t", "p"}


def toc_entries() -> list[str]:
    toc = yaml.safe_load((REPOSITORY / "_toc.yml").read_text())
    return [chapter["file"] for part in toc["parts"] for chapter in part["chapters"]]


def chapter_entries() -> list[str]:
    """The chapters of parts I to III: numbered notebooks and the parts'
    opening pages."""
    return [entry for entry in toc_entries() if re.match(r"notebooks/\d\d_|book/part\d", entry)]


def markdown_of(entry: str) -> str:
    """The text a reader sees of a page or a notebook (its markdown cells)."""
    page = REPOSITORY / f"{entry}.md"
    if page.is_file():
        return page.read_text()
    notebook = read_notebook(REPOSITORY / f"{entry}.ipynb")
    return "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "markdown")


def all_markdown() -> dict[str, str]:
    """Every page and notebook of the book (the whole toc, the root included)."""
    toc = yaml.safe_load((REPOSITORY / "_toc.yml").read_text())
    return {entry: markdown_of(entry) for entry in [toc["root"], *toc_entries()]}


def glossary_terms() -> list[str]:
    block = GLOSSARY.read_text().split("```{glossary}\n", 1)[1].split("\n```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith(" ")]


def term_targets(markdown: str) -> list[str]:
    """The glossary term each {term} role links to."""
    targets = []
    for body in TERM_ROLE.findall(markdown):
        explicit = re.fullmatch(r"(.*?)\s*<([^<>]+)>", body, re.DOTALL)
        targets.append(explicit.group(2) if explicit else body)
    return targets


def citations(markdown: str) -> list[tuple[str, str]]:
    """(role kind, key) of every key every {cite} role names."""
    return [
        (kind, key.strip()) for kind, keys in CITE_ROLE.findall(markdown) for key in keys.split(",")
    ]


def bibliography() -> dict:
    return parse_file(str(BIBLIOGRAPHY)).entries


@pytest.mark.parametrize(
    ("markdown", "terms", "cited"),
    [
        ("the {term}`MXU` and {term}`a mesh <device mesh>`", ["MXU", "device mesh"], []),
        (
            "{cite:t}`a2020` and {cite:p}`b2021, c2022`",
            [],
            [("t", "a2020"), ("p", "b2021"), ("p", "c2022")],
        ),
        ("{term}`tensor\nparallelism <TP>`, {cite:p}`a2020`", ["TP"], [("p", "a2020")]),
    ],
)
def test_the_readers_find_roles_and_their_keys(markdown: str, terms: list, cited: list) -> None:
    assert term_targets(markdown) == terms
    assert citations(markdown) == cited


def test_every_term_link_names_a_glossary_term() -> None:
    # Sphinx looks terms up without case ("Shard" and "shard" are one term).
    known = {term.lower() for term in glossary_terms()}
    unknown = sorted(
        f"{entry}: {target}"
        for entry, markdown in all_markdown().items()
        for target in term_targets(markdown)
        if target.lower() not in known
    )
    assert unknown == []


def test_every_glossary_term_is_linked_from_a_chapter() -> None:
    linked = {
        target.lower() for entry in chapter_entries() for target in term_targets(markdown_of(entry))
    }
    assert len(chapter_entries()) >= 16
    assert [term for term in glossary_terms() if term.lower() not in linked] == []


def test_every_citation_names_an_entry_of_the_bibliography() -> None:
    entries = bibliography()
    wrong = sorted(
        f"{entry}: {{cite:{kind}}}`{key}`"
        for entry, markdown in all_markdown().items()
        for kind, key in citations(markdown)
        if key not in entries or kind not in CITE_KINDS
    )
    assert wrong == []


def test_every_entry_of_the_bibliography_is_cited() -> None:
    cited = {key for markdown in all_markdown().values() for _, key in citations(markdown)}
    assert sorted(set(bibliography()) - cited) == []


def test_every_paper_is_cited_in_a_further_reading_list() -> None:
    further_reading = "\n".join(
        markdown_of(entry).split("## Further reading", 1)[-1]
        for entry in chapter_entries()
        if "## Further reading" in markdown_of(entry)
    )
    cited = {key for _, key in citations(further_reading)}
    papers = {
        key for key, entry in bibliography().items() if "arxiv.org" in entry.fields.get("url", "")
    }
    papers |= {
        key for key, entry in bibliography().items() if entry.type in {"article", "inproceedings"}
    }
    assert len(papers) >= 10
    assert sorted(papers - cited) == []


def test_each_entry_says_what_and_where() -> None:
    incomplete = [
        key
        for key, entry in bibliography().items()
        if not entry.fields.get("title")
        or not entry.persons.get("author")
        or not (entry.fields.get("url") or entry.fields.get("note"))
    ]
    assert incomplete == []


def test_the_site_builds_the_bibliography_from_this_file() -> None:
    config = yaml.safe_load((REPOSITORY / "_config.yml").read_text())["sphinx"]
    bibfiles = [REPOSITORY / path for path in config["config"]["bibtex_bibfiles"]]
    assert bibfiles == [BIBLIOGRAPHY]
    assert "sphinxcontrib.bibtex" in config["extra_extensions"]
    assert BIBLIOGRAPHY_PAGE in toc_entries()
    assert "```{bibliography}" in (REPOSITORY / f"{BIBLIOGRAPHY_PAGE}.md").read_text()


def test_references_bib_has_no_at_sign_outside_its_entries() -> None:
    # BibTeX reads an @ anywhere, comments included, as the start of an entry.
    comments = [line for line in BIBLIOGRAPHY.read_text().splitlines() if line.startswith("%")]
    assert comments and not any("@" in line for line in comments)
