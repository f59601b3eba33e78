"""The CUDA -> torch.accelerator table that chapter 2 renders and the audit suggests from."""

from __future__ import annotations

import importlib
import inspect
import re
import typing

import pytest
import torch

from tpuready import accelerator_api
from tpuready.accelerator_api import (
    CUDA_TO_ACCELERATOR,
    NOT_PUBLIC,
    PUBLIC,
    RAISES,
    TORCH_TPU_PUBLIC_NAMES,
    TORCH_TPU_REFUSED_CALLS,
    equivalent_for,
)
from tpuready.pages.accelerator_api import markdown_table

# Chapter 2's text column is 688 px wide at a 1280 px window, and inline code takes 8.5 px per
# character (measured in Chromium on the built site). A code span cannot wrap, so the widest
# span plus the status column (its longest word, about 110 px) and the cell padding (32 px)
# must fit: 56 characters leave room, the 51 of the longest replacement today fit.
LONGEST_CODE_SPAN = 56


def resolve(dotted: str) -> object:
    """Follow a dotted name such as `torch.accelerator.synchronize` to the object."""
    parts = dotted.split(".")
    target: object = importlib.import_module(parts[0])
    for part in parts[1:]:
        target = getattr(target, part)
    return target


def table_rows() -> list[list[str]]:
    """The cells of each body row of the rendered table."""
    rows = [line for line in markdown_table().splitlines() if line.startswith("| ")][1:]
    return [[cell.strip() for cell in row.strip("|").split(" | ")] for row in rows]


def table_notes() -> dict[int, str]:
    """The numbered notes under the table, by number."""
    return {
        int(match[1]): match[2]
        for match in re.finditer(r"^(\d+)\. (.*)$", markdown_table(), flags=re.MULTILINE)
    }


# --- the table names real calls ------------------------------------------------------------


@pytest.mark.parametrize("entry", CUDA_TO_ACCELERATOR, ids=lambda entry: entry.name)
def test_every_replacement_exists_in_this_torch(entry) -> None:
    callable_name = entry.replacement.split("(")[0]
    assert callable(resolve(callable_name)), entry.replacement


@pytest.mark.parametrize("entry", CUDA_TO_ACCELERATOR, ids=lambda entry: entry.name)
def test_every_cuda_call_exists_in_torch_cuda(entry) -> None:
    assert callable(resolve(entry.cuda_call.split("(")[0])), entry.cuda_call


def test_the_replacements_never_name_cuda() -> None:
    # Except as the device type a choice compares with (loss scaling only on CUDA).
    named = [e.replacement.replace('device.type == "cuda"', "") for e in CUDA_TO_ACCELERATOR]
    assert [replacement for replacement in named if "cuda" in replacement] == []


# --- the replacements do what the CUDA call did ---------------------------------------------


def test_the_rng_state_replacement_reads_the_device_generator_not_the_cpu_one(
    monkeypatch,
) -> None:
    # Evaluate the suggested spelling with `device` a CUDA device: it must reach
    # torch.cuda.get_rng_state (stubbed here), as the CUDA-only call did.
    device_state = torch.tensor([7, 7, 7], dtype=torch.uint8)
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda *args, **kwargs: device_state)
    replacement = equivalent_for("get_rng_state").replacement
    state = eval(replacement, {"torch": torch, "device": torch.device("cuda")})
    assert state is device_state


def test_what_the_rng_note_says_about_this_torch_holds() -> None:
    # Note: `torch.cpu` has no get_rng_state, so fork_rng(device_type="cpu") raises;
    # fork_rng(devices=[]) restores the CPU generator around a block, and a Generator of
    # its own saves and restores its state on the host.
    note = equivalent_for("get_rng_state").note
    assert "fork_rng(devices=[])" in note and "torch.Generator()" in note
    assert not hasattr(torch.cpu, "get_rng_state")
    with pytest.raises(AttributeError), torch.random.fork_rng(device_type="cpu"):
        pass
    before = torch.get_rng_state()
    with torch.random.fork_rng(devices=[]):
        torch.rand(4)
    assert torch.equal(torch.get_rng_state(), before)
    generator = torch.Generator().manual_seed(0)
    saved = generator.get_state()
    first_draw = torch.rand(4, generator=generator)
    generator.set_state(saved)
    assert torch.equal(torch.rand(4, generator=generator), first_draw)


def test_the_capability_note_matches_this_torch() -> None:
    returns = inspect.signature(torch.accelerator.get_device_capability).return_annotation
    assert typing.get_origin(returns) is dict
    assert "returns a dict" in equivalent_for("get_device_capability").note


# --- what TorchTPU 0.2.0 does with the same call under torch.tpu -----------------------------


def test_no_name_is_both_public_and_refused() -> None:
    assert TORCH_TPU_PUBLIC_NAMES.isdisjoint(TORCH_TPU_REFUSED_CALLS)


def test_every_call_torch_tpu_refuses_is_in_the_table() -> None:
    names = {entry.name for entry in CUDA_TO_ACCELERATOR}
    assert names >= TORCH_TPU_REFUSED_CALLS


@pytest.mark.parametrize(
    ("name", "status"),
    [
        ("synchronize", RAISES),
        ("set_device", RAISES),
        ("get_rng_state", f"{RAISES} (on torch >= 2.13)"),
        ("initial_seed", f"{RAISES} (on torch >= 2.13)"),
        ("manual_seed", PUBLIC),
        ("Event", PUBLIC),
        ("empty_cache", NOT_PUBLIC),
        ("memory_allocated", NOT_PUBLIC),
        ("mem_get_info", NOT_PUBLIC),
        ("get_device_capability", NOT_PUBLIC),
        ("amp.autocast", NOT_PUBLIC),
        ("amp.GradScaler", NOT_PUBLIC),
    ],
)
def test_torch_tpu_status(name: str, status: str) -> None:
    assert equivalent_for(name).torch_tpu_status == status
    assert equivalent_for(name).refused_by_torch_tpu == status.startswith(RAISES)


def test_status_follows_the_lists(monkeypatch) -> None:
    monkeypatch.setattr(accelerator_api, "TORCH_TPU_PUBLIC_NAMES", frozenset({"empty_cache"}))
    assert equivalent_for("empty_cache").torch_tpu_status == PUBLIC
    assert equivalent_for("memory_stats").torch_tpu_status == NOT_PUBLIC


# --- lookups --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "replacement"),
    [
        ("synchronize", "torch.accelerator.synchronize()"),
        ("torch.cuda.device_count", "torch.accelerator.device_count()"),
        ("current_device", "torch.accelerator.current_device_index()"),
        ("mem_get_info", "torch.accelerator.get_memory_info()"),
        ("amp.autocast", "torch.amp.autocast(device_type=device.type)"),
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


# --- the rendered table ---------------------------------------------------------------------


def test_the_table_has_one_row_per_entry_in_order() -> None:
    rows = table_rows()
    assert len(rows) == len(CUDA_TO_ACCELERATOR)
    for row, entry in zip(rows, CUDA_TO_ACCELERATOR, strict=True):
        assert row[0].startswith(f"`{entry.cuda_call}` → `{entry.replacement}`"), row
        assert row[1] == entry.torch_tpu_status


def test_no_cell_is_empty() -> None:
    for row in table_rows():
        assert len(row) == 2 and all(cell for cell in row), row


def test_every_note_marker_points_at_that_entrys_note() -> None:
    notes = table_notes()
    for row, entry in zip(table_rows(), CUDA_TO_ACCELERATOR, strict=True):
        marker = re.search(r"\(note\s(\d+)\)", row[0])
        if not entry.note:
            assert marker is None, row
            continue
        assert marker is not None, row
        assert notes[int(marker[1])].lower().startswith(entry.note[:20].lower()), row


def test_a_note_shared_by_several_calls_is_written_once() -> None:
    notes = list(table_notes().values())
    assert len(notes) == len(set(notes))
    assert sum("allocator statistics" in note for note in notes) == 2  # memory_*, mem_get_info


def test_notes_read_as_sentences() -> None:
    for note in table_notes().values():
        assert note.endswith(".") and not note[0].islower(), note


def test_the_table_fits_the_text_column() -> None:
    code_spans = re.findall(r"`([^`]+)`", "\n".join(" ".join(row) for row in table_rows()))
    unbreakable = max((word for span in code_spans for word in span.split()), key=len)
    assert len(unbreakable) <= LONGEST_CODE_SPAN, unbreakable
    assert all(len(row) == 2 for row in table_rows())
