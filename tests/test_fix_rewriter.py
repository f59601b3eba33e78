"""Tests for `tpuready.audit.fix_rewriter`'s own tables; its rewrites are tested through
`tpuready.audit.fix` on the fixtures (`tests/test_fix.py`)."""

from __future__ import annotations

import ast
from pathlib import Path

import libcst
import pytest
import torch
from conftest import REPOSITORY
from libcst.metadata import MetadataWrapper, PositionProvider

from tpuready.audit import fix_facts, fix_rewriter, syntax


def test_the_rewriter_fills_every_device_argument_the_audit_flags() -> None:
    assert fix_rewriter.DEVICE_FIRST_ARGUMENT == syntax.DEVICE_FIRST_ARGUMENT
    left_to_the_reader = set(syntax.DEVICE_KEYWORDS) - set(fix_rewriter.DEVICE_KEYWORDS)
    assert left_to_the_reader == {"default", "pin_memory_device"}
    for keyword, as_type in fix_rewriter.DEVICE_KEYWORDS.items():
        assert syntax.DEVICE_KEYWORDS[keyword] == as_type


def test_the_device_line_assigns_the_audits_device_choice() -> None:
    assert " ".join(fix_rewriter.DEVICE_LINE.split()).replace("( ", "(").replace(" )", ")") == (
        f"device = ({syntax.DEVICE_CHOICE})"
    )


def test_the_names_given_after_a_dropped_backend_follow_init_process_groups_signature() -> None:
    import inspect

    parameters = list(inspect.signature(torch.distributed.init_process_group).parameters)
    assert parameters[0] == "backend"
    assert (
        list(fix_rewriter.AFTER_THE_BACKEND)
        == parameters[1 : 1 + len(fix_rewriter.AFTER_THE_BACKEND)]
    )


POSITION_SOURCES = sorted((REPOSITORY / "tests" / "fixtures").rglob("*.py")) + sorted(
    (REPOSITORY / "notebooks" / "examples").glob("*.py")
)


@pytest.mark.parametrize(
    "path", POSITION_SOURCES, ids=lambda path: path.relative_to(REPOSITORY).as_posix()
)
def test_spans_worked_out_per_statement_equal_libcsts_for_every_node(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    module = libcst.parse_module(source)
    whole = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    positions = fix_rewriter.StatementPositions(module, source)
    assert not positions.whole
    for statement in module.body:
        first, last = positions.lines[id(statement)]
        assert first <= whole[statement].start.line and last <= whole[statement].end.line
        positions.load(statement)
        for node in fix_facts.walk(statement):
            assert positions.spans[node] == whole[node], type(node).__name__


@pytest.mark.parametrize(
    "source",
    [
        "@decorator\n@other(1)\ndef f():\n    x = 1\n    # a comment\n\n\ny = 2; z = 3\n",
        "# header\nclass C:\n    pass\nif x:\n    a = 1\nelse:\n    b = 2\n# footer\n",
        "async def f():\n    await g()\n",
    ],
)
def test_spans_hold_for_decorators_semicolons_and_comments(source: str) -> None:
    module = libcst.parse_module(source)
    whole = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
    positions = fix_rewriter.StatementPositions(module, source)
    for statement in module.body:
        assert positions.of(statement) == whole[statement]


def test_text_python_refuses_gets_every_span_at_once() -> None:
    module = libcst.parse_module("x = 1\n")
    positions = fix_rewriter.StatementPositions(module, "x = (\n")  # what ast.parse refuses
    assert positions.whole and module.body[0] in positions.spans


FIX_SOURCES = [
    *sorted((REPOSITORY / "tests" / "fixtures").rglob("*.py")),
    *sorted((REPOSITORY / "notebooks" / "examples").glob("*.py")),
    *sorted((REPOSITORY / "tpuready").glob("*.py")),
]


@pytest.mark.parametrize(
    "path", FIX_SOURCES, ids=lambda path: path.relative_to(REPOSITORY).as_posix()
)
def test_stand_ins_keep_every_line_number_and_put_back_gives_the_text(path: Path) -> None:
    from tpuready import audit

    source = path.read_text(encoding="utf-8")
    finding_lines = frozenset(finding.line for finding in audit.audit_code(source))
    text, replaced = fix_rewriter.stand_in_text(source, finding_lines)
    assert len(text.splitlines()) == len(source.splitlines())
    kept = source.splitlines()
    for line in finding_lines:  # no finding is ever hidden
        assert text.splitlines()[line - 1] == kept[line - 1]
    assert fix_rewriter.put_back(text, replaced) == source


@pytest.mark.parametrize(
    "path", FIX_SOURCES, ids=lambda path: path.relative_to(REPOSITORY).as_posix()
)
def test_a_fix_with_stand_ins_equals_one_without(
    path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuready.audit import fix

    source = path.read_text(encoding="utf-8")
    with_stand_ins = fix.fix_source(source)
    monkeypatch.setattr(fix, "stand_in_text", lambda text, lines: (text, []))
    without = fix.fix_source(source)
    assert with_stand_ins == without


def test_stand_ins_replace_only_what_follows_the_first_definition() -> None:
    source = (
        "import torch\n\nx = 1\n\n\n@decorator\ndef f(a,\n      b):\n    return a\n\n\n"
        "class C:\n    pass\n\n\ny = torch.cuda.is_available()\ndevice = 'cpu'\nimport os\n"
    )
    text, replaced = fix_rewriter.stand_in_text(source, frozenset({16}))
    assert text.splitlines()[:5] == source.splitlines()[:5]  # before the first definition
    assert [original for _, original in replaced] == [
        "@decorator\ndef f(a,\n      b):\n    return a\n",
        "class C:\n    pass\n",
    ]
    assert text.splitlines()[15:] == source.splitlines()[15:]  # a finding, device, an import
    assert "def _tpuready_stand_in_0(" in text


def test_a_stand_in_the_rewrite_changed_is_refused() -> None:
    with pytest.raises(AssertionError, match="stand-in"):
        fix_rewriter.put_back("x = 1\n", [("def _s_0(): pass\n", "y = 2\n")])


def test_stand_ins_count_lines_as_python_does() -> None:
    # str.splitlines also breaks at a form feed and at U+2028; Python's line numbers do not.
    source = (
        "import torch\n\n\ndef f():\n    return 1\n\x0c# page break\n"
        'x = "a\u2028b"\n\n\ndef g():\n    return 2\n\n\n'
        "model = torch.nn.Linear(2, 2).cuda()\n"
    )
    from tpuready.audit import fix

    fixed = fix.fix_source(source).fixed
    assert fixed.endswith("model = torch.nn.Linear(2, 2).to(device)\n")
    assert fixed.count("\x0c# page break\n") == 1 and fixed.count("\u2028") == 1


NESTED = """\
import torch


class Trainer:
    @property
    def steps(self):
        return 10

    def start(self, device):
        self.model = self.model.to(device)

    def fit(self):
        model = torch.nn.Linear(2, 2).cuda()
        if model.training:
            inputs = torch.zeros(2).cuda()
            print("training")
        elif model.bias is None:
            print("no bias")
        else: print("eval")
        if model.training: print("one line"); inputs = torch.ones(1).cuda()
        for step in range(3):
            device = torch.device("cpu")
        return model
"""


def test_stand_ins_reach_into_a_statement_that_holds_a_finding() -> None:
    finding_lines = frozenset({13, 15, 20})
    text, replaced = fix_rewriter.stand_in_text(NESTED, finding_lines)
    assert [original.strip().splitlines()[0] for _, original in replaced] == [
        "@property",  # a method with no finding, decorator and all
        "def start(self, device):",  # it uses `device`, it binds none in the class's scope
        'print("training")',  # beside a finding in the `if`'s body
        'print("no bias")',  # an `elif`'s body, never the `elif` itself
        "return model",
    ]
    assert text.splitlines()[4] == "    def _tpuready_stand_in_0("  # the indentation kept
    assert 'else: print("eval")' in text  # a body on its header's line
    assert "device = torch.device" in text  # a loop that binds `device` in fit's scope
    assert fix_rewriter.put_back(text, replaced) == NESTED
    assert libcst.parse_module(text).code == text


def test_a_fix_with_nested_stand_ins_equals_one_without(monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuready.audit import fix

    with_stand_ins = fix.fix_source(NESTED)
    monkeypatch.setattr(fix, "stand_in_text", lambda text, lines: (text, []))
    assert with_stand_ins == fix.fix_source(NESTED)
    assert "torch.nn.Linear(2, 2).to(" in with_stand_ins.fixed


@pytest.mark.parametrize(
    ("code", "binds"),
    [
        ("device = 1", True),
        ("for device in devices: pass", True),
        ("with open(f) as device: pass", True),
        ("device, rank = pick()", True),
        ("del device", True),
        ("global device", True),
        ("try: pass\nexcept OSError as device: pass", True),
        ("if (device := pick()): pass", True),
        ("model.to(device)", False),
        ("self.device = pick()", False),  # an attribute: not a scope's `device`
        ("def start(device): pass", False),  # a parameter binds in the function's own scope
    ],
)
def test_which_statements_bind_device(code: str, binds: bool) -> None:
    assert fix_rewriter.binds_the_name_device(ast.parse(code).body) is binds


@pytest.mark.parametrize(
    "source",
    [
        # handlers are listed after `else`/`finally` in Python's tree, not in line order
        "import torch\n\n\ndef f(x):\n    try:\n        x = x.cuda()\n    except Exception:\n"
        "        y = 1\n    else:\n        y = 3\n    finally:\n        z = 2\n    return x\n",
        # a form feed starts the indentation of a line
        "import torch\n\n\ndef f(x):\n\x0c    y = 1\n    x = x.cuda()\n    return x\n",
        # a statement on a line the line before continues
        "import torch\n\n\ndef f(x, z):\n    if z:\n        x = x.cuda()\n    else: \\\n"
        "        y = 1\n    return x\n",
    ],
)
def test_a_stand_in_keeps_the_text_libcst_parses_the_same(
    source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuready.audit import fix

    with_stand_ins = fix.fix_source(source)
    monkeypatch.setattr(fix, "stand_in_text", lambda text, lines: (text, []))
    assert with_stand_ins == fix.fix_source(source)
    assert "x.to(device)" in with_stand_ins.fixed
