"""The package's shape: which part may import which, no import cycle, and public names only
across modules (the map is in tpuready/__init__.py and CONTRIBUTING.md)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest
from conftest import REPOSITORY

PACKAGE = REPOSITORY / "tpuready"
# Each part with the parts it may import; the top-level modules count as parts of their own.
ALLOWED_IMPORTS = {
    "accelerator_api": set(),
    "validate": set(),
    "audit": {"accelerator_api"},
    "calc": {"validate"},
    "inspection": {"validate"},
    "emulator": {"accelerator_api", "calc", "inspection", "validate"},
    "runtime": {"calc", "emulator", "inspection", "validate"},
    "pages": {"accelerator_api", "audit", "calc", "emulator", "inspection", "validate"},
    "__main__": {"audit", "runtime"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPOSITORY).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> list[tuple[str, list[str]]]:
    """(module, names taken from it) for every `tpuready` import in `path`, anywhere in it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("tpuready"):
            found.append((node.module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.startswith("tpuready")]
    return found


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Module -> the tpuready modules it imports (a `from package import module` included)."""
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for module, names in imports_of(path):
            submodules = {f"{module}.{n}" for n in names} & modules.keys()
            targets |= submodules or {module}
        graph[name] = targets - {name}
    return graph


def part_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the package's __init__


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules, or None (a depth-first search, colours by module)."""
    state: dict[str, str] = {}
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = "open"
        path.append(module)
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := visit(target)):
                return cycle
        state[module] = "done"
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_no_module_imports_itself_back() -> None:
    assert find_cycle(import_graph()) is None


def test_a_planted_cycle_is_found() -> None:
    graph = {module: set(targets) for module, targets in import_graph().items()}  # a copy
    graph["tpuready.calc.hardware"] |= {"tpuready.calc.plan"}  # plan imports hardware
    cycle = find_cycle(graph)
    assert cycle is not None and "tpuready.calc.plan" in cycle


@pytest.mark.parametrize("module", sorted(import_graph()))
def test_each_part_imports_only_the_parts_below_it(module: str) -> None:
    part = part_of(module)
    if part is None:
        return
    for target in import_graph()[module]:
        target_part = part_of(target)
        if target_part in (None, part):
            continue
        assert target_part in ALLOWED_IMPORTS[part], (
            f"{module} imports {target}: {part} may import only "
            f"{sorted(ALLOWED_IMPORTS[part]) or 'nothing else in tpuready'}"
        )


def private_names_reached(path: Path) -> list[str]:
    """`from tpuready.x import _name` and `x._name` or `tpuready.x._name` on a tpuready module
    `path` imported: the private names it takes from other modules."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    modules = {module_name(p) for p in PACKAGE.rglob("*.py")}
    bound: dict[str, str] = {}  # local name -> the tpuready module it is
    taken = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tpuready"):
            for alias in node.names:
                if is_private(alias.name):
                    taken.append(f"{node.module}.{alias.name}")
                if f"{node.module}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tpuready"):
                    name = alias.asname or alias.name.split(".")[0]
                    bound[name] = alias.name if alias.asname else "tpuready"
    own = module_name(path) if path.is_relative_to(PACKAGE) else None
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and is_private(node.attr)):
            continue
        parts = ast.unparse(node.value).split(".")
        if parts[0] not in bound:
            continue
        target = ".".join([bound[parts[0]], *parts[1:]])
        if target in modules and target != own:
            taken.append(f"{target}.{node.attr}")
    return taken


@pytest.mark.parametrize(
    "path",
    sorted([*PACKAGE.rglob("*.py"), *(REPOSITORY / "tests").glob("*.py")]),
    ids=lambda p: str(p.relative_to(REPOSITORY)),
)
def test_no_private_name_is_taken_from_another_module(path: Path) -> None:
    assert private_names_reached(path) == [], "make them public, with a place in __all__"


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def declared_public_names(path: Path) -> set[str] | None:
    """The names in a module's `__all__`, or None where it has none."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return set(ast.literal_eval(node.value))  # type: ignore[arg-type]
    return None


def test_every_name_taken_from_another_module_is_in_its_all() -> None:
    modules = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    sources = [*PACKAGE.rglob("*.py"), *(REPOSITORY / "tests").glob("*.py")]
    missing = set()
    for path in sources:
        for module, names in imports_of(path):
            if module not in modules or module == module_name(path):
                continue
            public = declared_public_names(modules[module])
            for name in names:
                if f"{module}.{name}" in modules or name.startswith("__"):
                    continue  # a submodule, or __version__
                if public is None or name not in public:
                    missing.add(f"{module}.{name}")
    assert sorted(missing) == []


@pytest.mark.parametrize("path", sorted((REPOSITORY / "book" / "_ext").glob("*.py")), ids=str)
def test_the_sites_extensions_import_the_package_not_scripts_by_path(path: Path) -> None:
    loaders = ("spec_from_file_location", "SourceFileLoader", "runpy")
    text = path.read_text(encoding="utf-8")
    assert not [loader for loader in loaders if loader in text], (
        f"{path.name} loads a file by its path: import what it needs from tpuready instead"
    )
