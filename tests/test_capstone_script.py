"""The capstone's portable script on one process: its settings, its command line, its pipelines.

`notebooks/27_capstone_port_the_script.ipynb` imports `notebooks/examples/capstone_gpt_portable.py`
and shows that its fixed-length padding keeps the original's loss, that gradient accumulation
keeps the step, and that the loss falls. These tests hold the script to the same facts on a CPU,
eager and in float32 (a CPU's bfloat16 kernels are slow, and the comparisons measure the port,
not bfloat16 rounding), within the chapter's CPU tolerance: float32 sums in another order move a
loss by about a part in a million, so a relative 1e-5 (chapter 9, step 5).
"""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import NOTEBOOK_DIR

# The notebook imports the script as `examples.capstone_gpt_portable` from notebooks/; so do we.
if str(NOTEBOOK_DIR) not in sys.path:
    sys.path.insert(0, str(NOTEBOOK_DIR))

from examples.capstone_gpt_portable import (
    IGNORE,
    SEQ_LEN,
    Settings,
    make_loader,
    parse,
    step_batches,
    train,
    warmup_cosine,
)

LOSS_RTOL = 1e-5  # the chapter's tolerance on a CPU


def eager_losses(**choices: object) -> list[float]:
    """One eager float32 run of the portable script on the CPU: its loss per step."""
    return train(Settings(autocast="off", compile=False, **choices))["losses"]  # type: ignore[arg-type]


def largest_relative_gap(losses: list[float], reference: list[float]) -> float:
    assert len(losses) == len(reference)
    return max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))


@pytest.mark.parametrize(
    ("choices", "message"),
    [
        ({"shapes": "bucketed"}, "shapes must be one of .*'bucketed'"),
        ({"autocast": "fp16"}, "autocast must be one of .*'fp16'"),
        ({"steps": 0}, "steps must be >= 1: 0"),
        ({"batch_size": -8}, "batch_size must be >= 1: -8"),
        ({"accumulate": 0}, "accumulate must be >= 1: 0"),
        ({"save_at": 5}, "save_at=5 needs a checkpoint folder"),
        ({"save_every": 0, "checkpoint": "c"}, "save_every=0 needs a checkpoint folder and a step"),
    ],
)
def test_settings_refuse_bad_values_by_name(choices: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Settings(**choices)  # type: ignore[arg-type]


def test_the_command_line_maps_onto_settings() -> None:
    assert parse([]) == Settings()
    settings = parse(
        [
            "--steps", "7", "--batch-size", "4", "--accumulate", "2",
            "--shapes", "longest", "--autocast", "float16", "--no-compile",
            "--compile-backend", "aot_eager", "--checkpoint", "ckpt", "--save-at", "3",
        ]
    )  # fmt: skip
    assert settings == Settings(
        steps=7,
        batch_size=4,
        accumulate=2,
        shapes="longest",
        autocast="float16",
        compile=False,
        compile_backend="aot_eager",
        checkpoint="ckpt",
        save_at=3,
    )


def test_the_command_line_refuses_an_unknown_pipeline() -> None:
    with pytest.raises(SystemExit):
        parse(["--shapes", "bucketed"])


def test_fixed_padding_keeps_the_loss_of_padding_to_the_longest() -> None:
    # Pads after every real token, with ignored targets, under causal attention: the same loss.
    fixed = eager_losses(steps=6, batch_size=4, shapes="fixed")
    longest = eager_losses(steps=6, batch_size=4, shapes="longest")
    assert largest_relative_gap(fixed, longest) < LOSS_RTOL


def test_two_micro_batches_make_the_same_step_as_one_batch() -> None:
    whole = eager_losses(steps=6, accumulate=1)
    accumulated = eager_losses(steps=6, accumulate=2)
    assert largest_relative_gap(accumulated, whole) < LOSS_RTOL


def test_the_loss_falls() -> None:
    result = train(Settings(steps=16, autocast="off", compile=False))
    losses = result["losses"]
    assert result["device"] == "cpu" and result["world_size"] == 1
    assert result["last_step"] == 16 and len(losses) == 16
    assert losses[-1] < losses[0] - 0.5, losses


@pytest.mark.parametrize(
    ("batch_size", "world_size", "accumulate"), [(8, 3, 1), (8, 1, 3), (6, 2, 2)]
)
def test_a_batch_that_does_not_split_over_ranks_and_micro_batches_is_refused(
    batch_size: int, world_size: int, accumulate: int
) -> None:
    settings = Settings(batch_size=batch_size, accumulate=accumulate)
    with pytest.raises(ValueError, match=f"batch_size {batch_size} must split evenly"):
        make_loader(settings, 0, world_size)


def test_each_rank_gets_its_micro_batch() -> None:
    loader = make_loader(Settings(batch_size=8, accumulate=2), 1, 2)
    assert loader.batch_size == 2 and loader.drop_last


def test_packed_blocks_have_no_padding_and_one_shape() -> None:
    shapes = set()
    for inputs, targets in make_loader(Settings(shapes="packed"), 0, 1):
        assert not (targets == IGNORE).any()
        assert torch.equal(inputs[:, 1:], targets[:, :-1])  # targets are the next tokens
        shapes.add((tuple(inputs.shape), tuple(targets.shape)))
    assert shapes == {((8, SEQ_LEN), (8, SEQ_LEN))}


def test_fixed_padding_pads_at_the_end_with_ignored_targets() -> None:
    for inputs, targets in make_loader(Settings(shapes="fixed", batch_size=4), 0, 1):
        assert inputs.shape == targets.shape == (4, SEQ_LEN)
        real = targets != IGNORE
        # Once a row's targets are padding, they stay padding: no pad before a real token.
        assert torch.equal(real, real.cummin(dim=1).values)


def test_the_schedule_warms_up_then_decays_to_zero_for_any_length() -> None:
    for total in (1, 6, 7, 60):
        values = [warmup_cosine(step, total) for step in range(total + 1)]
        assert all(0 <= value <= 1 for value in values)
    assert warmup_cosine(59, 60) < 0.01


@pytest.mark.parametrize("items", [35, 36, 37, 40])
def test_every_rank_and_micro_batch_count_sees_the_same_global_batches(items: int) -> None:
    """Chapter 28's claim: step k trains on the same batch_size items for any number of ranks
    and micro-batches, also across an epoch's end (36 items, 8 a step, 2 micro-batches on 2
    ranks: a step that spans two shuffles would mix them)."""
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data.distributed import DistributedSampler

    batch_size, steps = 8, 12

    def global_batches(world_size: int, accumulate: int) -> list[set[int]]:
        streams = []
        for rank in range(world_size):
            dataset = TensorDataset(torch.arange(items))
            sampler = DistributedSampler(
                dataset, num_replicas=world_size, rank=rank, seed=0, drop_last=True
            )
            loader = DataLoader(  # as make_loader builds it
                dataset,
                batch_size=batch_size // (world_size * accumulate),
                sampler=sampler,
                drop_last=True,
            )
            streams.append(step_batches(loader, accumulate))
        return [
            {int(i) for stream in streams for (micro,) in next(stream) for i in micro}
            for _ in range(steps)
        ]

    one = global_batches(1, 1)
    assert all(len(batch) == batch_size for batch in one)
    for world_size, accumulate in [(1, 2), (2, 1), (2, 2), (4, 2), (8, 1)]:
        assert global_batches(world_size, accumulate) == one, (world_size, accumulate)


def test_save_every_keeps_each_step_and_resumes_from_the_newest(tmp_path) -> None:
    checkpoint = str(tmp_path / "checkpoint")
    eager_losses(steps=4, checkpoint=checkpoint, save_every=2)
    assert sorted(p.name for p in (tmp_path / "checkpoint").iterdir()) == ["step-2", "step-4"]
    resumed = eager_losses(steps=6, checkpoint=checkpoint)
    assert len(resumed) == 2  # steps 5 and 6 only
    torch.testing.assert_close(resumed, eager_losses(steps=6)[4:], rtol=LOSS_RTOL, atol=0)
