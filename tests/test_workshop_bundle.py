"""The learners' notebooks, the workshop bundle's pieces and the offline wheelhouse.

The bundle the site links to is checked whole, unpacked and run offline, in test_site.py.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import nbformat
import pytest
from conftest import NOTEBOOK_DIR, REPOSITORY, all_notebook_paths, read_notebook
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tpuready.runtime.setup_check import read_pins


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


bundle = _load("workshop_bundle", REPOSITORY / "book/_ext/workshop_bundle.py")
wheelhouse = _load("fill_wheelhouse", REPOSITORY / "scripts/workshop_bundle/fill_wheelhouse.py")


def _glued(name: str, text: str) -> dict:
    return nbformat.v4.new_output(
        "display_data",
        data={bundle.GLUE_PREFIX + "text/plain": text},
        metadata={"scrapbook": {"name": name, "mime_prefix": bundle.GLUE_PREFIX}},
    )


def _notebook() -> nbformat.NotebookNode:
    glue_cell = nbformat.v4.new_code_cell("glue(...)")
    glue_cell.outputs = [_glued("ch00_ratio", "0.83251"), _glued("ch00_name", "'v5e'")]
    prose = "Padding costs {glue:text}`ch00_ratio:.1%` on {glue:text}`ch00_name`."
    return nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_markdown_cell("# Title"),
            glue_cell,
            nbformat.v4.new_markdown_cell(prose),
        ]
    )


def test_glue_references_become_the_values_the_site_shows() -> None:
    learner = bundle.learner_notebook(_notebook(), "ch00.ipynb")
    assert learner.cells[2].source == "Padding costs 83.3% on v5e."


def test_a_reference_without_a_glued_value_names_the_key_and_the_fix() -> None:
    notebook = _notebook()
    notebook.cells[2].source = "{glue:text}`ch00_missing:.2f`"
    with pytest.raises(KeyError, match=r"ch00\.ipynb.*ch00_missing.*make notebooks"):
        bundle.learner_notebook(notebook, "ch00.ipynb")


def test_the_download_note_opens_the_notebook_once() -> None:
    once = bundle.learner_notebook(_notebook(), "ch00.ipynb", note="> Needs X.")
    twice = bundle.learner_notebook(once, "ch00.ipynb", note="> Needs X.")
    assert once.cells[0].source == "> Needs X.\n\n# Title"
    assert twice.cells[0].source == once.cells[0].source


def test_the_source_notebook_is_left_unchanged() -> None:
    notebook = _notebook()
    bundle.learner_notebook(notebook, "ch00.ipynb", note="> Needs X.")
    assert notebook.cells[0].source == "# Title"
    assert "{glue:text}" in notebook.cells[2].source


BIB = """
@misc{one2019, author = {Yang, Edward}, title = {A}, year = {2019}, url = {https://a.example/}}
@misc{two2026, author = {Google and Meta}, title = {B}, year = {2026}}
@misc{many2021, author = {Krell, Mario and Kosec, Matej and Perez, Sergio}, title = {C},
  year = {2021}, url = {https://c.example/}}
@misc{some2022, author = {Chowdhery, Aakanksha and others}, title = {D}, year = {2022}}
@misc{org, author = {{Google Cloud}}, title = {E}, url = {https://e.example/}}
"""


@pytest.fixture
def references(tmp_path: Path) -> dict:
    bibfile = tmp_path / "references.bib"
    bibfile.write_text(BIB)
    return bundle.read_references(bibfile)


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        ("{cite:t}`one2019` wrote", "[Yang (2019)](https://a.example/) wrote"),
        ("as shown {cite:p}`one2019`.", "as shown ([Yang, 2019](https://a.example/))."),
        ("{cite:t}`two2026`", "Google and Meta (2026)"),
        ("{cite:t}`many2021`", "[Krell et al. (2021)](https://c.example/)"),
        ("{cite:p}`some2022`", "(Chowdhery et al., 2022)"),
        ("{cite:p}`org`", "([Google Cloud, n.d.](https://e.example/))"),
        (
            "{cite:p}`one2019, some2022`",
            "([Yang, 2019](https://a.example/); Chowdhery et al., 2022)",
        ),
    ],
)
def test_citations_become_author_and_year_linked_to_the_work(
    references: dict, markdown: str, expected: str
) -> None:
    # As the site writes them (sphinxcontrib-bibtex, author_year_round): "et al." from three
    # authors or "others", an organisation as it is written, "n.d." with no year.
    assert bundle.render_citations(markdown, references, "ch00.ipynb") == expected


def test_a_citation_without_an_entry_names_the_key_and_the_file(references: dict) -> None:
    with pytest.raises(KeyError, match=r"ch00\.ipynb.*nobody2020.*references\.bib"):
        bundle.render_citations("{cite:t}`nobody2020`", references, "ch00.ipynb")


def test_glossary_terms_become_the_text_the_site_shows() -> None:
    markdown = "the {term}`MXU`, four {term}`ranks <rank>` and {term}`tensor\nparallelism <TP>`"
    assert bundle.render_terms(markdown) == "the MXU, four ranks and tensor\nparallelism"


@pytest.mark.parametrize("path", all_notebook_paths(), ids=lambda path: path.name)
def test_every_learner_notebook_shows_numbers_not_keys(path: Path) -> None:
    learner = bundle.learner_notebook(read_notebook(path), path.name)
    markdown = "\n".join(cell.source for cell in learner.cells if cell.cell_type == "markdown")
    assert "{glue" not in markdown
    # Lab shows a citation as its key, "Citation Not Found", and a term as a link to nowhere.
    assert "{cite" not in markdown and "{term}" not in markdown
    nbformat.validate(learner)


# A package import (`from workers.ch09_ddp import ...`) or a path (`data/tiny_corpus.txt`).
FOLDER_USE = re.compile(r"\b(?:from|import) (\w+)\.\w+|[\"'/](\w+)/[\w.]+\.(?:py|txt)\b")


def test_the_bundle_carries_every_folder_a_notebook_imports_or_reads() -> None:
    """A notebook that imports workers.X or reads data/X needs that folder in the bundle."""
    used = set()
    for path in all_notebook_paths():
        for cell in read_notebook(path).cells:
            if cell.cell_type == "code":
                for match in FOLDER_USE.finditer(cell.source):
                    folder = match.group(1) or match.group(2)
                    if (NOTEBOOK_DIR / folder).is_dir():
                        used.add(folder)
    assert {"workers", "data"} <= used  # the search finds the folders it must
    assert used <= set(bundle.NOTEBOOK_FOLDERS)


def _pins() -> dict[str, str]:
    """The pins by normalized name, read as the set-up check reads them."""
    return read_pins(REPOSITORY / "requirements.txt")


def test_the_pins_hold_every_dependency_of_every_pin() -> None:
    """An offline wheelhouse holds exactly the pins: a dependency left out stops `make venv`."""
    pins = _pins()
    unpinned = set()
    for name in pins:
        for requirement in importlib.metadata.requires(name) or []:
            parsed = Requirement(requirement)
            if parsed.marker is not None and not parsed.marker.evaluate({"extra": ""}):
                continue
            needed = canonicalize_name(parsed.name)
            if needed not in pins:
                unpinned.add(f"{needed} (for {name})")
    assert unpinned == set()


def test_the_wheelhouse_takes_torch_from_the_cpu_index_on_linux_only(tmp_path: Path) -> None:
    requirements = REPOSITORY / "requirements.txt"
    torch_pin = f"torch=={_pins()['torch']}"
    linux = wheelhouse.download_commands("linux-x86_64", "3.11.9", requirements, tmp_path)
    mac = wheelhouse.download_commands("macos-arm64", "3.12.7", requirements, tmp_path)
    assert linux[0][-3:] == ["--index-url", wheelhouse.TORCH_CPU_INDEX, torch_pin]
    assert mac[0][-1] == torch_pin and wheelhouse.TORCH_CPU_INDEX not in mac[0]
    for command in linux + mac:
        assert {"--no-deps", "--only-binary=:all:"} <= set(command)
    assert "manylinux_2_28_x86_64" in linux[1] and "macosx_11_0_arm64" in mac[1]
    assert linux[1][linux[1].index("--python-version") + 1] == "3.11.9"


@pytest.mark.parametrize(
    ("platform", "python", "message"),
    [
        ("windows-x86_64", "3.11.9", r"unknown platform 'windows-x86_64'.*linux-x86_64"),
        ("linux-x86_64", "3.11", r"whole Python release, as 3\.11\.9.*'3\.11'"),
        ("linux-x86_64", "3.10.12", r"3\.11\.5 or newer.*'3\.10\.12'"),
    ],
)
def test_the_wheelhouse_refuses_what_pip_could_not_serve(
    tmp_path: Path, platform: str, python: str, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        wheelhouse.download_commands(platform, python, REPOSITORY / "requirements.txt", tmp_path)
