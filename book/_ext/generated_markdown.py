"""A directive that puts the Markdown a `tpuready` function returns into a page, as MyST.

A reference page then shows the table the code uses, and cannot drift from it:

    ```{generated-markdown} tpuready.pages.accelerator_api:markdown_table
    ```

The function takes no argument and returns Markdown; the page is rebuilt when its module
changes.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from docutils import nodes
from docutils.statemachine import StringList
from sphinx.errors import ExtensionError
from sphinx.util.docutils import SphinxDirective


class GeneratedMarkdown(SphinxDirective):
    """Parse `module:function()`'s Markdown in place, as if the page held it."""

    required_arguments = 1

    def run(self) -> list[nodes.Node]:
        module_name, _, function_name = self.arguments[0].partition(":")
        try:
            module = importlib.import_module(module_name)
            function = getattr(module, function_name)
        except (ImportError, AttributeError) as error:
            raise ExtensionError(
                f"generated-markdown: cannot find {self.arguments[0]!r}: name it as "
                "module:function, as tpuready.pages.accelerator_api:markdown_table"
            ) from error
        self.env.note_dependency(inspect.getfile(module))
        markdown = function()
        container = nodes.container()
        lines = StringList(markdown.splitlines(), source=f"{module_name}.{function_name}()")
        self.state.nested_parse(lines, self.content_offset, container)
        return container.children


def setup(app: Any) -> dict[str, Any]:
    app.add_directive("generated-markdown", GeneratedMarkdown)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
