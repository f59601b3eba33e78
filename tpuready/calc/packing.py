"""Pack documents into a fixed `[num_rows, row_len]` batch: one shape for every batch.

Taught in `notebooks/17_padding_and_bucketing.ipynb` ("Pad and bucket sequences for static
shapes"). transformers' `DataCollatorWithFlattening` concatenates a whole batch into one row of
`sum(lengths)` tokens with no padding, so its width changes with every batch: under
`dynamic=False` (TorchTPU's default) each new width is a new graph, until Dynamo's recompile
limit sends the rest to eager. `pack_documents` keeps the restarting position ids and the
boundary labels but fills `num_rows` rows of `row_len` tokens, first fit, document by document,
and pads what is left of each row:

- `position_ids` count 0, 1, ... from each document's first token, and again over the padding
  at the end of a row, so transformers 5.24 (which looks for restarting position ids when it is
  given no `attention_mask`) sees the padding as one more segment;
- `labels` are the token ids, except `IGNORE_INDEX` (-100) at each document's first token (no
  document predicts its start from the one before it) and on padding;
- `document_ids` give each token's document (its index in the list passed) and -1 on padding,
  from which an attention mask that keeps documents apart is
  `tril & (document_ids[:, :, None] == document_ids[:, None, :])`.

`plan_packed_batches` groups a stream of documents, in order, into batches that
`pack_documents` packs without overflow: use it as a DataLoader's `batch_sampler` and
`functools.partial(pack_documents, num_rows=..., row_len=...)` as its `collate_fn`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

import numpy as np
import torch

from tpuready.calc.buckets import token_row
from tpuready.validate import InputError, whole_number

__all__ = [
    "IGNORE_INDEX",
    "PackedBatch",
    "PackingError",
    "pack_documents",
    "plan_packed_batches",
]

IGNORE_INDEX = -100  # the label cross-entropy skips (PyTorch's and transformers' default)


class PackingError(InputError):
    """Raised for documents, lengths or row sizes that cannot be packed."""


class PackedBatch(NamedTuple):
    """A packed batch: four `[num_rows, row_len]` long tensors."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    document_ids: torch.Tensor


def _check_sizes(num_rows: object, row_len: object) -> tuple[int, int]:
    """`num_rows` and `row_len` as ints, or a `PackingError` naming the bad one."""
    rows = whole_number("num_rows", num_rows, fix="pack into at least one row", error=PackingError)
    length = whole_number(
        "row_len", row_len, fix="use a row length in tokens, such as 512", error=PackingError
    )
    return rows, length


def _check_length(name: str, length: object, row_len: int) -> int:
    """A document's token count, at least 1 and at most `row_len`."""
    count = whole_number(
        name, length, fix="count tokens in whole numbers; drop empty documents", error=PackingError
    )
    if count > row_len:
        raise PackingError(
            f"{name} is {count} tokens, more than row_len {row_len}: split the document into "
            f"pieces of at most {row_len} tokens (each its own document) or raise row_len"
        )
    return count


def _first_fit(lengths: Sequence[int], num_rows: int, row_len: int) -> list[int] | None:
    """The row each length goes to, first fit in order, or None when one does not fit."""
    room = [row_len] * num_rows
    rows = []
    for length in lengths:
        row = next((r for r in range(num_rows) if room[r] >= length), None)
        if row is None:
            return None
        room[row] -= length
        rows.append(row)
    return rows


def plan_packed_batches(
    lengths: Iterable[int] | np.ndarray | torch.Tensor, num_rows: int, row_len: int
) -> list[list[int]]:
    """Indices of `lengths` grouped, in order, into batches that fit `num_rows` rows of `row_len`.

    Greedy: each document goes, first fit, into a row of the current batch; the first one that
    fits in none starts the next batch. Every index appears once, in its original order.
    """
    rows, length = _check_sizes(num_rows, row_len)
    if isinstance(lengths, torch.Tensor | np.ndarray):
        lengths = lengths.tolist()
    if isinstance(lengths, str | bytes) or not isinstance(lengths, Iterable):
        raise PackingError(
            f"lengths must be a sequence of token counts, got {lengths!r}: "
            "pass one length per document, such as [3, 9, 40]"
        )
    checked = [_check_length(f"lengths[{i}]", n, length) for i, n in enumerate(lengths)]
    if not checked:
        raise PackingError("lengths is empty: pass at least one document length")
    batches: list[list[int]] = []
    current: list[int] = []
    room = [length] * rows
    for index, count in enumerate(checked):
        row = next((r for r in range(rows) if room[r] >= count), None)
        if row is None:
            batches.append(current)
            current, room, row = [], [length] * rows, 0
        room[row] -= count
        current.append(index)
    batches.append(current)
    return batches


def _token_ids(index: int, document: object) -> torch.Tensor:
    """Document `index` (token ids, or a mapping with `input_ids`) as a 1-D long tensor."""
    if isinstance(document, Mapping):
        if "input_ids" not in document:
            raise PackingError(
                f"documents[{index}] is a mapping without 'input_ids' (keys {sorted(document)}): "
                "pass token ids, or tokenizer output with input_ids"
            )
        document = document["input_ids"]
    return token_row(f"documents[{index}]", document, error=PackingError)


def pack_documents(
    documents: Sequence[Sequence[int] | torch.Tensor | Mapping[str, object]],
    num_rows: int,
    row_len: int,
    pad_value: int = 0,
) -> PackedBatch:
    """Pack `documents` into `num_rows` rows of `row_len` tokens, first fit: a fixed shape.

    Each document (token ids, or a mapping with `input_ids` such as a tokenizer's output) goes
    whole into the first row with room for it. Returns `PackedBatch(input_ids, position_ids,
    labels, document_ids)`, each `[num_rows, row_len]`: position ids restart at every document
    and at the padding, labels are -100 at each document's first token and on padding, document
    ids index `documents` and are -1 on padding. A DataLoader `collate_fn` with
    `functools.partial(pack_documents, num_rows=..., row_len=...)`; `plan_packed_batches` makes
    batches that fit.
    """
    rows, length = _check_sizes(num_rows, row_len)
    whole_number("pad_value", pad_value, minimum=0, fix="pass a token id", error=PackingError)
    if isinstance(documents, str | bytes | Mapping) or not isinstance(documents, Sequence):
        raise PackingError(
            f"documents must be a list of documents, got {type(documents).__name__}: "
            "pass one list of token ids (or one tokenizer output) per document"
        )
    if len(documents) == 0:
        raise PackingError("documents is empty: a batch needs at least one document")
    ids = [_token_ids(index, document) for index, document in enumerate(documents)]
    counts = [_check_length(f"documents[{i}]", d.numel(), length) for i, d in enumerate(ids)]
    placement = _first_fit(counts, rows, length)
    if placement is None:
        raise PackingError(
            f"documents of {sum(counts)} tokens in all do not fit num_rows {rows} of row_len "
            f"{length} by first fit: pass fewer documents per batch (plan_packed_batches "
            "groups a stream into batches that fit) or more rows"
        )
    input_ids = torch.full((rows, length), int(pad_value), dtype=torch.long)
    labels = torch.full((rows, length), IGNORE_INDEX, dtype=torch.long)
    document_ids = torch.full((rows, length), -1, dtype=torch.long)
    position_ids = torch.empty((rows, length), dtype=torch.long)
    used = [0] * rows
    for document, (tokens, row) in enumerate(zip(ids, placement, strict=True)):
        span = slice(used[row], used[row] + tokens.numel())
        input_ids[row, span] = tokens
        labels[row, span] = tokens
        labels[row, used[row]] = IGNORE_INDEX  # never predicted from the previous document
        document_ids[row, span] = document
        position_ids[row, span] = torch.arange(tokens.numel())
        used[row] = span.stop
    for row, start in enumerate(used):  # the padding counts from 0 too: its own segment
        position_ids[row, start:] = torch.arange(length - start)
    return PackedBatch(input_ids, position_ids, labels, document_ids)
