"""The package as others install it: declared dependencies per part, and the wheel the
pre-commit hook installs running the audit in a venv that holds only what the wheel declares."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path
from types import ModuleType

import nbformat
import pytest
from conftest import REPOSITORY
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tpuready.runtime.setup_check import read_pins

PACKAGE = REPOSITORY / "tpuready"
PROJECT = tomllib.loads((REPOSITORY / "pyproject.toml").read_text(encoding="utf-8"))["project"]
# A top-level module belongs to the part that uses it: the calculators' argument checks.
PART_OF_TOP_LEVEL_MODULE = {"validate": "calc"}
CUDA_TIE = "import torch\n\nx = torch.ones(2).cuda()\n"


def _load_bundle_extension() -> ModuleType:
    """The site's workshop-bundle extension, which builds the wheel from a copy of the sources."""
    spec = importlib.util.spec_from_file_location(
        "packaging_workshop_bundle", REPOSITORY / "book/_ext/workshop_bundle.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bundle = _load_bundle_extension()


def requirement_names(part: str | None) -> set[str]:
    """The distributions the core, or the core and `part`'s extra, declare (extras followed)."""
    names: set[str] = set()
    pending = [Requirement(text) for text in PROJECT["dependencies"]]
    if part is not None:
        pending += [Requirement(text) for text in PROJECT["optional-dependencies"][part]]
    while pending:
        requirement = pending.pop()
        if canonicalize_name(requirement.name) == "tpuready":
            for extra in requirement.extras:
                pending += [Requirement(t) for t in PROJECT["optional-dependencies"][extra]]
        else:
            names.add(canonicalize_name(requirement.name))
    return names


def third_party_imports(path: Path) -> set[str]:
    """Top-level names of the modules `path` imports, anywhere in it, standard library left out."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return {name for name in names if name not in sys.stdlib_module_names} - {"tpuready"}


def part_of(path: Path) -> str | None:
    """The extra a module's imports are declared in: its subpackage's, None for the core."""
    relative = path.relative_to(PACKAGE)
    if len(relative.parts) > 1:
        return None if relative.parts[0] == "audit" else relative.parts[0]
    return PART_OF_TOP_LEVEL_MODULE.get(path.stem)


def test_every_subpackage_has_an_extra_of_its_own() -> None:
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages - {"audit"} <= set(PROJECT["optional-dependencies"])


@pytest.mark.parametrize(
    "path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(REPOSITORY))
)
def test_every_third_party_import_is_declared_by_its_part(path: Path) -> None:
    distributions = importlib.metadata.packages_distributions()
    part = part_of(path)
    declared = requirement_names(part)
    if part is None:  # the audit reads notebook magics with IPython where it is installed
        declared |= requirement_names("audit")
    for name in third_party_imports(path):
        providers = {canonicalize_name(d) for d in distributions.get(name, [name])}
        assert providers & declared, (
            f"{path.relative_to(REPOSITORY)} imports {name} ({', '.join(sorted(providers))}), "
            f"which pyproject.toml does not declare for {part or 'the core'}: add it there"
        )


def test_every_declared_dependency_is_pinned_where_its_range_allows() -> None:
    pins = read_pins(REPOSITORY / "requirements.txt")
    extras = PROJECT["optional-dependencies"].values()
    texts = [*PROJECT["dependencies"], *(text for extra in extras for text in extra)]
    for requirement in map(Requirement, texts):
        name = canonicalize_name(requirement.name)
        if name == "tpuready":
            continue
        assert name in pins, (
            f"{name} is declared in pyproject.toml but not pinned in requirements.txt"
        )
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"requirements.txt pins {name}=={pins[name]}, outside pyproject's {requirement}"
        )


def test_the_core_needs_no_torch() -> None:
    """The pre-commit hook installs the core alone: the audit must not pull in 1.8 GB of torch."""
    assert "torch" not in requirement_names(None)


def installed_closure(names: set[str]) -> list[importlib.metadata.Distribution]:
    """The installed distributions `names` need, following their own requirements."""
    found: dict[str, importlib.metadata.Distribution] = {}
    pending = list(names)
    while pending:
        name = canonicalize_name(pending.pop())
        if name in found:
            continue
        found[name] = distribution = importlib.metadata.distribution(name)
        for text in distribution.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                pending.append(requirement.name)
    return list(found.values())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return bundle.build_wheel(tmp_path_factory.mktemp("wheel"))  # the bundle's own build


def test_the_wheel_holds_every_subpackage(wheel: Path) -> None:
    in_wheel = {name for name in zipfile.ZipFile(wheel).namelist() if name.endswith(".py")}
    in_tree = {str(p.relative_to(REPOSITORY)) for p in PACKAGE.rglob("*.py")}
    assert in_tree == in_wheel


def test_the_wheel_alone_runs_the_audit_as_the_pre_commit_hook_does(
    wheel: Path, tmp_path: Path
) -> None:
    """A venv with the wheel and only the core's declared dependencies (linked from this one,
    so no index is needed) runs `python -m tpuready audit-source` and reports the CUDA tie."""
    environment = tmp_path / "venv"
    venv.create(environment, with_pip=True)
    python = environment / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    subprocess.run([*install, str(wheel)], check=True, capture_output=True, timeout=300)
    site_packages = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    for distribution in installed_closure(requirement_names(None)):
        for top in {Path(str(file)).parts[0] for file in distribution.files or []}:
            source = Path(str(distribution.locate_file(top)))
            target = site_packages / top
            if source.exists() and not target.exists() and not top.endswith(".pth"):
                target.symlink_to(source)
    script = tmp_path / "train.py"
    script.write_text(CUDA_TIE)
    notebook = tmp_path / "train.ipynb"  # the hook also runs on notebooks
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(CUDA_TIE)]), notebook)
    environment_variables = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [str(python), "-m", "tpuready", "audit-source", str(script), str(notebook)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=environment_variables,
        timeout=300,
    )
    assert "ModuleNotFoundError" not in result.stderr, result.stderr
    assert "train.py:3" in result.stdout and "train.ipynb" in result.stdout, result.stdout
    assert result.stdout.count("cuda-method") == 2, result.stdout + result.stderr
    assert result.returncode == 1, result.stderr  # 1: findings; 2 would be a usage error
