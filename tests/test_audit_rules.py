"""Tests for `tpuready.audit.rules`: each rule's advice on real code and the ties it finds.

Each fixture in tests/fixtures/audit/issue9/ marks the lines the audit must flag with a
trailing `# expect: RULE` (a must-change finding) or `# expect: RULE/SEVERITY` comment.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from conftest import REPOSITORY

from tpuready import audit
from tpuready.audit import fix

FIXTURES = REPOSITORY / "tests" / "fixtures" / "audit" / "issue9"
EXPECT_MARKER = re.compile(r"#\s*expect:\s*(?P<items>[\w\-,/ ]+)$")


def expected_findings(path: Path) -> set[tuple[int, str, str]]:
    """(line, rule, severity) for every `# expect:` comment of a fixture."""
    expected = set()
    for line_number, line in enumerate(path.read_text().splitlines(), start=1):
        marker = EXPECT_MARKER.search(line)
        if marker:
            for item in marker.group("items").split(","):
                rule, _, severity = item.strip().partition("/")
                expected.add((line_number, rule, severity or "must-change"))
    return expected


def findings_of(name: str) -> list[audit.Finding]:
    return audit.audit_file(FIXTURES / name)


def by_line(name: str) -> dict[int, audit.Finding]:
    return {finding.line: finding for finding in findings_of(name)}


@pytest.mark.parametrize("path", sorted(FIXTURES.glob("*.py")), ids=lambda path: path.name)
def test_fixture_findings_are_exactly_the_marked_lines(path: Path) -> None:
    findings = audit.audit_file(path)
    assert {(f.line, f.rule, f.severity) for f in findings} == expected_findings(path)


# --------------------------------------------------------------------------------------------
# Advice that was wrong


def test_a_name_holding_a_device_type_is_told_to_use_device_type() -> None:
    (finding,) = findings_of("advice_device_type_name.py")
    assert finding.suggestion.startswith("device.type, where device = ")


def test_a_rank_indexed_device_gets_the_per_rank_form() -> None:
    (finding,) = findings_of("advice_rank_string.py")
    assert finding.suggestion.startswith(
        "index = local_rank if torch.accelerator.device_count() > 1 else 0; "
        "torch.accelerator.set_device_index(index); device = torch.device(device_type, index)"
    )
    assert "TorchTPU gives each process one device, index 0" in finding.suggestion
    assert not finding.suggestion.startswith("device,")


def test_backend_setting_advice_follows_the_value_assigned() -> None:
    lines = by_line("advice_follows_value.py")
    assert lines[5].suggestion.startswith('torch.set_float32_matmul_precision("highest")')
    assert "use_deterministic_algorithms(True)" not in lines[6].suggestion
    assert lines[7].suggestion.startswith("torch.use_deterministic_algorithms(True)")
    assert lines[8].suggestion.startswith("keep it")
    # What a TPU loses decides the severity: determinism and full float32 asked for are lost
    # there (must change); non-determinism allowed is what a TPU does anyway (a note). TF32
    # for matmuls also sets the global matmul precision, which TorchTPU may read (must change).
    assert [lines[number].severity for number in (5, 6, 7, 8)] == [
        "must-change",
        "note",
        "must-change",
        "must-change",
    ]


@pytest.mark.parametrize(
    ("source", "severity"),
    [
        ("torch.backends.cudnn.benchmark = True", "note"),
        ("torch.backends.cudnn.benchmark = False", "note"),
        ("torch.backends.cudnn.enabled = False", "note"),
        ("torch.backends.cudnn.allow_tf32 = True", "note"),
        ("torch.backends.cudnn.allow_tf32 = False", "must-change"),
        ("torch.backends.cudnn.allow_tf32 = args.tf32", "must-change"),
        ("torch.backends.cuda.matmul.allow_tf32 = True", "must-change"),
        ("torch.backends.cuda.matmul.allow_tf32 = use_tf32", "must-change"),
        ("torch.backends.cudnn.deterministic = True", "must-change"),
        ("torch.backends.cudnn.deterministic = False", "note"),
        ("torch.backends.cudnn.deterministic = seeded", "must-change"),
        ("torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = 0", "must-change"),
    ],
)
def test_a_setting_is_a_note_only_when_a_tpu_loses_nothing_it_asked_for(
    source: str, severity: str
) -> None:
    (finding,) = audit.audit_code(f"import torch\n{source}\n")
    assert finding.severity == severity
    assert ("a note)" in finding.message) == (severity == "note")


def _suggestion(source: str) -> str:
    (finding,) = audit.audit_code("import torch\n" + source)
    return finding.suggestion


def test_a_default_tensor_type_becomes_a_default_device_and_a_default_dtype() -> None:
    for source in (
        "torch.set_default_tensor_type(torch.cuda.HalfTensor)\n",
        'torch.set_default_tensor_type("torch.cuda.HalfTensor")\n',
    ):
        suggestion = _suggestion(source)
        assert suggestion.startswith(
            "torch.set_default_device(device) and torch.set_default_dtype(torch.float16)"
        ), source
        assert "torch.tensor(" not in suggestion


def test_deterministic_algorithms_come_with_their_caveat() -> None:
    suggestion = _suggestion("torch.backends.cudnn.deterministic = True\n")
    assert suggestion.startswith("torch.use_deterministic_algorithms(True)")
    assert "AdaptiveAvgPool2d" in suggestion and "warn_only=True" in suggestion


def test_float64_advice_never_sends_counts_to_bfloat16() -> None:
    suggestion = _suggestion("counts = torch.zeros(2, dtype=torch.float64, device=device)\n")
    assert "never for counts or sums" in suggestion and "int64" in suggestion
    # The example it gives is bfloat16's rounding of 12345 (8 significant bits).
    assert torch.tensor(12345.0).to(torch.bfloat16).item() == 12352.0
    assert "12345 becomes 12352" in suggestion


def test_tf32_advice_says_what_high_means_on_torchtpu() -> None:
    suggestion = _suggestion("torch.backends.cuda.matmul.allow_tf32 = True\n")
    assert 'if device.type == "cuda"' in suggestion and "three bf16 passes" in suggestion
    assert "not recorded" in suggestion  # what TorchTPU reads is unknown: say so


def test_allowing_tf32_for_matmuls_sets_the_global_matmul_precision() -> None:
    """The fact the advice rests on, checked against the pinned torch."""
    before = torch.get_float32_matmul_precision()
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_per_rank_advice_is_one_recipe_in_the_audit_and_the_fix() -> None:
    suggestion = _suggestion("torch.cuda.set_device(local_rank)\n")
    assert suggestion == audit.per_rank_advice("local_rank")
    # The fixer leaves the line and reports the audit's advice, not a copy of its own.
    (left,) = fix.fix_source("import torch\ntorch.cuda.set_device(local_rank)\n").left
    assert left.reason == suggestion
    # Never "set_device_index(local_rank)" next to "TorchTPU wants index 0".
    assert "if torch.accelerator.device_count() > 1 else 0" in suggestion


def test_cudnn_allow_tf32_is_not_sent_to_the_matmul_precision() -> None:
    (finding,) = findings_of("advice_cudnn_tf32.py")
    assert finding.suggestion.startswith("keep it")
    assert "convolutions" in finding.suggestion and finding.severity == "note"


def test_device_capability_is_not_sent_to_a_dict_returning_call() -> None:
    (finding,) = findings_of("advice_capability.py")
    assert not finding.suggestion.startswith("torch.accelerator.get_device_capability")
    assert "dict" in finding.suggestion and 'device.type == "cuda"' in finding.suggestion


def test_graphs_and_streams_have_portable_spellings() -> None:
    suggestions = [finding.suggestion for finding in findings_of("advice_graphs_streams.py")]
    assert [s.split(" ")[0] for s in suggestions[:2]] == ["torch.accelerator.Graph()"] * 2
    assert "torch.Stream" in suggestions[2]
    assert not any("no entry" in suggestion for suggestion in suggestions)


def test_the_recommended_call_is_never_flagged() -> None:
    recipe = "index = rank if torch.accelerator.device_count() > 1 else 0\n"
    source = f"import torch\n{recipe}torch.accelerator.set_device_index(index)\n"
    assert audit.audit_code(source) == []


def test_the_portable_call_with_a_ranks_own_index_gets_the_recipe() -> None:
    (finding,) = audit.audit_code("import torch\ntorch.accelerator.set_device_index(rank)\n")
    assert finding.rule == "set-device-index"
    assert finding.suggestion.startswith("index = rank if torch.accelerator.device_count() > 1")


def test_inference_mode_is_a_note_where_nothing_compiles() -> None:
    (eager,) = findings_of("advice_inference_mode_eager.py")
    (compiled,) = findings_of("advice_inference_mode_compiled.py")
    assert (eager.severity, compiled.severity) == ("note", "must-change")


def test_float64_without_any_device_is_a_note() -> None:
    (finding,) = findings_of("advice_float64_no_device.py")
    assert finding.severity == "note"
    with_device = audit.audit_code(
        "import torch\nx = torch.zeros(2, dtype=torch.float64)\nx.to(device)\n"
    )
    assert [f.severity for f in with_device] == ["must-change"]


def test_one_device_choice_gives_one_finding() -> None:
    (finding,) = findings_of("advice_one_expression.py")
    assert finding.column == 10  # the whole expression, not the "cuda" inside it
    assert "never a TPU" in finding.message


# --------------------------------------------------------------------------------------------
# Ties that were missed


def test_ddp_device_ids_advice_leaves_them_out() -> None:
    device_ids, output_device = findings_of("ties_ddp_device_ids.py")
    assert device_ids.suggestion.startswith("leave device_ids")
    assert "output_device" in output_device.message and output_device.line == 11


def test_a_module_alias_resolves_later_calls() -> None:
    findings = findings_of("ties_module_alias.py")
    assert "torch.get_device_module" in findings[0].suggestion
    assert "torch.cuda.synchronize" in findings[1].message


# --------------------------------------------------------------------------------------------
# Guarded code
