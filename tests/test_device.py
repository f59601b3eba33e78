"""The one device variable and the one seed every chapter starts with."""

from __future__ import annotations

import random

import pytest
import torch

from tpuready.device import choose_device, seed_everything


def test_choose_device_falls_back_to_cpu_without_an_accelerator() -> None:
    expected = torch.accelerator.current_accelerator(check_available=True)
    assert choose_device() == (expected or torch.device("cpu"))
    assert isinstance(choose_device(), torch.device)


def test_seed_everything_makes_python_and_torch_repeat() -> None:
    seed_everything(123)
    first = (random.random(), torch.rand(3))
    seed_everything(123)
    second = (random.random(), torch.rand(3))
    assert first[0] == second[0]
    assert torch.equal(first[1], second[1])


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True, None])
def test_seed_everything_rejects_bad_seeds_by_name(bad) -> None:
    with pytest.raises(ValueError, match="seed must be a non-negative int"):
        seed_everything(bad)
