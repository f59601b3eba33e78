"""Open each notebook's page with the line that says when it was last verified, and where.

The line comes from the records in `verification/` (the ones `make verify` writes and
book/verification.md tabulates), through `scripts/verify.py`'s `stamp`: for each kind of
machine with a record of the notebook, the date and the torch version of the newest one.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from docutils import nodes

REPOSITORY = Path(__file__).resolve().parents[2]
VERIFICATION_PAGE = "book/verification"


def _verify_module() -> ModuleType:
    name = "tpuready_book_verify"
    spec = importlib.util.spec_from_file_location(name, REPOSITORY / "scripts/verify.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while they are built
    spec.loader.exec_module(module)
    return module


def _load(app: Any) -> None:
    app.tpuready_verify = _verify_module()
    app.tpuready_records = app.tpuready_verify.load_records()


def _add_stamp(app: Any, doctree: nodes.document) -> None:
    docname = app.env.docname
    if not docname.startswith("notebooks/"):
        return
    for record in sorted((REPOSITORY / "verification").glob("*.json")):
        app.env.note_dependency(str(record))
    text = app.tpuready_verify.stamp(app.tpuready_records, docname.split("/", 1)[1])
    line = nodes.paragraph(classes=["verified-stamp"])
    line += nodes.Text(f"{text} ")
    line += nodes.reference(
        "",
        "Where this book was verified",
        refuri=app.builder.get_relative_uri(docname, VERIFICATION_PAGE),
    )
    title_section = next(iter(doctree.findall(nodes.section)))
    title_section.insert(1, line)  # right after the page title


def setup(app: Any) -> dict[str, Any]:
    app.connect("builder-inited", _load)
    app.connect("doctree-read", _add_stamp)
    return {"parallel_read_safe": False, "parallel_write_safe": True}
