"""Emit each inline <script> block once per page.

Jupyter Book 1.0.4.post1 with sphinx-thebe 0.3 and Sphinx 7.4 writes sphinx-thebe's inline
configuration twice into every page. It declares `const THEBE_JS_URL`, so the second copy is
a JavaScript error in every reader's browser ("Identifier 'THEBE_JS_URL' has already been
declared"). The browser tests fail on it; this extension removes the repeated copies.
"""

from __future__ import annotations

from typing import Any


def _drop_repeated_inline_scripts(
    app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    seen: set[tuple[str, str]] = set()
    unique = []
    for script in context.get("script_files", []):
        filename = getattr(script, "filename", "") or ""
        body = getattr(script, "attributes", {}).get("body", "")
        key = (filename, body)
        if not filename and body and key in seen:
            continue
        seen.add(key)
        unique.append(script)
    context["script_files"] = unique


def setup(app: Any) -> dict[str, Any]:
    app.connect("html-page-context", _drop_repeated_inline_scripts)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
