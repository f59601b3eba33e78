"""Tests for `tpuready.fix_rewriter`'s own tables; its rewrites are tested through
`tpuready.fix` on the fixtures (`tests/test_fix.py`)."""

from __future__ import annotations

import torch

from tpuready import audit_syntax, fix_rewriter


def test_the_rewriter_fills_every_device_argument_the_audit_flags() -> None:
    assert fix_rewriter._DEVICE_FIRST_ARGUMENT == audit_syntax._DEVICE_FIRST_ARGUMENT
    left_to_the_reader = set(audit_syntax._DEVICE_KEYWORDS) - set(fix_rewriter._DEVICE_KEYWORDS)
    assert left_to_the_reader == {"default", "pin_memory_device"}
    for keyword, as_type in fix_rewriter._DEVICE_KEYWORDS.items():
        assert audit_syntax._DEVICE_KEYWORDS[keyword] == as_type


def test_the_device_line_assigns_the_audits_device_choice() -> None:
    assert " ".join(fix_rewriter.DEVICE_LINE.split()).replace("( ", "(").replace(" )", ")") == (
        f"device = ({audit_syntax.DEVICE_CHOICE})"
    )


def test_the_names_given_after_a_dropped_backend_follow_init_process_groups_signature() -> None:
    import inspect

    parameters = list(inspect.signature(torch.distributed.init_process_group).parameters)
    assert parameters[0] == "backend"
    assert (
        list(fix_rewriter._AFTER_THE_BACKEND)
        == parameters[1 : 1 + len(fix_rewriter._AFTER_THE_BACKEND)]
    )
