"""Serve MathJax from the site itself, so formulas render offline.

Sphinx loads MathJax 3 from a CDN by default: a reader without a network (a workshop room, a
plane) then sees raw TeX. The pinned PyPI package `sphinx-mathjax-offline` ships MathJax 3.2.2
(Apache-2.0) and its own Sphinx extension, which copies the whole folder (24 MB) into every
site. This one keeps the package's files and its `mathjax_path` and adds only two things:
it copies the entry script and the components that script loads on demand (TeX input,
CommonHTML output and fonts, menu, accessibility: 9.4 MB, which the offline workshop bundle
carries), leaving out the package's 13 other top-level scripts (other combinations of input and
output, and pieces that tex-chtml.js already holds); and it stops the build at
its start, with the fix, when the package is missing, instead of after it.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

from sphinx.errors import ExtensionError
from sphinx.util.fileutil import copy_asset

DISTRIBUTION = "sphinx-mathjax-offline"
PACKAGE_FOLDER = "sphinx-mathjax-offline/static/mathjax"
ENTRY_SCRIPT = "tex-chtml.js"  # TeX in, CommonHTML out: what Sphinx writes and readers see
TARGET = "mathjax"  # inside the site's _static/


def mathjax_source() -> Path:
    """The folder of MathJax files inside the installed `sphinx-mathjax-offline` package."""
    try:
        distribution = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as error:
        raise ExtensionError(
            f"{DISTRIBUTION} is not installed: install requirements.txt (make book)"
        ) from error
    source = Path(str(distribution.locate_file(PACKAGE_FOLDER)))
    if not (source / ENTRY_SCRIPT).is_file():
        raise ExtensionError(f"{source / ENTRY_SCRIPT} is missing from {DISTRIBUTION}")
    return source


def _point_mathjax_here(app: Any, config: Any) -> None:
    mathjax_source()  # fail at the start of the build, not after it
    config.mathjax_path = f"{TARGET}/{ENTRY_SCRIPT}"


def _is_other_bundle(path: str) -> bool:
    """Skip the package's other single-file bundles (SVG output, MathML input, full builds)."""
    top_level = "/" not in path.replace("\\", "/")
    return top_level and path.endswith(".js") and path != ENTRY_SCRIPT


def _copy_mathjax(app: Any, exception: Exception | None) -> None:
    if exception is None and app.builder.format == "html":
        destination = Path(app.outdir) / "_static" / TARGET
        copy_asset(str(mathjax_source()), str(destination), excluded=_is_other_bundle)


def setup(app: Any) -> dict[str, Any]:
    app.setup_extension("sphinx.ext.mathjax")
    app.connect("config-inited", _point_mathjax_here, priority=900)
    app.connect("build-finished", _copy_mathjax)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
