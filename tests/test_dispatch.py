"""Tests for tpuready.inspection.dispatch: the operator recorder used in chapter 3 and later."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from tpuready.inspection.dispatch import OpRecorder, RecordedOp, format_counts


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


def test_records_only_inside_its_block_backward_included() -> None:
    weight = torch.ones(3, requires_grad=True)
    with OpRecorder() as forward_only:
        loss = (weight * 2).sum()
    with OpRecorder() as with_backward:
        loss.backward()
    # backward ran after the first block closed: the first recorder must not see it
    assert forward_only.counts() == {"aten.mul.Tensor": 1, "aten.sum.default": 1}
    # sum's gradient is an expand of the incoming gradient, mul's a mul by 2
    backward_counts = with_backward.counts()
    assert backward_counts["aten.expand.default"] == 1
    assert backward_counts["aten.mul.Tensor"] == 1
    assert "aten.sum.default" not in backward_counts


class _NamesOnly(TorchDispatchMode):
    """The dozen-line recorder chapter 3 writes before it introduces OpRecorder."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_sees_the_same_calls_as_a_minimal_dispatch_mode() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    with _NamesOnly() as names, OpRecorder() as recorder:
        model(torch.ones(2, 4)).sum().backward()
    assert [record.name for record in recorder.records] == names.names
    assert "aten.native_layer_norm_backward.default" in names.names


def test_counts_every_call_per_overload_sorted_by_name() -> None:
    with OpRecorder() as recorder:
        x = torch.ones(3)
        for _ in range(3):
            x = x * 2
        x = x + 1
        x.add_(1)
    counts = recorder.counts()
    assert list(counts.items()) == [
        ("aten.add.Tensor", 1),
        ("aten.add_.Tensor", 1),
        ("aten.mul.Tensor", 3),
        ("aten.ones.default", 1),
    ]
    assert len(recorder) == 6


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


def test_calls_made_inside_a_kernel_are_not_recorded() -> None:
    # `_to_copy` is CompositeExplicitAutograd: its kernel calls `empty_strided` and `copy_`
    # through the dispatcher, while the mode is switched off; `.item()` is one call too.
    with OpRecorder() as recorder:
        torch.ones(2).to(torch.float64).sum().item()
    assert recorder.counts() == {
        "aten._local_scalar_dense.default": 1,
        "aten._to_copy.default": 1,
        "aten.ones.default": 1,
        "aten.sum.default": 1,
    }


@torch.library.custom_op("tpuready_test::twice", mutates_args=())
def _twice(tensor: torch.Tensor) -> torch.Tensor:
    return tensor * 2


def test_records_custom_operators_by_their_own_namespace() -> None:
    with OpRecorder() as recorder:
        result = _twice(torch.ones(2))
    assert torch.equal(result, torch.full((2,), 2.0))
    custom = recorder.records[-1]
    assert custom.name == "tpuready_test.twice.default"
    assert custom.namespace == "tpuready_test"
    assert custom.operator == "tpuready_test.twice"
    assert "aten.mul.Tensor" not in recorder.counts()  # the op's body runs unrecorded


def test_recorded_op_names_its_namespace_and_operator() -> None:
    with OpRecorder() as recorder:
        torch.ones(2, dtype=torch.int64).add(torch.ones(2, dtype=torch.int64))
    add = recorder.records[-1]
    assert (add.name, add.namespace, add.operator) == ("aten.add.Tensor", "aten", "aten.add")
    assert add.input_dtypes == ("int64", "int64")


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
    rows = [row.rsplit(maxsplit=1) for row in text.splitlines()[2:]]
    shown = {name: int(calls) for name, calls in rows}
    assert len(rows) == len(shown) == len(counts)
    assert shown == counts
    shown_calls = [int(calls) for _, calls in rows]
    assert shown_calls == sorted(shown_calls, reverse=True)
