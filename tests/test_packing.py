"""`tpuready.calc.packing`: documents packed into a fixed `[num_rows, row_len]` batch.

The property tests check what a reader relies on when training on packed rows: every batch has
the same shape, every token lands once and in order, position ids restart at every document,
labels never predict a document's first token from the one before it and skip the padding,
transformers finds the same documents from the position ids alone, and the planner's batches
hold every document once, in order, each batch fitting. A tiny Qwen3 shows that transformers 5.24
keeps the packed documents apart on the CPU's sdpa path.
"""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from tpuready.calc.packing import (
    IGNORE_INDEX,
    PackedBatch,
    PackingError,
    pack_documents,
    plan_packed_batches,
)

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="IProgress not found")
    from transformers.masking_utils import find_packed_sequence_indices
    from transformers.modeling_flash_attention_utils import _is_packed_sequence

property_settings = settings(max_examples=150)


@st.composite
def packing_problems(draw: st.DrawFn) -> tuple[list[list[int]], int, int, int]:
    """Documents of random token ids (each at most row_len long), num_rows, row_len, pad_value."""
    row_len = draw(st.integers(1, 24))
    num_rows = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(1, row_len), min_size=1, max_size=20))
    documents = [draw(st.lists(st.integers(1, 999), min_size=n, max_size=n)) for n in lengths]
    return documents, num_rows, row_len, draw(st.integers(0, 3))


def check_packed(
    batch: PackedBatch, documents: list[list[int]], row_len: int, num_rows: int, pad_value: int
) -> None:
    """Every property of one packed batch, against the documents that went in."""
    for tensor in batch:
        assert tensor.shape == (num_rows, row_len) and tensor.dtype == torch.long
    padding = batch.document_ids == -1
    assert int((~padding).sum()) == sum(len(d) for d in documents)  # no token lost or doubled
    assert bool((batch.input_ids[padding] == pad_value).all())
    assert bool((batch.labels[padding] == IGNORE_INDEX).all())
    for index, tokens in enumerate(documents):
        rows, columns = torch.nonzero(batch.document_ids == index, as_tuple=True)
        assert len(set(rows.tolist())) == 1, "a document is never split across rows"
        start = int(columns[0])
        assert columns.tolist() == list(range(start, start + len(tokens))), "contiguous"
        row = int(rows[0])
        assert batch.input_ids[row, columns].tolist() == tokens
        assert batch.position_ids[row, columns].tolist() == list(range(len(tokens)))
        assert batch.labels[row, columns].tolist() == [IGNORE_INDEX, *tokens[1:]]
    for row in range(num_rows):
        pad_start = int((~padding[row]).sum())
        assert bool(padding[row, pad_start:].all()), "padding only at the end of a row"
        assert batch.position_ids[row, pad_start:].tolist() == list(range(row_len - pad_start))


# --- hand-worked cases --------------------------------------------------------------------------


def test_three_documents_in_two_rows_of_eight() -> None:
    # First fit: 5 tokens open row 0, 3 fill it to 8, 4 go to row 1 and 4 padding follow.
    batch = pack_documents([[11, 12, 13, 14, 15], [21, 22, 23], [31, 32, 33, 34]], 2, 8)
    assert batch.input_ids.tolist() == [
        [11, 12, 13, 14, 15, 21, 22, 23],
        [31, 32, 33, 34, 0, 0, 0, 0],
    ]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 0, 1, 2, 3]]
    assert batch.labels.tolist() == [
        [-100, 12, 13, 14, 15, -100, 22, 23],
        [-100, 32, 33, 34, -100, -100, -100, -100],
    ]
    assert batch.document_ids.tolist() == [[0, 0, 0, 0, 0, 1, 1, 1], [2, 2, 2, 2, -1, -1, -1, -1]]


def test_first_fit_fills_an_earlier_row_before_a_later_one() -> None:
    # 6 opens row 0, 5 does not fit its 2 free tokens and opens row 1, 2 goes back to row 0.
    batch = pack_documents([[1] * 6, [2] * 5, [3] * 2], 2, 8)
    assert batch.document_ids.tolist() == [[0] * 6 + [2] * 2, [1] * 5 + [-1] * 3]


def test_tokenizer_output_and_tensors_are_documents_too() -> None:
    as_lists = pack_documents([[4, 5, 6], [7, 8]], 1, 6, pad_value=1)
    as_features = pack_documents(
        [
            {"input_ids": [4, 5, 6], "attention_mask": [1, 1, 1]},
            {"input_ids": torch.tensor([7, 8])},
        ],
        1,
        6,
        pad_value=1,
    )
    for expected, got in zip(as_lists, as_features, strict=True):
        assert torch.equal(expected, got)
    assert as_lists.input_ids.tolist() == [[4, 5, 6, 7, 8, 1]]


def test_planned_batches_feed_a_data_loader_with_one_shape() -> None:
    documents = [list(range(1, n + 1)) for n in (7, 3, 8, 2, 5, 6, 1, 4)]
    groups = plan_packed_batches([len(d) for d in documents], num_rows=2, row_len=8)
    # 7 and 3 take a row each; 8 fits neither (1 and 5 free) and starts batch 2, where 2 and 5
    # share row 1; 6 fits neither (0 and 1 free) and starts batch 3, with 1 and 4.
    assert groups == [[0, 1], [2, 3, 4], [5, 6, 7]]
    loader = DataLoader(
        documents,  # type: ignore[arg-type]
        batch_sampler=groups,
        collate_fn=functools.partial(pack_documents, num_rows=2, row_len=8),
    )
    shapes = {tuple(batch.input_ids.shape) for batch in loader}
    assert shapes == {(2, 8)}


# --- properties ---------------------------------------------------------------------------------


@given(problem=packing_problems())
@property_settings
def test_every_planned_batch_packs_every_token_once_in_one_shape(
    problem: tuple[list[list[int]], int, int, int],
) -> None:
    documents, num_rows, row_len, pad_value = problem
    groups = plan_packed_batches([len(d) for d in documents], num_rows, row_len)
    assert [index for group in groups for index in group] == list(range(len(documents)))
    for group, following in zip(groups, [*groups[1:], None], strict=True):
        chosen = [documents[index] for index in group]
        batch = pack_documents(chosen, num_rows, row_len, pad_value)
        check_packed(batch, chosen, row_len, num_rows, pad_value)
        if following is not None:  # greedy: the next document did not fit this batch
            with pytest.raises(PackingError, match="do not fit"):
                pack_documents([*chosen, documents[following[0]]], num_rows, row_len)


@given(problem=packing_problems())
@property_settings
def test_transformers_finds_the_documents_from_the_position_ids(
    problem: tuple[list[list[int]], int, int, int],
) -> None:
    # transformers 5.24, given position_ids and no attention_mask, starts a segment wherever the
    # position id does not grow by one: those must be our documents, with the padding its own.
    documents, num_rows, row_len, _ = problem
    first = [
        documents[i] for i in plan_packed_batches([len(d) for d in documents], num_rows, row_len)[0]
    ]
    batch = pack_documents(first, num_rows, row_len)
    segments = find_packed_sequence_indices(batch.position_ids)
    if segments is None:  # transformers found no packing: one document or padding per row
        segments = torch.zeros_like(batch.position_ids)
    changes = torch.diff(batch.document_ids, dim=-1) != 0
    assert torch.equal(torch.diff(segments, dim=-1) != 0, changes)


# --- what transformers does with a packed batch ----------------------------------------------


def test_a_tiny_qwen3_reads_each_packed_document_alone_with_sdpa() -> None:
    from transformers import AutoModelForCausalLM

    from tpuready.runtime.tiny_models import tiny_qwen3_config

    torch.manual_seed(0)
    config = tiny_qwen3_config(attn_implementation="sdpa")
    model = AutoModelForCausalLM.from_config(config).eval()
    generator = torch.Generator().manual_seed(0)
    documents = [
        torch.randint(1, config.vocab_size, (n,), generator=generator) for n in (5, 3, 4, 7, 2)
    ]
    batch = pack_documents(documents, num_rows=2, row_len=12)
    with torch.no_grad():
        packed = model(
            input_ids=batch.input_ids, position_ids=batch.position_ids, use_cache=False
        ).logits
        mixed = model(input_ids=batch.input_ids, use_cache=False).logits
        alone = [model(input_ids=d[None], use_cache=False).logits[0] for d in documents]
    for index, logits in enumerate(alone):
        torch.testing.assert_close(packed[batch.document_ids == index], logits)
    # Without the position ids, the second document of each row reads the first.
    with pytest.raises(AssertionError):
        torch.testing.assert_close(mixed[batch.document_ids == 1], alone[1])


def test_transformers_flash_attention_finds_packing_only_in_a_single_row() -> None:
    # transformers 5.24's flash-attention path looks for restarting position ids only when the
    # batch has one row: a [num_rows, row_len] packed batch goes to it as [1, num_rows * row_len].
    batch = pack_documents([[1, 2, 3], [4, 5], [6, 7, 8, 9]], num_rows=2, row_len=6)
    assert not _is_packed_sequence(batch.position_ids, batch_size=2)
    assert _is_packed_sequence(batch.position_ids.reshape(1, -1), batch_size=1)


# --- refusals -----------------------------------------------------------------------------------


def test_a_document_longer_than_a_row_is_refused_by_name() -> None:
    with pytest.raises(PackingError, match=r"documents\[1\] is 9 tokens, more than row_len 8"):
        pack_documents([[1, 2], list(range(9))], 2, 8)
    with pytest.raises(PackingError, match=r"lengths\[2\] is 9 tokens, more than row_len 8"):
        plan_packed_batches([3, 4, 9], 2, 8)


def test_documents_that_do_not_fit_name_the_fix() -> None:
    with pytest.raises(PackingError, match="12 tokens in all do not fit num_rows 1 of row_len 8"):
        pack_documents([[1] * 6, [2] * 6], 1, 8)


@pytest.mark.parametrize(
    ("documents", "match"),
    [
        ([], "documents is empty"),
        ([[1, 2], []], r"documents\[1\] must be at least 1"),
        ([[1.5, 2.0]], "integer token ids"),
        ([[[1, 2], [3, 4]]], "one row of token ids"),
        ([{"ids": [1]}], "without 'input_ids'"),
        ("abc", "must be a list of documents"),
        ([["a"]], r"documents\[0\] must be a row of token ids"),
    ],
)
def test_what_is_not_a_batch_of_documents_is_refused(documents: object, match: str) -> None:
    with pytest.raises(PackingError, match=match):
        pack_documents(documents, 2, 8)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("lengths", "match"),
    [([], "lengths is empty"), (5, "must be a sequence"), ([3, 0], r"lengths\[1\]")],
)
def test_what_is_not_a_list_of_lengths_is_refused(lengths: object, match: str) -> None:
    with pytest.raises(PackingError, match=match):
        plan_packed_batches(lengths, 2, 8)  # type: ignore[arg-type]
