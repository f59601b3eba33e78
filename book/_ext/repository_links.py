"""One setting, `repository: url:` in `_config.yml`, drives every way a page points at the code.

Set, it turns on the theme's repository, issue and edit buttons, and the `{get-the-code}`
directive shows how to clone it. Empty (the repository has no public address yet), the
buttons stay off and the directive offers the workshop bundle, which holds the same
notebooks and `tpuready` as a wheel:

    ```{get-the-code}
    ```
"""

from __future__ import annotations

import re
from typing import Any

from docutils import nodes
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective
from sphinx.util.osutil import relative_uri

BUTTONS = ("use_repository_button", "use_issues_button", "use_edit_page_button")
BUNDLE = "downloads/tpuready-workshop.zip"  # written by workshop_bundle.py after the build
# The hosts whose issue and edit pages sphinx-book-theme knows how to link.
_REPOSITORY = re.compile(
    r"https://(github\.com|gitlab\.com|bitbucket\.org)/[\w.-]+/(?P<name>[\w.-]+?)(?<!\.git)/?"
)


def repository_url(config: Any) -> str:
    """The repository's address from `_config.yml` (`repository: url:`), or "" when unset."""
    url = (config.html_theme_options.get("repository_url") or "").strip()
    if url and not _REPOSITORY.fullmatch(url):
        raise ExtensionError(
            f"repository url {url!r} in _config.yml: give the web address of the repository, "
            "such as https://github.com/OWNER/NAME (no .git, no path inside it), or leave it "
            'empty ("") until it has one'
        )
    return url


def clone_folder(url: str) -> str:
    """The folder `git clone URL` creates: the repository's name."""
    match = _REPOSITORY.fullmatch(url)
    assert match is not None, url  # repository_url() validated it
    return match["name"]


def _buttons_follow_url(app: Any, config: Any) -> None:
    url = repository_url(config)
    for button in BUTTONS:
        config.html_theme_options[button] = bool(url)


class GetTheCode(SphinxDirective):
    """How to get the code: a clone when the address is set, the workshop bundle until then."""

    def run(self) -> list[nodes.Node]:
        url = repository_url(self.config)
        if url:
            intro = nodes.paragraph(text="Clone the repository and work inside it:")
            commands = f"git clone {url}.git\ncd {clone_folder(url)}"
            block = nodes.literal_block(commands, commands, language="bash")
            return [intro, block]
        page = self.env.app.builder.get_target_uri(self.env.docname)
        paragraph = nodes.paragraph()
        paragraph += nodes.Text(
            "This copy of the site names no public repository yet. The code comes in the "
        )
        paragraph += nodes.reference("", "workshop bundle", refuri=relative_uri(page, BUNDLE))
        paragraph += nodes.Text(
            " instead: every notebook with the folders it reads, tpuready as a wheel and the "
            "exact pins. Unpack it and run "
        )
        for position, target in enumerate(("venv", "check", "lab")):
            paragraph += nodes.Text(", " if position == 1 else " and " if position else "")
            paragraph += nodes.literal(text=f"make {target}")
        paragraph += nodes.Text(
            " inside (its README.md says more). The other make targets on these pages "
            "need a clone of the repository."
        )
        return [paragraph]


def setup(app: Any) -> dict[str, Any]:
    app.connect("config-inited", _buttons_follow_url)
    app.add_directive("get-the-code", GetTheCode)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
