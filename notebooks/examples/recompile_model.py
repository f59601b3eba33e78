"""A small token model and a loader of variable-length batches.

Stand-ins for your model and your data loader, taught in
`notebooks/16_static_shapes_and_recompiles.ipynb` and compiled under a
recompile budget by `test_recompile_budget.py` next to this file. The loader
pads each batch to a multiple of `pad_to_multiple_of`, so the number of
distinct batch shapes, and so of compiled graphs, is something you choose.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader

VOCAB_SIZE = 64
HIDDEN_SIZE = 32
# cross_entropy's default ignore_index: padded positions add no loss.
PAD_TARGET = -100


class TokenModel(nn.Module):
    """Embedding, a two-layer MLP and a vocabulary projection."""

    def __init__(
        self, vocab_size: int = VOCAB_SIZE, hidden_size: int = HIDDEN_SIZE
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, hidden_size)
        self.mlp = nn.Sequential(
            nn.Linear(hidden_size, hidden_size),
            nn.GELU(),
            nn.Linear(hidden_size, vocab_size),
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token logits, `[batch, seq_len, vocab_size]`."""
        return self.mlp(self.embed(tokens))


def sample_lengths(
    num_sequences: int, min_length: int, max_length: int, seed: int = 0
) -> list[int]:
    """Seeded sequence lengths, uniform in `[min_length, max_length]`."""
    if not 2 <= min_length <= max_length:
        raise ValueError(
            f"need 2 <= min_length <= max_length, got {min_length} and "
            f"{max_length}: a sequence holds inputs and a target"
        )
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(
        min_length, max_length + 1, (num_sequences,), generator=generator
    )
    return lengths.tolist()


# The training data of chapter 16 and of the recompile budget test.
TRAIN_LENGTHS = sample_lengths(48, min_length=8, max_length=100, seed=1)


def padded_length(length: int, pad_to_multiple_of: int) -> int:
    """`length` rounded up to a multiple of `pad_to_multiple_of`."""
    if pad_to_multiple_of < 1:
        raise ValueError(
            f"pad_to_multiple_of must be at least 1, got {pad_to_multiple_of}"
        )
    return -(-length // pad_to_multiple_of) * pad_to_multiple_of


def collate(
    sequences: list[torch.Tensor], pad_to_multiple_of: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Input tokens and next-token targets, padded to a multiple.

    Padded inputs are token 0; padded targets are `PAD_TARGET`, which the
    loss ignores.
    """
    longest = max(len(sequence) for sequence in sequences) - 1
    width = padded_length(longest, pad_to_multiple_of)
    tokens = torch.zeros(len(sequences), width, dtype=torch.long)
    targets = torch.full((len(sequences), width), PAD_TARGET)
    for row, sequence in enumerate(sequences):
        tokens[row, : len(sequence) - 1] = sequence[:-1]
        targets[row, : len(sequence) - 1] = sequence[1:]
    return tokens, targets


def make_loader(
    lengths: list[int],
    batch_size: int = 4,
    pad_to_multiple_of: int = 1,
    drop_last: bool = True,
    seed: int = 0,
) -> DataLoader:
    """Batches of seeded random sequences with these lengths, in order."""
    if any(length < 2 for length in lengths):
        raise ValueError(f"every length must be at least 2, got {lengths}")
    generator = torch.Generator().manual_seed(seed)
    sequences = [
        torch.randint(0, VOCAB_SIZE, (length,), generator=generator)
        for length in lengths
    ]
    return DataLoader(
        sequences,
        batch_size=batch_size,
        shuffle=False,
        drop_last=drop_last,
        collate_fn=lambda batch: collate(batch, pad_to_multiple_of),
    )
