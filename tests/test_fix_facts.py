"""Tests for `tpuready.audit.fix_facts`: what the fixer reads of a module before rewriting (imports,
names used as strings, where and how a scope binds `device`)."""

from __future__ import annotations

from pathlib import Path

import libcst
import pytest
from conftest import REPOSITORY
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuready.audit import fix_facts

FIXTURE_INPUTS = sorted((REPOSITORY / "tests" / "fixtures" / "fix").glob("*.py"))


def _statements(source: str) -> list[libcst.BaseStatement]:
    return list(libcst.parse_module(source).body)


def _expression(source: str) -> libcst.BaseExpression:
    return libcst.parse_expression(source)


def _facts_by_libcst(source: str) -> tuple[dict[str, str], bool, set[str]]:
    facts = fix_facts.ModuleFacts()
    libcst.parse_module(source).visit(facts)
    return facts.aliases, facts.binds_torch, facts.string_used


def _facts_by_ast(source: str) -> tuple[dict[str, str], bool, set[str]]:
    facts = fix_facts.module_facts(source, libcst.parse_module(source))
    return facts.aliases, facts.binds_torch, facts.string_used


@pytest.mark.parametrize(
    "path",
    [*FIXTURE_INPUTS, *sorted((REPOSITORY / "tests" / "fixtures" / "audit").rglob("*.py"))],
    ids=lambda path: path.relative_to(REPOSITORY / "tests").as_posix(),
)
def test_module_facts_read_from_ast_equal_those_of_a_libcst_pass(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    assert _facts_by_ast(source) == _facts_by_libcst(source)


@settings(max_examples=40, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.sampled_from(
            [
                "import torch\n",
                "import torch.cuda as tc\n",
                "from torch import cuda\n",
                "from torch import cuda as tc\n",
                "from . import cuda\n",
                "from .models import cuda\n",
                "from os import *\n",
                "def f():\n    import numpy as tc\n",
                'if device == "cuda" or name.startswith("x"):\n    pass\n',
                "label = prefix + suffix\n",
                "kind = device.type\n",
                "position = device.index\n",
            ]
        ),
        max_size=6,
    )
)
def test_module_facts_agree_on_any_order_of_imports_and_string_uses(parts: list[str]) -> None:
    source = "".join(parts)
    assert _facts_by_ast(source) == _facts_by_libcst(source)


def test_imports_resolve_aliases_and_the_last_import_of_a_name_wins() -> None:
    source = "import torch.cuda as tc\nfrom torch import cuda\n"
    source += "import numpy\nfrom torch import nn as tc\n"
    facts = fix_facts.module_facts(source, libcst.parse_module(source))
    assert facts.aliases["cuda"] == "torch.cuda"
    assert facts.aliases["tc"] == "torch.nn"
    assert facts.aliases["numpy"] == "numpy"
    assert not facts.binds_torch  # `import torch.cuda as tc` binds tc, not torch
    assert fix_facts.module_facts(
        "import torch.nn\n", libcst.parse_module("import torch.nn\n")
    ).binds_torch


def test_a_name_compared_with_a_string_or_given_a_string_method_is_used_as_a_string() -> None:
    source = 'if device == "cuda":\n    pass\nname.startswith("x")\nkind = device.type\n'
    facts = fix_facts.module_facts(source, libcst.parse_module(source))
    assert {"device", "name"} <= facts.string_used
    assert "torch" not in facts.string_used


@pytest.mark.parametrize(
    ("source", "bound"),
    [
        ("device = 'cuda'\n", True),
        ("device: str = 'cuda'\n", True),
        ("for device in devices:\n    pass\n", True),
        ("with ctx() as device:\n    pass\n", True),
        ("if x:\n    device = 1\nelse:\n    pass\n", True),
        ("try:\n    pass\nexcept E:\n    device = 1\n", True),
        ("def f():\n    device = 1\n", False),
        ("class C:\n    device = 1\n", False),
        ("devices = 1\n", False),
    ],
)
def test_binds_device_looks_into_blocks_but_not_into_functions_or_classes(
    source: str, bound: bool
) -> None:
    assert fix_facts.binds_device(_statements(source)) is bound


@pytest.mark.parametrize(
    ("value", "is_choice"),
    [
        (
            'torch.accelerator.current_accelerator(check_available=True) or torch.device("cpu")',
            True,
        ),
        ("choose_device()", True),
        ('"cuda"', True),
        ('torch.device("cuda")', True),
        ('"cuda" if torch.cuda.is_available() else "cpu"', True),
        ('torch.device("cuda" if torch.cuda.is_available() else "cpu")', True),
        ("torch.device(args.device)", True),
        ('"cpu"', False),
        ('torch.device("cpu")', False),
        ("x.device", False),
        ("3", False),
        ('torch.device("cuda", 1)', False),
    ],
)
def test_the_choice_is_recognised_in_each_spelling_and_nothing_else_is(
    value: str, is_choice: bool
) -> None:
    assert fix_facts.is_the_choice(_expression(value)) is is_choice


def _scope(function: str) -> str | None:
    definition = libcst.parse_module(function).body[0]
    assert isinstance(definition, libcst.FunctionDef)
    return fix_facts.scope_kind(definition.params, list(definition.body.body), False)


@pytest.mark.parametrize(
    ("function", "kind"),
    [
        ("def f(x):\n    return x\n", None),
        ("def f(device):\n    pass\n", "unknown"),
        ("def f(device: torch.device):\n    pass\n", "device"),
        ('def f(device="cpu"):\n    pass\n', "other"),
        ('def f(device="cuda"):\n    pass\n', "unknown"),
        ('def f():\n    device = "cuda"\n', "device"),
        ("def f(x):\n    device = x.device\n", "other"),
        ('def f():\n    device = "cuda"\n    device = 3\n', "other"),
        ("def f():\n    for device in ds:\n        pass\n", "other"),
    ],
)
def test_scope_kind_says_whether_rewrites_may_name_the_scopes_device(
    function: str, kind: str | None
) -> None:
    assert _scope(function) == kind


def test_a_choice_used_as_a_string_is_unknown_not_a_device() -> None:
    statements = _statements('device = "cuda"\n')
    assert fix_facts.scope_kind(None, statements, True) == "unknown"
    assert fix_facts.scope_kind(None, statements, False) == "device"
