"""A checkpoint written as another machine would: it records that machine's device, loads by value
on this one, and the stand-in for malicious code runs only when code may run."""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tpuready.runtime.foreign_checkpoint import (
    ForeignCheckpointError,
    RunsCodeWhenLoaded,
    save_as_if_saved_on,
)


def recorded_devices(path) -> list[str]:
    """The device torch.load reads for each storage of the file at `path`."""
    seen: list[str] = []

    def keep_on_cpu(storage, location):
        seen.append(location)
        return storage

    torch.load(path, map_location=keep_on_cpu, weights_only=True)
    return seen


@given(
    device=st.builds(
        lambda kind, index: f"{kind}:{index}",
        st.sampled_from(["cuda", "tpu", "xpu", "mps"]),
        st.integers(min_value=0, max_value=4096),
    ),
    rows=st.integers(min_value=1, max_value=5),
)
def test_every_tensor_records_the_device_and_keeps_its_values(tmp_path_factory, device, rows):
    path = tmp_path_factory.mktemp("checkpoint") / "state.pt"
    state = {"weight": torch.arange(rows * 3.0).reshape(rows, 3), "bias": torch.ones(rows)}
    save_as_if_saved_on(state, path, device)
    assert recorded_devices(path) == [device, device]
    loaded = torch.load(path, map_location="cpu", weights_only=True)
    assert loaded.keys() == state.keys()
    for name, tensor in state.items():
        assert torch.equal(loaded[name], tensor), name


def test_a_cuda_checkpoint_needs_a_map_location_on_a_machine_without_cuda(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine could load a cuda:3 tensor (or refuse for another reason)")
    path = tmp_path / "from_cuda3.pt"
    save_as_if_saved_on({"weight": torch.zeros(2)}, path, "cuda:3")
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(path, weights_only=True)


@pytest.mark.parametrize(
    ("state", "device", "match"),
    [
        ({"w": torch.zeros(1)}, "cuda 3", r"'cuda 3'.*such as 'cuda:3'"),
        ({"w": torch.zeros(1)}, 3, r"got 3"),
        ({"w": torch.zeros(1, device="meta")}, "cuda:3", r"CPU tensors, got dict"),
        ([torch.zeros(1)], "cuda:3", r"CPU tensors, got list"),
    ],
)
def test_bad_input_names_the_value_and_the_fix(tmp_path, state, device, match):
    with pytest.raises(ForeignCheckpointError, match=match):
        save_as_if_saved_on(state, tmp_path / "state.pt", device)


def test_the_malicious_stand_in_runs_code_only_when_code_may_run(tmp_path, capsys):
    path = tmp_path / "trap.pt"
    torch.save({"weight": torch.zeros(1), "hook": RunsCodeWhenLoaded()}, path)
    with pytest.raises(pickle.UnpicklingError):
        torch.load(path, weights_only=True)
    assert capsys.readouterr().out == ""
    torch.load(path, weights_only=False)
    assert "ran while the checkpoint loaded" in capsys.readouterr().out
