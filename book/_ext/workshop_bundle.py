"""Build the workshop bundle and the learners' notebooks with every build of the site.

Jupyter Lab (jupyterlab-myst 2.7.0) shows a `{glue:text}` reference as its bare key
(`ch17_max_len`), a `{cite:t}` or `{cite:p}` citation as its bibliography key marked "Citation
Not Found", and a `{term}` as its text linked to nowhere; a notebook downloaded from a chapter
page cannot `import tpuready`. So, once the site is written:

- every notebook a reader can download from the site (`_sources/notebooks/*.ipynb`) becomes
  the learner's copy: each glue reference replaced by the value the site shows, formatted by
  myst-nb's own function; each citation by its author and year as the site writes them
  ("Shoeybi et al. (2019)", "(Shoeybi et al., 2019)"), linked to the work's address in
  `book/references.bib`; each glossary term by its text; and a first line that says what the
  notebook needs;
- `downloads/tpuready-workshop.zip` holds what a room needs with no network: those
  notebooks (with `workers/`, `data/` and `examples/`), `tpuready` as a wheel,
  `requirements.txt`, the bundle's own Makefile and README (from `scripts/workshop_bundle/`,
  with `fill_wheelhouse.py`, which fills a wheelhouse for a platform) and the site itself.

`python book/_ext/workshop_bundle.py OUTPUT_DIR` builds the bundle outside Sphinx, without
the site.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import nbformat

REPOSITORY = Path(__file__).resolve().parents[2]
BUNDLE_NAME = "tpuready-workshop"
BUNDLE_FOLDER = "downloads"  # inside the site; the workshop page links here
BUNDLE_FILES = REPOSITORY / "scripts" / "workshop_bundle"  # Makefile, README, wheelhouse script
NOTEBOOK_FOLDERS = ("workers", "data", "examples", "serving", "titan")  # what the notebooks use
GLUE_PREFIX = "application/papermill.record/"
# {glue:text}`key` or {glue:text}`key:format`, as the chapters write them.
GLUE_TEXT = re.compile(r"\{glue:text\}`([A-Za-z0-9_]+)(?::([^`]*))?`")
# {term}`MXU` or {term}`the mesh <device mesh>`: the text the reader sees, then the term.
TERM = re.compile(r"\{term\}`([^`<]+?)(?:\s*<([^`<>]+)>)?`")
# {cite:t}`key` (textual) or {cite:p}`key, other` (parenthetical), as the chapters write them.
CITE = re.compile(r"\{cite:([tp])\}`([^`]+)`")
BIBLIOGRAPHY = REPOSITORY / "book" / "references.bib"
SKIPPED = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
DOWNLOAD_NOTE = (
    "> *Downloaded from the TPU-ready PyTorch site.* This notebook needs the book's Python "
    "packages, `tpuready` and the `workers/` and `data/` folders beside it: get them all from "
    "the workshop bundle (`tpuready-workshop.zip`, linked from the workshop page), unpack it "
    "and run `make venv` in it. This copy shows the book's numbers and citations in the text."
)


def glue_values(notebook: nbformat.NotebookNode) -> dict[str, str]:
    """Every glued value of a notebook's stored outputs: key to its `text/plain`."""
    values = {}
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            text = output.get("data", {}).get(GLUE_PREFIX + "text/plain")
            if name and text is not None:
                values[name] = text
    return values


def render_glue(markdown: str, values: dict[str, str], source: str) -> str:
    """Replace each `{glue:text}` reference with the text the site shows for it."""
    from myst_nb.core.variables import format_plain_text  # the site's own formatting

    def paste(match: re.Match[str]) -> str:
        key, format_spec = match.group(1), match.group(2)
        if key not in values:
            raise KeyError(f"{source}: {{glue:text}}`{key}` has no glued value: run make notebooks")
        return format_plain_text(values[key], "s" if format_spec is None else format_spec)

    return GLUE_TEXT.sub(paste, markdown)


def render_terms(markdown: str) -> str:
    """Replace each `{term}` role with the text the site shows for it (the glossary's link goes)."""
    return TERM.sub(lambda match: match.group(1).strip(), markdown)


def _author(entry: Any) -> str:
    """The author part of an author-year citation, as sphinxcontrib-bibtex writes it."""
    names = [re.sub(r"[{}]", "", " ".join(person.last_names)) for person in entry.persons["author"]]
    if len(names) >= 3 or "others" in names:
        return f"{names[0]} et al."
    return " and ".join(names)


def read_references(*bibfiles: Path) -> dict[str, tuple[str, str, str | None]]:
    """Each entry of the .bib files: key to (author, year or "n.d.", address or None)."""
    from pybtex.database import parse_file  # sphinxcontrib-bibtex's parser

    references = {}
    for bibfile in bibfiles:
        for key, entry in parse_file(str(bibfile)).entries.items():
            year = entry.fields.get("year", "n.d.")
            references[key] = (_author(entry), year, entry.fields.get("url"))
    return references


def render_citations(
    markdown: str, references: dict[str, tuple[str, str, str | None]], source: str
) -> str:
    """Replace each `{cite:t}` and `{cite:p}` with author and year, linked to the work."""

    def cite(match: re.Match[str]) -> str:
        kind, parts = match.group(1), []
        for key in (key.strip() for key in match.group(2).split(",")):
            if key not in references:
                raise KeyError(f"{source}: {{cite}}`{key}` is not in {BIBLIOGRAPHY.name}")
            author, year, url = references[key]
            text = f"{author} ({year})" if kind == "t" else f"{author}, {year}"
            parts.append(f"[{text}]({url})" if url else text)
        return ", ".join(parts) if kind == "t" else f"({'; '.join(parts)})"

    return CITE.sub(cite, markdown)


def learner_notebook(
    notebook: nbformat.NotebookNode,
    source: str,
    note: str | None = None,
    references: dict[str, tuple[str, str, str | None]] | None = None,
) -> nbformat.NotebookNode:
    """A copy with the numbers, citations and terms in the text, optionally opening with `note`.

    `references` defaults to `book/references.bib`, read by `read_references`.
    """
    copy = nbformat.from_dict(notebook)
    values = glue_values(copy)
    if references is None:
        references = read_references(BIBLIOGRAPHY)
    for cell in copy.cells:
        if cell.cell_type == "markdown":
            markdown = render_glue(cell.source, values, source)
            cell.source = render_terms(render_citations(markdown, references, source))
    if note is not None and not copy.cells[0].source.startswith(note):  # built once already
        copy.cells[0].source = f"{note}\n\n{copy.cells[0].source}"
    return copy


def write_learner_notebooks(
    source_folder: Path,
    target_folder: Path,
    note: str | None,
    references: dict[str, tuple[str, str, str | None]] | None = None,
) -> int:
    """Write the learners' copy of every notebook in `source_folder`; return how many."""
    target_folder.mkdir(parents=True, exist_ok=True)
    if references is None:
        references = read_references(BIBLIOGRAPHY)
    paths = sorted(source_folder.glob("*.ipynb"))
    for path in paths:
        notebook = nbformat.read(path, as_version=4)
        notebook = learner_notebook(notebook, path.name, note, references)
        nbformat.write(notebook, target_folder / path.name)
    return len(paths)


def build_wheel(target_folder: Path) -> Path:
    """Build `tpuready` as a wheel from a copy of its sources (no build/ left in the checkout)."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "tpuready-source"
        copy.mkdir()
        for name in ("pyproject.toml", "README.md", "LICENSE"):
            shutil.copy2(REPOSITORY / name, copy / name)
        shutil.copytree(REPOSITORY / "tpuready", copy / "tpuready", ignore=SKIPPED)
        command = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps"]
        command += ["--no-build-isolation", "--no-index", "--wheel-dir", str(target_folder)]
        result = subprocess.run(
            [*command, str(copy)], capture_output=True, text=True, timeout=300, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(f"building the tpuready wheel failed:\n{result.stderr[-2000:]}")
    (wheel,) = target_folder.glob("tpuready-*.whl")
    return wheel


def build_bundle(output_folder: Path, site: Path | None = None) -> Path:
    """Write `<output_folder>/tpuready-workshop.zip`; include the built `site` when given."""
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch) / BUNDLE_NAME
        root.mkdir()
        shutil.copytree(BUNDLE_FILES, root, dirs_exist_ok=True, ignore=SKIPPED)
        shutil.copy2(REPOSITORY / "requirements.txt", root / "requirements.txt")
        build_wheel(root)
        notebooks = REPOSITORY / "notebooks"
        write_learner_notebooks(notebooks, root / "notebooks", note=None)
        for folder in NOTEBOOK_FOLDERS:
            shutil.copytree(notebooks / folder, root / "notebooks" / folder, ignore=SKIPPED)
        if site is not None:
            shutil.copytree(site, root / "site", ignore=shutil.ignore_patterns(BUNDLE_FOLDER))
        output_folder.mkdir(parents=True, exist_ok=True)
        archive = output_folder / f"{BUNDLE_NAME}.zip"
        with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as bundle:
            for path in sorted(root.rglob("*")):
                bundle.write(path, path.relative_to(root.parent).as_posix())
    return archive


def _after_build(app: Any, exception: Exception | None) -> None:
    if exception is not None or app.builder.format != "html":
        return
    site = Path(app.outdir)
    sources = site / "_sources" / "notebooks"
    bibfiles = getattr(app.config, "bibtex_bibfiles", None) or [BIBLIOGRAPHY]
    references = read_references(*(Path(app.confdir) / bibfile for bibfile in bibfiles))
    write_learner_notebooks(sources, sources, note=DOWNLOAD_NOTE, references=references)
    build_bundle(site / BUNDLE_FOLDER, site=site)


def setup(app: Any) -> dict[str, Any]:
    app.connect("build-finished", _after_build)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    print(build_bundle(Path(sys.argv[1])))
