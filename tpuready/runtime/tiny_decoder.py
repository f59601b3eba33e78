"""Chapter 21's tiny decoder and its training step, for the chapters that reuse them.

Chapter 21 (`notebooks/21_rooflines_and_mfu.ipynb`, step 3) writes this model out
cell by cell and counts its FLOPs; chapter 22 (`notebooks/22_profile_a_training_step.ipynb`)
profiles the same step and builds it here. Attention is two matmuls (no fused kernel), so every
FLOP reaches `FlopCounterMode` and every matmul is an op of its own in `torch.profiler`: a step
counts $6N$ FLOPs per token for $N$ matmul weights plus $12 L S h$ per token for attention.
On an accelerator the step runs under bf16 autocast, the precision of the peaks in
`tpuready.calc.hardware`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tpuready.validate import InputError, whole_number

__all__ = ["Block", "TinyDecoder", "TinyDecoderError", "TinyTrainingStep"]


class TinyDecoderError(InputError):
    """Raised for a size the tiny decoder cannot take; an `InputError`, so a `ValueError`."""


def _size(name: str, value: object) -> int:
    return whole_number(name, value, fix="pass a positive whole number", error=TinyDecoderError)


class Block(nn.Module):
    """Pre-norm causal self-attention and a 4x-wide GELU MLP."""

    def __init__(self, hidden_size: int, num_heads: int) -> None:
        super().__init__()
        if _size("hidden_size", hidden_size) % _size("num_heads", num_heads):
            raise TinyDecoderError(
                f"hidden_size={hidden_size} is not a multiple of num_heads={num_heads}: "
                "pick sizes whose heads divide the width"
            )
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.attention_norm = nn.LayerNorm(hidden_size)
        self.qkv = nn.Linear(hidden_size, 3 * hidden_size)
        self.attention_out = nn.Linear(hidden_size, hidden_size)
        self.mlp_norm = nn.LayerNorm(hidden_size)
        self.up = nn.Linear(hidden_size, 4 * hidden_size)
        self.down = nn.Linear(4 * hidden_size, hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        head_dim = self.hidden_size // self.num_heads
        qkv = self.qkv(self.attention_norm(x))
        q, k, v = qkv.view(batch, seq, 3, self.num_heads, head_dim).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)
        future = torch.ones(seq, seq, dtype=torch.bool, device=x.device)
        scores = scores.masked_fill(future.triu(1), float("-inf"))
        mixed = (scores.softmax(dim=-1) @ v).transpose(1, 2)
        x = x + self.attention_out(mixed.reshape(batch, seq, self.hidden_size))
        return x + self.down(F.gelu(self.up(self.mlp_norm(x))))


class TinyDecoder(nn.Module):
    """Embeddings, `num_layers` blocks, a final norm and an output head."""

    def __init__(
        self,
        vocab_size: int = 512,
        hidden_size: int = 128,
        num_heads: int = 4,
        num_layers: int = 2,
        seq_len: int = 128,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(_size("vocab_size", vocab_size), hidden_size)
        self.position = nn.Embedding(_size("seq_len", seq_len), hidden_size)
        self.blocks = nn.ModuleList(
            Block(hidden_size, num_heads) for _ in range(_size("num_layers", num_layers))
        )
        self.norm = nn.LayerNorm(hidden_size)
        self.head = nn.Linear(hidden_size, vocab_size)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(token_ids) + self.position.weight[: token_ids.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


class TinyTrainingStep:
    """Chapter 21's training step: forward, loss, backward and AdamW on a fixed random batch.

    Call it to run one step; it returns the loss, detached. Seed before building it (the book
    calls `seed_everything(0)` first) to get chapter 21's weights and batch.
    """

    def __init__(self, device: torch.device, batch_size: int = 8, seq_len: int = 128) -> None:
        batch_size, seq_len = _size("batch_size", batch_size), _size("seq_len", seq_len)
        self.device = device
        self.model = TinyDecoder(seq_len=seq_len).to(device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=1e-3)
        vocab_size = self.model.embed.num_embeddings
        self.token_ids = torch.randint(0, vocab_size, (batch_size, seq_len), device=device)
        self.targets = torch.randint(0, vocab_size, (batch_size, seq_len), device=device)

    def __call__(self) -> torch.Tensor:
        on_accelerator = self.device.type != "cpu"
        with torch.autocast(self.device.type, torch.bfloat16, enabled=on_accelerator):
            logits = self.model(self.token_ids)
            loss = F.cross_entropy(logits.flatten(0, 1), self.targets.flatten())
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach()
