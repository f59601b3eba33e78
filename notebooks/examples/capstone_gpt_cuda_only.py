"""A small GPT trained as CUDA scripts are written: the capstone's "before".

Chapters 27 and 28 port this file, line by line, to any device. It is the
shape of the scripts porters bring: a byte-level GPT over a text corpus,
lines padded to the longest in each batch, AdamW with warm-up and a cosine
schedule, float16 autocast with a GradScaler, DDP, torch.compile, a
checkpoint that resumes, and a data loader written for CUDA. Launch it with
one process per GPU:

    torchrun --standalone --nproc-per-node=4 capstone_gpt_cuda_only.py

On a machine without a CUDA GPU it stops at `torch.cuda.set_device`.
capstone_gpt_portable.py in this folder is the same training, ported.
"""

import math
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

CORPUS = Path(__file__).resolve().parent.parent / "data" / "tiny_corpus.txt"
CHECKPOINT = "checkpoint.pt"
VOCAB = 257  # 256 byte values and one end-of-line token
END_OF_LINE = 256
IGNORE = -100  # cross_entropy skips targets with this value
MAX_LEN = 128  # lines are cut to at most this many tokens
BATCH_SIZE = 8
MAX_STEPS = 60
WARMUP_STEPS = 6
PEAK_LR = 3e-3


class Lines(Dataset):
    """Each sentence of the corpus as bytes and an end-of-line token."""

    def __init__(self, path):
        text = path.read_text(encoding="utf-8").replace("\n", " ")
        sentences = [s.strip() + "." for s in text.split(".") if s.strip()]
        self.lines = [
            torch.tensor([*s.encode()[: MAX_LEN - 1], END_OF_LINE])
            for s in sentences
        ]

    def __len__(self):
        return len(self.lines)

    def __getitem__(self, index):
        return self.lines[index]


def pad_to_longest(lines):
    """Inputs and next-token targets, padded to the batch's longest line."""
    inputs = pad_sequence([line[:-1] for line in lines], batch_first=True)
    targets = pad_sequence(
        [line[1:] for line in lines], batch_first=True, padding_value=IGNORE
    )
    return inputs, targets


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width)
        )

    def forward(self, x):
        batch, length, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(width, dim=-1)
        q, k, v = (
            t.view(batch, length, self.heads, -1).transpose(1, 2)
            for t in (q, k, v)
        )
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(
            attended.transpose(1, 2).reshape(batch, length, width)
        )
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, width=64, heads=4, layers=2):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Embedding(MAX_LEN, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)
        self.head.weight = self.embed.weight  # tied
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, tokens):
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.position(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def warmup_cosine(step):
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    progress = (step - WARMUP_STEPS) / (MAX_STEPS - WARMUP_STEPS)
    return 0.5 * (1 + math.cos(math.pi * progress))


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    distributed = "WORLD_SIZE" in os.environ
    torch.cuda.set_device(local_rank)
    if distributed:
        dist.init_process_group("nccl")
    rank = dist.get_rank() if distributed else 0
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)

    dataset = Lines(CORPUS)
    sampler = DistributedSampler(dataset, seed=0) if distributed else None
    loader = DataLoader(
        dataset,
        batch_size=BATCH_SIZE,
        shuffle=sampler is None,
        sampler=sampler,
        collate_fn=pad_to_longest,
        num_workers=2,
        pin_memory=True,
        pin_memory_device="cuda",
    )

    model = GPT().cuda()
    if distributed:
        model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=PEAK_LR, weight_decay=0.1, fused=True
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_cosine)
    scaler = torch.cuda.amp.GradScaler()
    step = 0
    if os.path.exists(CHECKPOINT):
        state = torch.load(CHECKPOINT, map_location=f"cuda:{local_rank}")
        getattr(model, "module", model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step = state["step"]
    compiled = torch.compile(model, mode="reduce-overhead")

    epoch = 0
    while step < MAX_STEPS:
        if sampler is not None:
            sampler.set_epoch(epoch)
        for inputs, targets in loader:
            inputs = inputs.cuda(non_blocking=True)
            targets = targets.to("cuda", non_blocking=True)
            with torch.cuda.amp.autocast(dtype=torch.float16):
                logits = compiled(inputs)
                loss = F.cross_entropy(
                    logits.flatten(0, 1),
                    targets.flatten(),
                    ignore_index=IGNORE,
                )
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            step += 1
            if rank == 0 and step % 10 == 0:
                torch.cuda.synchronize()
                memory = torch.cuda.max_memory_allocated() / 2**20
                print(f"step {step}: loss {loss.item():.3f}, {memory:.0f} MiB")
            if step == MAX_STEPS:
                break
        epoch += 1
        if rank == 0:
            torch.save(
                {
                    "model": getattr(model, "module", model).state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "step": step,
                },
                CHECKPOINT,
            )
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
