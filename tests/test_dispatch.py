"""Tests for tpuready.dispatch: the operator recorder used in chapter 2 and later."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from tpuready.dispatch import OpRecorder, RecordedOp, format_counts


def test_records_one_call_with_shapes_and_dtypes() -> None:
    left = torch.ones(2, 3)
    right = torch.ones(3, dtype=torch.float32)
    with OpRecorder() as recorder:
        total = left + right
    assert recorder.records == [
        RecordedOp(
            name="aten.add.Tensor",
            input_shapes=((2, 3), (3,)),
            input_dtypes=("float32", "float32"),
            output_shapes=((2, 3),),
        )
    ]
    assert torch.equal(total, torch.full((2, 3), 2.0))


def test_results_are_unchanged_under_the_recorder() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    inputs = torch.randn(5, 4)
    expected = model(inputs)
    with OpRecorder():
        recorded = model(inputs)
    assert torch.equal(recorded, expected)


def test_sees_decomposed_operators_not_composite_ones() -> None:
    # `linear` is CompositeImplicitAutograd: backends receive `addmm` (plus a transpose).
    layer = nn.Linear(4, 3)
    with OpRecorder() as recorder:
        layer(torch.ones(2, 4))
    names = recorder.counts()
    assert "aten.addmm.default" in names
    assert not any(name.startswith("aten.linear") for name in names)


def test_backward_ops_are_recorded_when_backward_runs_inside() -> None:
    weight = torch.ones(3, requires_grad=True)
    with OpRecorder() as forward_only:
        loss = (weight * 2).sum()
    with OpRecorder() as with_backward:
        loss.backward()
    assert set(forward_only.counts()) == {"aten.mul.Tensor", "aten.sum.default"}
    assert len(with_backward) > 0
    assert torch.equal(weight.grad, torch.full((3,), 2.0))


def test_counts_are_sorted_by_name_and_add_up() -> None:
    with OpRecorder() as recorder:
        x = torch.ones(3)
        for _ in range(3):
            x = x * 2
        x = x + 1
    counts = recorder.counts()
    assert list(counts) == sorted(counts)
    assert counts["aten.mul.Tensor"] == 3
    assert counts["aten.add.Tensor"] == 1
    assert sum(counts.values()) == len(recorder)


def test_calls_accumulate_across_blocks_until_clear() -> None:
    recorder = OpRecorder()
    with recorder:
        torch.ones(2).neg()
    with recorder:
        torch.ones(2).neg()
    assert recorder.counts()["aten.neg.default"] == 2
    recorder.clear()
    assert len(recorder) == 0
    assert recorder.table() == "(no operators recorded)"


def test_nested_ops_inside_a_kernel_are_not_recorded_twice() -> None:
    # `.cpu()` on a CPU tensor is one call at the dispatcher's entry, whatever it does inside.
    with OpRecorder() as recorder:
        torch.ones(2).sum().item()
    assert recorder.counts() == {
        "aten._local_scalar_dense.default": 1,
        "aten.ones.default": 1,
        "aten.sum.default": 1,
    }


def test_recorded_op_names_its_namespace_and_operator() -> None:
    record = RecordedOp("aten.add.Tensor", ((2,), (2,)), ("float32", "float32"), ((2,),))
    assert record.namespace == "aten"
    assert record.operator == "aten.add"


def test_table_orders_by_calls_then_name_and_aligns_columns() -> None:
    table = format_counts({"aten.mm.default": 2, "aten.add.Tensor": 5, "aten.abs.default": 2})
    assert table.splitlines() == [
        "operator          calls",
        "----------------  -----",
        "aten.add.Tensor       5",
        "aten.abs.default      2",
        "aten.mm.default       2",
    ]


def test_table_top_keeps_the_most_called_and_says_what_it_left_out() -> None:
    table = format_counts({"a.x.default": 1, "a.y.default": 4, "a.z.default": 2}, top=1)
    lines = table.splitlines()
    assert lines[2].startswith("a.y.default")
    assert lines[-1] == "... 2 more operators (3 calls) not shown"


@pytest.mark.parametrize("top", [0, -1, 1.5, True, "3"])
def test_table_rejects_a_bad_top(top: object) -> None:
    with pytest.raises(ValueError, match="top must be a positive int"):
        format_counts({"aten.add.Tensor": 1}, top=top)  # type: ignore[arg-type]


def test_table_rejects_negative_counts() -> None:
    with pytest.raises(ValueError, match="non-negative ints"):
        format_counts({"aten.add.Tensor": -1})


OPERATOR_NAMES = st.text(alphabet="abcdefghijklmnopqrstuvwxyz._", min_size=1, max_size=12)


@given(st.dictionaries(OPERATOR_NAMES, st.integers(0, 1000), max_size=20))
def test_table_lists_every_operator_once_with_its_count(counts: dict[str, int]) -> None:
    text = format_counts(counts)
    if not counts:
        assert text == "(no operators recorded)"
        return
    rows = text.splitlines()[2:]
    assert len(rows) == len(counts)
    shown_calls = [int(row.rsplit(maxsplit=1)[1]) for row in rows]
    assert shown_calls == sorted(shown_calls, reverse=True)
    assert sum(shown_calls) == sum(counts.values())
