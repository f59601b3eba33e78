"""The CUDA -> torch.accelerator table that chapter 1 renders and the audit suggests from."""

from __future__ import annotations

import importlib

import pytest
import torch

from tpuready.accelerator_api import (
    CUDA_TO_ACCELERATOR,
    TORCH_TPU_REFUSED_CALLS,
    equivalent_for,
    markdown_table,
)


def resolve(dotted: str) -> object:
    """Follow a dotted name such as `torch.accelerator.synchronize` to the object."""
    parts = dotted.split(".")
    target: object = importlib.import_module(parts[0])
    for part in parts[1:]:
        target = getattr(target, part)
    return target


@pytest.mark.parametrize("entry", CUDA_TO_ACCELERATOR, ids=lambda entry: entry.name)
def test_every_replacement_exists_in_this_torch(entry) -> None:
    callable_name = entry.replacement.split("(")[0]
    assert callable(resolve(callable_name)), entry.replacement


@pytest.mark.parametrize("entry", CUDA_TO_ACCELERATOR, ids=lambda entry: entry.name)
def test_every_cuda_call_exists_in_torch_cuda(entry) -> None:
    assert callable(resolve(entry.cuda_call.split("(")[0])), entry.cuda_call


def test_the_replacements_never_name_cuda() -> None:
    assert [e.replacement for e in CUDA_TO_ACCELERATOR if "cuda" in e.replacement] == []


def test_every_call_torch_tpu_refuses_is_in_the_table() -> None:
    names = {entry.name for entry in CUDA_TO_ACCELERATOR}
    assert names >= TORCH_TPU_REFUSED_CALLS


def test_refused_flag_follows_the_torch_tpu_list() -> None:
    assert equivalent_for("synchronize").refused_by_torch_tpu
    assert not equivalent_for("empty_cache").refused_by_torch_tpu


@pytest.mark.parametrize(
    ("name", "replacement"),
    [
        ("synchronize", "torch.accelerator.synchronize()"),
        ("torch.cuda.device_count", "torch.accelerator.device_count()"),
        ("amp.autocast", "torch.amp.autocast(device_type=device.type, dtype=torch.bfloat16)"),
    ],
)
def test_lookup_by_attribute_name(name: str, replacement: str) -> None:
    assert equivalent_for(name).replacement == replacement


def test_unknown_call_has_no_equivalent() -> None:
    assert equivalent_for("nvtx.range_push") is None


@pytest.mark.parametrize("bad", ["", None, 3])
def test_bad_lookup_names_the_value(bad) -> None:
    with pytest.raises(ValueError, match=repr(bad)):
        equivalent_for(bad)


def test_markdown_table_has_one_row_per_entry_and_marks_refusals() -> None:
    rows = markdown_table().splitlines()[2:]
    assert len(rows) == len(CUDA_TO_ACCELERATOR)
    refused_rows = [row for row in rows if "raises RuntimeError" in row]
    assert len(refused_rows) == len(TORCH_TPU_REFUSED_CALLS)


def test_torch_cpu_build_has_no_accelerator() -> None:
    # The fallback chapter 1 teaches exists because this returns None on a CPU-only machine.
    assert torch.accelerator.current_accelerator() is None
