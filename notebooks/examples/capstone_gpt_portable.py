"""capstone_gpt_cuda_only.py ported: the same GPT trains on CUDA, a TPU, MPS
or the CPU, on one process or many (chapters 27 and 28).

The device and, under a launcher, the backend come from one chooser
(`tpuready.runtime.launch.init_rank`); every batch has one shape (lines
packed into fixed blocks, or padded to one length, and `drop_last=True`);
autocast runs in bfloat16 by default on every device (a TPU's own type),
which needs no loss scaling; the model's blocks and the optimizer step are
compiled, with the learning rate held in a tensor so the schedule changes no
compiled graph; gradients accumulate over micro-batches; FSDP2 shards the
model when there are several ranks; the checkpoint is a distributed one that
resumes on any number of ranks. On one machine:

    python capstone_gpt_portable.py --steps 60
    python -m tpuready torchrun --standalone --nproc-per-node=8 \\
        capstone_gpt_portable.py --steps 60

`--shapes longest --autocast float16` keeps the original's pipeline and
precision, so each change can be measured on its own (chapter 27).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from tpuready.runtime.launch import init_rank, rank_device

CORPUS = Path(__file__).resolve().parent.parent / "data" / "tiny_corpus.txt"
VOCAB = 257  # 256 byte values and one end-of-line token
END_OF_LINE = 256
IGNORE = -100  # cross_entropy skips targets with this value
MAX_LEN = 128  # lines are cut to at most this many tokens
SEQ_LEN = 128  # every batch's length, a multiple of the MXU's 128
WARMUP_STEPS = 6
PEAK_LR = 3e-3


class _WithoutProfilerNotice(logging.Filter):
    """Drop Dynamo's notice that it skips the optimizer's profiler label
    when it compiles `optimizer.step` (the step runs the same)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Profiler record function" not in record.getMessage()


logging.getLogger("torch._dynamo.variables.ctx_manager").addFilter(
    _WithoutProfilerNotice()
)
SHAPES = ("packed", "fixed", "longest")
AUTOCAST = ("bfloat16", "float16", "off")


@dataclass(frozen=True)
class Settings:
    """One run's choices; the defaults are the port's."""

    steps: int = 60
    batch_size: int = 8  # sequences per optimizer step, over all ranks
    accumulate: int = 1  # micro-batches per optimizer step on each rank
    shapes: str = "packed"
    autocast: str = "bfloat16"
    compile: bool = True
    compile_backend: str | None = None  # None: the device's default
    checkpoint: str | None = None  # a folder: resume from it, save to it
    save_every: int | None = None  # save every this many steps
    save_at: int | None = None  # save at this step and stop
    workers: int = 0  # DataLoader worker processes

    def __post_init__(self) -> None:
        """Reject settings the run cannot honour, naming the value."""
        if self.shapes not in SHAPES:
            raise ValueError(
                f"shapes must be one of {SHAPES}: {self.shapes!r}"
            )
        if self.autocast not in AUTOCAST:
            raise ValueError(
                f"autocast must be one of {AUTOCAST}: {self.autocast!r}"
            )
        for name in ("save_every", "save_at"):
            value = getattr(self, name)
            if value is not None and (not self.checkpoint or value < 1):
                raise ValueError(
                    f"{name}={value} needs a checkpoint folder and a step >= 1"
                )
        for name in ("steps", "batch_size", "accumulate"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1: {getattr(self, name)}")


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


class PackedBlocks(Dataset):
    """The lines end to end, cut into blocks of SEQ_LEN + 1 tokens: no
    padding, one shape. Attention crosses line ends (chapter 17 masks it)."""

    def __init__(self, lines: Lines):
        stream = torch.cat(lines.lines)
        count = (len(stream) - 1) // SEQ_LEN
        self.blocks = [
            stream[i * SEQ_LEN : (i + 1) * SEQ_LEN + 1] for i in range(count)
        ]

    def __len__(self):
        return len(self.blocks)

    def __getitem__(self, index):
        return self.blocks[index]


def pad_to_longest(lines):
    """Inputs and next-token targets, padded to the batch's longest line."""
    inputs = pad_sequence([line[:-1] for line in lines], batch_first=True)
    targets = pad_sequence(
        [line[1:] for line in lines], batch_first=True, padding_value=IGNORE
    )
    return inputs, targets


def pad_to_seq_len(lines):
    """The same batch padded to SEQ_LEN: one shape, the same loss (the pads
    come after every real token, which causal attention never lets a real
    token see, and their targets are ignored)."""
    inputs, targets = pad_to_longest(lines)
    extra = SEQ_LEN - inputs.shape[1]
    return F.pad(inputs, (0, extra)), F.pad(targets, (0, extra), value=IGNORE)


def split_block(blocks):
    """Inputs and targets of packed blocks: every token is a real one."""
    stacked = torch.stack(blocks)
    return stacked[:, :-1], stacked[:, 1:]


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


def warmup_cosine(step, total):
    """The original's schedule: a linear warm-up, then a cosine to zero."""
    if step < WARMUP_STEPS:
        return (step + 1) / WARMUP_STEPS
    decay_steps = max(total - WARMUP_STEPS, 1)  # total may equal the warm-up
    progress = min((step - WARMUP_STEPS) / decay_steps, 1.0)
    return 0.5 * (1 + math.cos(math.pi * progress))


def make_loader(settings: Settings, rank: int, world_size: int) -> DataLoader:
    """This rank's share of every global batch; the same batches, in the same
    order, on any number of ranks (one seeded shuffle, split by rank)."""
    if settings.batch_size % (world_size * settings.accumulate):
        raise ValueError(
            f"batch_size {settings.batch_size} must split evenly over "
            f"{world_size} ranks x {settings.accumulate} micro-batches"
        )
    lines = Lines(CORPUS)
    dataset = PackedBlocks(lines) if settings.shapes == "packed" else lines
    collate = {
        "packed": split_block,
        "fixed": pad_to_seq_len,
        "longest": pad_to_longest,
    }[settings.shapes]
    sampler = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, seed=0, drop_last=True
    )
    return DataLoader(
        dataset,
        # One micro-batch of this rank's share of the step.
        batch_size=settings.batch_size // (world_size * settings.accumulate),
        sampler=sampler,
        collate_fn=collate,
        drop_last=True,  # a short last batch would be one more shape
        num_workers=settings.workers,
        # Page-locked batches for the current accelerator, so that
        # `non_blocking=True` copies overlap compute; none without one.
        pin_memory=torch.accelerator.is_available(),
    )


def batches(loader: DataLoader):
    """Batches forever, a new shuffle each epoch."""
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def step_batches(loader: DataLoader, accumulate: int):
    """The micro-batches of each optimizer step, forever. A step never spans
    two epochs (two shuffles): then every step's micro-batches, over all
    ranks, are the next batch_size items of one permutation, whatever the
    numbers of ranks and micro-batches."""
    epoch = 0
    while True:
        loader.sampler.set_epoch(epoch)
        micro_batches = []
        for batch in loader:
            micro_batches.append(batch)
            if len(micro_batches) == accumulate:
                yield micro_batches
                micro_batches = []
        epoch += 1  # an incomplete step's micro-batches are dropped


def train(settings: Settings) -> dict:
    """Train; return the losses of every step and what the run was."""
    distributed = dist.is_initialized()
    device = (
        rank_device()
        if distributed
        else torch.accelerator.current_accelerator(check_available=True)
        or torch.device("cpu")
    )
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)  # the same initial weights on every rank

    model = GPT().to(device)
    if distributed:
        mesh = init_device_mesh(device.type, (world_size,))
        # Under bfloat16 autocast, gather bfloat16 weights (half the bytes)
        # and reduce gradients in float32 (chapter 10, step 1).
        precision = MixedPrecisionPolicy(
            param_dtype=torch.bfloat16
            if settings.autocast == "bfloat16"
            else None,
            reduce_dtype=torch.float32,
        )
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=precision)
        fully_shard(model, mesh=mesh, mp_policy=precision)
    # No backend= unless one is asked for: torch.compile's default, which
    # TorchTPU replaces with its own for TPU inputs.
    backend = settings.compile_backend
    compile_options = {} if backend is None else {"backend": backend}
    if settings.compile:
        for block in model.blocks:
            block.compile(**compile_options)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        # A tensor, so the schedule's new value each step is data to the
        # compiled step, not a constant that would compile a new graph.
        lr=torch.tensor(PEAK_LR),
        weight_decay=0.1,
        # Compiled optimizer steps keep their step counts on the device;
        # torch 2.13 offers that on these accelerators, not on the CPU or MPS
        # (CUDA, XPU, HPU, XLA and PrivateUse1 backends such as TorchTPU).
        capturable=settings.compile and device.type not in ("cpu", "mps"),
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: warmup_cosine(step, settings.steps)
    )
    step = resume(settings, model, optimizer, scheduler)

    def optimizer_step():
        optimizer.step()

    if settings.compile:
        optimizer_step = torch.compile(optimizer_step, **compile_options)
    loader = make_loader(settings, rank, world_size)
    stream = step_batches(loader, settings.accumulate)
    for _ in range(step):
        next(stream)  # skip what the run before the checkpoint trained on
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}
    scaler = torch.amp.GradScaler(
        device.type, enabled=settings.autocast == "float16"
    )
    losses = []
    while step < settings.steps:
        step_loss = torch.zeros((), device=device)
        for micro, (inputs, targets) in enumerate(next(stream)):
            inputs = inputs.to(device, non_blocking=True)
            targets = targets.to(device, non_blocking=True)
            if distributed:  # reduce-scatter once, after the last one
                last = micro == settings.accumulate - 1
                model.set_requires_gradient_sync(last)
            with torch.autocast(
                device.type,
                dtype=dtype.get(settings.autocast),
                enabled=settings.autocast != "off",
            ):
                logits = model(inputs)
            loss = F.cross_entropy(
                logits.float().flatten(0, 1),
                targets.flatten(),
                ignore_index=IGNORE,
            )
            loss = loss / settings.accumulate
            scaler.scale(loss).backward()
            step_loss += loss.detach()
        scaler.unscale_(optimizer)
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if scaler.is_enabled():
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer_step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        step += 1
        if distributed:  # every rank's loss: the global batch's mean
            dist.all_reduce(step_loss)  # gloo has no AVG: sum, then divide
            step_loss /= world_size
        losses.append(step_loss)
        every = settings.save_every
        due = step in (settings.save_at, settings.steps) or (
            every is not None and step % every == 0
        )
        if settings.checkpoint and due:  # every rank saves its shards
            save(settings, model, optimizer, scheduler, step)
        if step == settings.save_at:
            break
    return {
        "settings": asdict(settings),
        "device": device.type,
        "world_size": world_size,
        "last_step": step,
        # One copy to the host at the end, not one per step.
        "losses": torch.stack(losses).tolist() if losses else [],
    }


def _dcp_quietly(function, *args, **kwargs):
    """Call a torch.distributed.checkpoint function; on one process without a
    group, hide only its notice that it saves or loads on one process."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable"
        )
        return function(*args, **kwargs)


def step_folder(checkpoint: str, step: int) -> str:
    """Where the checkpoint of `step` goes: a folder per saved step, so that a
    save never mixes its files with an older one's (TorchTitan's layout)."""
    return os.path.join(checkpoint, f"step-{step}")


def latest_step(checkpoint: str) -> int:
    """The newest complete step saved under `checkpoint`, 0 when none (DCP
    writes `.metadata` last: a save cut short has none and is skipped)."""
    if not os.path.isdir(checkpoint):
        return 0
    return max(
        (
            int(name.removeprefix("step-"))
            for name in os.listdir(checkpoint)
            if re.fullmatch(r"step-\d+", name)
            and os.path.isfile(os.path.join(checkpoint, name, ".metadata"))
        ),
        default=0,
    )


def save(settings, model, optimizer, scheduler, step) -> None:
    """Every rank writes its shards; any number of ranks can read them."""
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {
        "model": model_state,
        "optimizer": optimizer_state,
        "scheduler": scheduler.state_dict(),
        "step": step,
    }
    folder = step_folder(settings.checkpoint, step)
    _dcp_quietly(dcp.save, state, checkpoint_id=folder)


def resume(settings, model, optimizer, scheduler) -> int:
    """Load the checkpoint if there is one, resharded for these ranks; return
    the step it was saved at (0 without one)."""
    step = latest_step(settings.checkpoint) if settings.checkpoint else 0
    if step == 0:
        return 0
    model_state, optimizer_state = get_state_dict(model, optimizer)
    state = {
        "model": model_state,
        "optimizer": optimizer_state,
        "scheduler": scheduler.state_dict(),
        "step": 0,
    }
    folder = step_folder(settings.checkpoint, step)
    _dcp_quietly(dcp.load, state, checkpoint_id=folder)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict=state["optimizer"],
    )
    scheduler.load_state_dict(state["scheduler"])
    return state["step"]


def worker(rank: int, world_size: int, settings: dict) -> dict:
    """`tpuready.runtime.launch.run_workers`'s entry: the group is joined."""
    return train(Settings(**settings))


def parse(argv: Sequence[str] | None = None) -> Settings:
    """Settings from the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Settings()
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        if isinstance(value, bool):
            parser.add_argument(flag, action=argparse.BooleanOptionalAction)
        elif name in ("shapes", "autocast"):
            choices = SHAPES if name == "shapes" else AUTOCAST
            parser.add_argument(flag, choices=choices)
        else:
            kind = str if name in ("checkpoint", "compile_backend") else int
            parser.add_argument(flag, type=kind)
    parser.set_defaults(**asdict(defaults))
    return Settings(**vars(parser.parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> None:
    """Train as the command line says; under torchrun, on every rank."""
    settings = parse(argv)
    launched = "RANK" in os.environ  # torchrun started this process
    if launched:
        init_rank()  # this rank's backend and device, from one chooser
    result = train(settings)
    if result["device"] != "cpu":
        try:
            peak = torch.accelerator.max_memory_allocated() / 2**20
            result["peak_mib"] = round(peak)
        except RuntimeError:
            # No allocator statistics: the emulated TPU raises so; whether
            # TorchTPU 0.2.0 keeps them is not recorded.
            result["peak_mib"] = None
    if not launched or dist.get_rank() == 0:  # the same on every rank
        print(json.dumps(result))
    if launched:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
