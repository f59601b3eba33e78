"""Tests for `tpuready.audit.walker`: which CUDA checks guard the code under them (correct as
it stands) and which are a choice a TPU host gets wrong (must change with what they hold)."""

from __future__ import annotations

import pytest
from conftest import REPOSITORY

from tpuready import audit

FIXTURES = REPOSITORY / "tests" / "fixtures" / "audit"


def by_line(name: str) -> dict[int, audit.Finding]:
    return {finding.line: finding for finding in audit.audit_file(FIXTURES / "issue9" / name)}


def test_guarded_findings_say_so_and_probes_are_kept() -> None:
    lines = by_line("guarded.py")
    assert "correct as it stands" in lines[7].message
    probe = lines[9]
    assert probe.severity == "guarded"
    assert "torch.accelerator.is_available()" in probe.suggestion
    assert probe.suggestion.startswith("keep it")


def test_a_guard_that_chooses_the_device_stays_a_must_change() -> None:
    source = (
        "import torch\n"
        "if torch.cuda.is_available():\n"
        '    device = torch.device("cuda")\n'
        "else:\n"
        '    device = torch.device("cpu")\n'
    )
    findings = audit.audit_code(source)
    assert {(f.line, f.rule, f.severity) for f in findings} == {
        (2, "torch-cuda-call", "must-change"),
        (3, "cuda-device-string", "must-change"),
    }


@pytest.mark.parametrize("indent", ["", "    "])
def test_a_flag_set_from_a_ported_probe_guards_nothing(indent: str) -> None:
    body = "use_cuda = torch.cuda.is_available()\nif use_cuda:\n    x = x.cuda()\n"
    nested = "".join(f"{indent}{line}\n" for line in body.splitlines())
    source = "import torch\n" + ("def f(x):\n" if indent else "") + nested
    findings = audit.audit_code(source)
    assert {(f.rule, f.severity) for f in findings} == {
        ("torch-cuda-call", audit.MUST_CHANGE),
        ("cuda-method", audit.MUST_CHANGE),  # `if use_cuda:` is true on a TPU once ported
    }


def test_the_second_corpus_shapes_have_the_severity_their_effect_off_cuda_calls_for() -> None:
    findings = audit.audit_file(FIXTURES / "issue15/fresh_corpus_shapes.py")
    severities = {(f.line, f.rule): f.severity for f in findings}
    notes = {
        (15, "cuda-only-package"),  # under a try that catches ImportError
        (24, "cudnn-setting"),  # both values of the tuple are harmless settings
        (25, "cudnn-setting"),  # a read
        (26, "torch-cuda-call"),  # empty_cache does nothing off CUDA
        (27, "cuda-env-var"),  # a debugging switch
        (30, "grad-scaler-default"),
        (31, "grad-scaler-default"),
        (39, "cuda-only-package"),  # under a bare except
        (43, "grad-scaler-default"),  # enabled=True: still device 'cuda'
        (49, "cuda-backend-setting"),  # a read, under its own rule
        (83, "cudnn-setting"),  # a read in a call
        (84, "cudnn-setting"),  # a read in a test
    }
    must_change = {
        (5, "cuda-only-package"),
        (8, "cuda-only-package"),
        (9, "cuda-only-package"),
        (20, "ddp-device-ids"),
        (28, "cuda-env-var"),
        (35, "cudnn-setting"),  # a switch held in a name, not a value read
        (46, "cuda-only-package"),  # its handler stops the program: not optional
        (52, "torch-cuda-call"),  # `device_count() > 1`: a TPU host counts 0 CUDA GPUs
        (56, "torch-cuda-call"),  # the same under an `and` that guards it
        (57, "torch-cuda-call"),  # `available and is_bf16_supported()`: no bfloat16 on a TPU
        (62, "cuda-named-helper"),
        (67, "torch-cuda-call"),  # the other branch counts one device
        (68, "torch-cuda-call"),  # so the count inside is not guarded
        (71, "torch-cuda-call"),  # the other branch a TPU takes calls .cuda() too
        (72, "cuda-method"),
        (76, "cuda-method"),
        (80, "torch-cuda-call"),  # `available and device_count() > 1` is ported whole
        (82, "torch-cuda-call"),  # `device_count() if available else 1` counts one on a TPU
    }
    assert {key for key, severity in severities.items() if severity == audit.NOTE} == notes
    assert {key for key, severity in severities.items() if severity == audit.MUST_CHANGE} == (
        must_change
    )
    # Two findings share each of these lines (the probe and the count): both must change.
    assert [f.severity for f in findings if f.line in {80, 82}] == [audit.MUST_CHANGE] * 4
    assert {key for key, severity in severities.items() if severity == audit.GUARDED} == {
        (36, "torch-cuda-call"),
        (37, "torch-cuda-call"),  # empty_cache under a CUDA guard is guarded, not a note
        (54, "torch-cuda-call"),  # `device_count() > 0` asks whether CUDA is there
        (55, "torch-cuda-call"),
        (59, "torch-cuda-call"),  # after `device.type != "cuda" or`: runs on CUDA only
    }


def test_gpus_counted_into_a_name_under_a_cuda_check_make_the_check_a_choice() -> None:
    path = FIXTURES / "issue15" / "third_corpus_shapes.py"
    severities = {finding.line: finding.severity for finding in audit.audit_file(path)}
    assert [severities[line] for line in (9, 10, 11)] == [audit.MUST_CHANGE] * 3
    assert [severities[line] for line in (17, 18)] == [audit.GUARDED] * 2
    # An assert under a CUDA-named flag fails on a TPU host; under a real check it cannot.
    assert [severities[line] for line in (28, 29, 30)] == [audit.MUST_CHANGE, *[audit.GUARDED] * 2]
