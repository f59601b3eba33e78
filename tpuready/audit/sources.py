"""Reading what `tpuready.audit` checks: files, folders, notebooks, pragmas, configuration.

Kept apart from the rules (`tpuready.audit`) so that every way an input can be odd (a FIFO
named `x.py`, a symlink loop, a notebook whose cell metadata is a list, a file too large to
parse in bounded memory) is handled in one place and turns into a one-line error naming the
file, never a traceback or a hang.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import gc
import io
import json
import os
import re
import stat
import sys
import tokenize
import tomllib
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat
import pathspec

__all__ = [
    "CUDA_ON_PURPOSE_TAG",
    "IPYTHON_ONLY_LINE",
    "MAX_FILE_BYTES",
    "SKIPPED_DIRECTORIES",
    "AuditConfig",
    "AuditInputError",
    "NotebookCell",
    "check_python_syntax",
    "cycle_collection_paused",
    "find_source_files",
    "find_source_files_and_unreadable",
    "ignored_rules_by_line",
    "is_too_large",
    "load_config",
    "load_notebook",
    "needs_newer_python",
    "parse_python",
    "python_of_cell",
    "python_of_ipython",
    "read_notebook_cells",
    "read_python",
    "read_python_and_encoding",
]

CUDA_ON_PURPOSE_TAG = "cuda-on-purpose"

# Files larger than this (about 50,000 lines of typical code) are skipped with a `skipped-file`
# note: parsing keeps the whole syntax tree in memory (a 3.9 MB file of 300,000 one-line
# findings peaked at 1.3 GB), so the limit bounds the memory of a scan.
MAX_FILE_BYTES = 2_000_000

# Folders never entered when a folder is scanned (hidden folders are skipped as well).
# A path named explicitly on the command line is always scanned.
SKIPPED_DIRECTORIES: frozenset[str] = frozenset(
    {".venv", "venv", ".git", "_build", "__pycache__", "node_modules", "site-packages"}
)

PathArgument = str | os.PathLike[str]

# Cell magics whose body is Python; `%%writefile` counts when it writes a .py file.
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})
# A line only IPython reads: `%magic`, `!shell`, `x = !ls`, `obj?`.
IPYTHON_ONLY_LINE = re.compile(r"^(\s*)(?:[!%]|[\w.\[\], ]+=\s*[!%]|[\w.]+\?{1,2}\s*$)")
_IGNORE_PRAGMA = re.compile(r"#\s*tpuready:\s*ignore(?:\[(?P<rules>[^\]]*)\])?")
# Python 3.12 syntax that Python 3.11 cannot parse: PEP 695 type parameters and `type` aliases.
_NEWER_SYNTAX_LINE = re.compile(
    r"^\s*(?:type\s+\w+\s*(?:\[.*\])?\s*=|(?:async\s+)?def\s+\w+\s*\[|class\s+\w+\s*\[)"
)


class AuditInputError(ValueError):
    """A path the audit cannot read: missing, of an unsupported type, or not decodable."""


# --------------------------------------------------------------------------------------------
# Parsing


def parse_python(source: str) -> ast.Module:
    """`ast.parse`, with the other ways it refuses text (null bytes, nesting deeper than the
    parser allows) turned into SyntaxError so they are reported like one."""
    try:
        with warnings.catch_warnings():
            # The parser warns about the user's code (`"a"()`, invalid escapes): not ours to
            # print, and under `-W error` a warning would become an exception.
            warnings.simplefilter("ignore")
            return ast.parse(source)
    except (ValueError, RecursionError, MemoryError) as error:
        raise SyntaxError(f"{type(error).__name__}: {error}") from error


def check_python_syntax(source: str) -> None:
    """Raise SyntaxError exactly when `parse_python` would, without building the tree: the
    compiler checks text about four times as fast as `ast.parse` builds its Python objects.
    Where the compiler refuses more than the parser (`return` outside a function), the
    parser decides."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, "<audit>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        parse_python(source)


@contextlib.contextmanager
def cycle_collection_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a parse and walk, then restore it. Syntax
    trees hold no reference cycles, so the collector only re-walks their objects: about half
    the time of `ast.parse` on a large file goes to it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def needs_newer_python(error: SyntaxError, source: str) -> bool:
    """True when a syntax error comes from syntax newer than the running Python (3.12's type
    parameters, `type` aliases and f-strings that reuse their quotes), not from the code."""
    if sys.version_info >= (3, 12):
        return False
    if (error.msg or "").startswith("f-string"):
        return True
    lines = source.split("\n")
    line = lines[error.lineno - 1] if error.lineno and error.lineno <= len(lines) else ""
    return _NEWER_SYNTAX_LINE.match(line) is not None


def ignored_rules_by_line(source: str) -> dict[int, frozenset[str] | None]:
    """Lines with a `# tpuready: ignore` comment -> the rules it names (None: every rule).

    Read with `tokenize`, so the pragma counts only in a real comment (never inside a string)
    and lines are counted as Python counts them (a form feed does not start a line).
    """
    if "tpuready" not in source:
        return {}
    ignored: dict[int, frozenset[str] | None] = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type != tokenize.COMMENT:
                continue
            pragma = _IGNORE_PRAGMA.search(token.string)
            if pragma is None:
                continue
            rules = pragma.group("rules")
            ignored[token.start[0]] = (
                None
                if rules is None
                else frozenset(rule.strip() for rule in rules.split(",") if rule.strip())
            )
    except (tokenize.TokenError, SyntaxError):
        pass  # the text did not tokenize to the end: keep the pragmas read so far
    return ignored


# --------------------------------------------------------------------------------------------
# Files


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError as error:
        raise AuditInputError(f"cannot read {path}: {error.strerror or error}") from error


def is_too_large(path: Path) -> bool:
    """True for a file over `MAX_FILE_BYTES` (skipped with a note)."""
    return _file_size(path) > MAX_FILE_BYTES


def read_python(path: Path) -> str:
    """The text of a Python file, decoded as its coding cookie says (UTF-8 by default)."""
    return read_python_and_encoding(path)[0]


def read_python_and_encoding(path: Path) -> tuple[str, str]:
    """The text of a Python file and the encoding it was decoded with, which `--fix` writes
    back; AuditInputError names the file when it cannot be read or decoded."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise AuditInputError(f"cannot read {path}: {error.strerror or error}") from error
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding), encoding
    except (SyntaxError, UnicodeDecodeError, LookupError) as error:
        raise AuditInputError(
            f"cannot decode {path} as Python source ({error}); save it as UTF-8"
        ) from error


@dataclass(frozen=True)
class NotebookCell:
    """One code cell: its number among code cells (from 1), its Python text (None for a
    non-Python cell magic such as `%%bash`) and whether it is tagged `cuda-on-purpose`."""

    number: int
    python: str | None
    on_purpose: bool


def _cell_text(path: Path, number: int, raw: object) -> str:
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list) and all(isinstance(part, str) for part in raw):
        return "".join(raw)
    raise AuditInputError(
        f"{path}: code cell {number} has a 'source' that is not text "
        f"(got {type(raw).__name__}); nbformat 4 wants a string or a list of strings"
    )


def _has_on_purpose_tag(cell: Mapping[str, Any]) -> bool:
    """Exact tag match: `cuda-on-purpose-not` or a string `"cuda-on-purpose-x"` do not count."""
    metadata = cell.get("metadata")
    tags = metadata.get("tags") if isinstance(metadata, dict) else None
    return isinstance(tags, list) and any(tag == CUDA_ON_PURPOSE_TAG for tag in tags)


def python_of_cell(source: str) -> str | None:
    """The Python text of a code cell, line numbers kept; None for a non-Python cell magic."""
    lines = source.split("\n")
    first = lines[0].strip()
    if first.startswith("%%"):
        words = first[2:].split()
        magic = words[0] if words else ""
        writes_python = magic == "writefile" and words[-1].endswith(".py")
        if magic not in _PYTHON_CELL_MAGICS and not writes_python:
            return None
        lines[0] = ""
    return "\n".join(lines)


def _ipython_transform(source: str) -> str | None:
    """IPython's own reading of line magics and shell lines, or None when IPython is missing
    or the result does not keep one line per line (the findings' line numbers need that)."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        return None
    try:
        transformed = TransformerManager().transform_cell(source)
    except Exception:
        return None
    if transformed.rstrip("\n").count("\n") != source.rstrip("\n").count("\n"):
        return None
    return transformed


def python_of_ipython(source: str) -> str:
    """A cell that does not parse as Python: turn IPython-only lines (`%magic`, `!shell`,
    `x = !ls`, `obj?`) into Python that parses, keeping line numbers."""
    transformed = _ipython_transform(source)
    if transformed is not None:
        return transformed
    return "\n".join(
        IPYTHON_ONLY_LINE.sub(lambda match: match.group(1) + "pass  # ", line)
        for line in source.split("\n")
    )


def load_notebook(text: str | bytes, path: Path, *, upgrade: bool = True) -> dict[str, Any]:
    """A notebook's JSON, as a dict with a `cells` list; nbformat 3 is upgraded to 4 in memory
    by nbformat's converter when `upgrade`. Any other shape is an AuditInputError naming the
    file and the fix. Version 4 is not passed through nbformat's reader: it refuses a whole
    notebook for one odd cell (metadata that is a list), where the audit reports the rest."""
    convert = f"convert it with `jupyter nbconvert --to notebook --nbformat 4 {path.name}`"
    try:
        notebook = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise AuditInputError(f"{path} is not a notebook: invalid JSON ({error})") from error
    version = notebook.get("nbformat") if isinstance(notebook, dict) else None
    if version == 3 and upgrade:
        try:
            notebook = nbformat.convert(nbformat.from_dict(notebook), 4)
        except Exception as error:  # nbformat's converters raise whatever the input provokes
            raise AuditInputError(
                f"{path}: nbformat cannot upgrade this nbformat 3 notebook ({error}); open and "
                "save it in Jupyter, or convert it as nbformat 4 by hand"
            ) from error
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    if not isinstance(cells, list):
        shown = f"nbformat {version}" if version is not None else "no 'cells' list"
        raise AuditInputError(f"{path} is not an nbformat 4 notebook ({shown}); {convert}")
    return notebook


def read_notebook_cells(path: Path) -> list[NotebookCell]:
    """The code cells of an nbformat 4 notebook (3 is upgraded); any other shape is an
    AuditInputError."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise AuditInputError(f"cannot read {path}: {error.strerror or error}") from error
    cells = load_notebook(data, path)["cells"]
    code_cells = [
        cell for cell in cells if isinstance(cell, dict) and cell.get("cell_type") == "code"
    ]
    return [
        NotebookCell(
            number=number,
            python=python_of_cell(_cell_text(path, number, cell.get("source", ""))),
            on_purpose=_has_on_purpose_tag(cell),
        )
        for number, cell in enumerate(code_cells, start=1)
    ]


def _is_skipped_directory(name: str) -> bool:
    return name.startswith(".") or name in SKIPPED_DIRECTORIES


def _is_regular_file(path: Path) -> bool:
    """A regular file (after symlinks): FIFOs, devices and sockets named `*.py` are not read,
    since opening a FIFO would wait forever for a writer."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


def _identity(path: Path) -> Path:
    """The real path of a file, for de-duplication; a symlink loop has none, so keep it."""
    try:
        return path.resolve(strict=False)
    except (OSError, RuntimeError):
        return path.absolute()


def find_source_files(paths: PathArgument | Iterable[PathArgument]) -> list[Path]:
    """The `.py` and `.ipynb` files to audit: files as given, folders searched recursively
    (skipping `SKIPPED_DIRECTORIES`, hidden folders, hidden files and anything that is not a
    regular file; symlinked folders are not followed), in a stable order.

    Raises AuditInputError for a bad path and for a folder inside that cannot be read."""
    files, unreadable = find_source_files_and_unreadable(paths)
    if unreadable:
        raise AuditInputError(unreadable[0])
    return files


def find_source_files_and_unreadable(
    paths: PathArgument | Iterable[PathArgument],
) -> tuple[list[Path], list[str]]:
    """`find_source_files`, except that a folder inside that cannot be read is named (one
    line each, second item) instead of discarding every file found around it."""
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    given = [Path(path) for path in paths]
    if not given:
        raise AuditInputError("no paths given: name at least one file or folder to audit")
    files: list[Path] = []
    unreadable: list[str] = []

    def refuse_folder(error: OSError) -> None:
        unreadable.append(f"cannot read folder {error.filename}: {error.strerror}")

    for path in given:
        if path.is_dir():
            for root, folders, names in os.walk(path, onerror=refuse_folder):
                folders[:] = sorted(name for name in folders if not _is_skipped_directory(name))
                files += [
                    Path(root) / name
                    for name in sorted(names)
                    if name.endswith((".py", ".ipynb"))
                    and not name.startswith(".")
                    and _is_regular_file(Path(root) / name)
                ]
        elif _is_regular_file(path):
            if path.suffix not in {".py", ".ipynb"}:
                raise AuditInputError(
                    f"{path} is neither a .py file nor a .ipynb notebook; "
                    f"name Python files, notebooks or folders"
                )
            files.append(path)
        elif path.is_symlink() or path.exists():
            raise AuditInputError(
                f"{path} is not a regular file or folder (a FIFO, device, socket or broken "
                f"symlink); name Python files, notebooks or folders"
            )
        else:
            raise AuditInputError(f"{path}: no such file or folder")
    unique: dict[Path, Path] = {}
    for file in files:
        unique.setdefault(_identity(file), file)
    return list(unique.values()), unreadable


# --------------------------------------------------------------------------------------------
# Configuration: [tool.tpuready] in the scanned project's pyproject.toml


@dataclass(frozen=True)
class AuditConfig:
    """`[tool.tpuready]`: `skip` (rule ids never reported) and `exclude` (files and folders
    never scanned, as .gitignore patterns relative to the folder of the pyproject.toml, read
    by `pathspec`; unlike git, `!pattern` takes back a file even inside an excluded folder)."""

    skip: frozenset[str] = frozenset()
    exclude: tuple[str, ...] = ()
    root: Path | None = None
    source: str = field(default="", compare=False)

    @functools.cached_property
    def _exclude_spec(self) -> pathspec.GitIgnoreSpec:
        return pathspec.GitIgnoreSpec.from_lines(self.exclude)

    def excludes(self, path: Path) -> bool:
        """True when `path` (or one of its folders) matches the `exclude` patterns, read with
        .gitignore's rules by `pathspec`: `dir/` names folders, `!pattern` takes a path back."""
        if not self.exclude or self.root is None:
            return False
        try:
            relative = _identity(path).relative_to(self.root)
        except ValueError:
            return False
        return self._exclude_spec.match_file(relative.as_posix())


def _find_pyproject(start: Path) -> Path | None:
    folder = _identity(start)
    if not folder.is_dir():
        folder = folder.parent
    for candidate in (folder, *folder.parents):
        pyproject = candidate / "pyproject.toml"
        if pyproject.is_file():
            return pyproject
    return None


def load_config(start: PathArgument, known_rules: Iterable[str]) -> AuditConfig:
    """The `[tool.tpuready]` table of the nearest pyproject.toml at or above `start` (an empty
    configuration when there is none). A malformed table is an AuditInputError."""
    pyproject = _find_pyproject(Path(start))
    if pyproject is None:
        return AuditConfig()
    try:
        table = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise AuditInputError(f"cannot read {pyproject}: {error}") from error
    settings = table.get("tool", {}).get("tpuready", {})
    if not isinstance(settings, dict):
        raise AuditInputError(f"{pyproject}: [tool.tpuready] must be a table")
    unknown_keys = set(settings) - {"skip", "exclude"}
    if unknown_keys:
        raise AuditInputError(
            f"{pyproject}: unknown [tool.tpuready] key(s) {sorted(unknown_keys)}; "
            f"use 'skip' (rule ids) and 'exclude' (.gitignore patterns)"
        )
    lists = {}
    for key in ("skip", "exclude"):
        value = settings.get(key, [])
        if not (isinstance(value, list) and all(isinstance(item, str) for item in value)):
            raise AuditInputError(
                f"{pyproject}: [tool.tpuready] {key} must be a list of strings, got {value!r}"
            )
        lists[key] = value
    for pattern in lists["exclude"]:
        try:
            pathspec.GitIgnoreSpec.from_lines([pattern])
        except ValueError as error:  # pathspec's GitIgnorePatternError is a ValueError
            raise AuditInputError(
                f"{pyproject}: [tool.tpuready] exclude pattern {pattern!r} is not a valid "
                f".gitignore pattern ({error})"
            ) from error
    unknown_rules = sorted(set(lists["skip"]) - set(known_rules))
    if unknown_rules:
        raise AuditInputError(
            f"{pyproject}: [tool.tpuready] skip names unknown rule(s) {unknown_rules}; "
            f"the rules are listed by `python -m tpuready audit-source --help`"
        )
    return AuditConfig(
        skip=frozenset(lists["skip"]),
        exclude=tuple(lists["exclude"]),
        root=_identity(pyproject.parent),
        source=str(pyproject),
    )
