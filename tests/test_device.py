"""choose_device and seed_everything, tested by behaviour with a faked torch.accelerator."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest
import torch

from tpuready.runtime.device import choose_device, compile_backend_for, seed_everything


def fake_current_accelerator(answer: torch.device | None, calls: list[bool]):
    """A stand-in for `torch.accelerator.current_accelerator` that records `check_available`."""

    def current_accelerator(check_available: bool = False) -> torch.device | None:
        calls.append(check_available)
        return answer if check_available else torch.device("cuda")

    return current_accelerator


def test_choose_device_falls_back_to_the_cpu_when_no_accelerator_is_available(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A CUDA build on a machine without a GPU: the build's accelerator exists, none is usable.
    calls: list[bool] = []
    monkeypatch.setattr(
        torch.accelerator, "current_accelerator", fake_current_accelerator(None, calls)
    )
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)
    assert choose_device() == torch.device("cpu")
    assert calls == [True], "choose_device must ask for an available accelerator only"


# "privateuseone" is the slot TorchTPU renames to "tpu" when it loads.
@pytest.mark.parametrize("device_type", ["cuda", "mps", "xpu", "privateuseone"])
def test_choose_device_passes_an_available_accelerator_through(
    monkeypatch: pytest.MonkeyPatch, device_type: str
) -> None:
    accelerator = torch.device(device_type)
    calls: list[bool] = []
    monkeypatch.setattr(
        torch.accelerator, "current_accelerator", fake_current_accelerator(accelerator, calls)
    )
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    chosen = choose_device()
    assert chosen == accelerator
    assert isinstance(chosen, torch.device)
    assert calls == [True]


def test_choose_device_on_this_machine_is_usable() -> None:
    device = choose_device()
    assert (device.type == "cpu") != torch.accelerator.is_available(), device
    assert torch.ones(2, device=device).sum().item() == 2


def draws(device: torch.device) -> tuple[float, torch.Tensor, torch.Tensor]:
    """One draw from each generator seed_everything promises to seed."""
    return random.random(), torch.rand(4), torch.rand(4, device=device).cpu()


def test_seed_everything_repeats_python_cpu_and_accelerator_draws() -> None:
    device = choose_device()
    seed_everything(123)
    first = draws(device)
    seed_everything(123)
    second = draws(device)
    assert first[0] == second[0]
    assert torch.equal(first[1], second[1])
    assert torch.equal(first[2], second[2])


def test_seed_everything_seeds_the_accelerator_generators_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # torch.manual_seed forwards the seed to every registered accelerator's generator; record
    # what the CUDA hook receives, as it does on a GPU machine.
    seen: list[int] = []
    monkeypatch.setattr(torch.cuda, "manual_seed_all", seen.append)
    seed_everything(7)
    assert seen == [7]


def test_different_seeds_give_different_draws() -> None:
    device = choose_device()
    seed_everything(1)
    first = draws(device)
    seed_everything(2)
    second = draws(device)
    assert first[0] != second[0]
    assert not torch.equal(first[1], second[1])


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True, None])
def test_seed_everything_rejects_bad_seeds_by_name(bad: object) -> None:
    with pytest.raises(ValueError, match=f"seed must be a non-negative int, got {bad!r}"):
        seed_everything(bad)  # type: ignore[arg-type]


def test_compile_backend_counts_cheaply_everywhere_but_a_tpu():
    for device_type in ("cpu", "cuda", "xpu", "mps"):
        assert compile_backend_for(torch.device(device_type)) == "aot_eager"


def test_compile_backend_is_torch_compile_s_default_on_a_tpu():
    # torch.device("tpu") exists once PrivateUse1 is renamed, as TorchTPU does; a rename
    # lasts for the process, so it happens in a child.
    code = (
        "import torch\n"
        "from tpuready.runtime.device import compile_backend_for\n"
        "torch.utils.rename_privateuse1_backend('tpu')\n"
        "print(compile_backend_for(torch.device('tpu')))\n"
    )
    printed = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert printed.strip() == "None"


def test_compile_backend_refuses_a_device_name():
    with pytest.raises(TypeError, match=r"torch\.device"):
        compile_backend_for("cpu")
