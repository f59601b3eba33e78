"""Open each notebook's page with the line that says when it was last verified, and where.

The line comes from the records in `verification/` (the ones `make verify` writes and
book/verification.md tabulates), through `tpuready.pages.verification.stamp`: for each kind of
machine with a record of the notebook, the date and the torch version of the newest one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from docutils import nodes

from tpuready.pages.verification import load_records, stamp

REPOSITORY = Path(__file__).resolve().parents[2]
RECORDS = REPOSITORY / "verification"
VERIFICATION_PAGE = "book/verification"


def _load(app: Any) -> None:
    app.tpuready_records = load_records(RECORDS)


def _add_stamp(app: Any, doctree: nodes.document) -> None:
    docname = app.env.docname
    if not docname.startswith("notebooks/"):
        return
    for record in sorted(RECORDS.glob("*.json")):
        app.env.note_dependency(str(record))
    text = stamp(app.tpuready_records, docname.split("/", 1)[1])
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
