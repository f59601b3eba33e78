"""Tests for tpuready.inspection.syncs: what the host-sync counter counts, and the explain
wrapper."""

from __future__ import annotations

import importlib
import logging
import re
from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuready.inspection.syncs import (
    COPY_TO_HOST,
    DATA_DEPENDENT_SHAPE,
    VALUE_READ,
    GraphBreak,
    GraphReport,
    HostSyncCounter,
    adam_step_counter_reads,
    explain_graphs,
    quiet_compiler_logs,
)

VALUES = torch.tensor([[0.5, -1.5, 2.0], [-0.25, 3.0, -2.0]])
SCALAR = VALUES.sum()
MASK = VALUES > 0

# Each call that makes an accelerator's host wait, with the name and kind the counter gives it.
SYNCING_CALLS: dict[str, tuple[Callable[[], object], str, str]] = {
    "item": (lambda: SCALAR.item(), "Tensor.item", VALUE_READ),
    "if on a tensor": (lambda: 1 if SCALAR > 0 else 0, "Tensor.__bool__", VALUE_READ),
    "float": (lambda: float(SCALAR), "Tensor.__float__", VALUE_READ),
    "int": (lambda: int(SCALAR), "Tensor.__int__", VALUE_READ),
    "tensor as index": (
        lambda: [0, 1, 2, 3, 4, 5][VALUES.argmax()],
        "Tensor.__index__",
        VALUE_READ,
    ),
    "in": (lambda: 0.5 in VALUES, "Tensor.__contains__", VALUE_READ),
    "f-string": (lambda: f"{SCALAR:.3f}", "Tensor.__format__", VALUE_READ),
    "repr": (lambda: repr(VALUES), "Tensor.__repr__", VALUE_READ),
    "equal": (lambda: torch.equal(VALUES, VALUES), "aten.equal", VALUE_READ),
    "allclose": (lambda: torch.allclose(VALUES, VALUES), "aten.allclose", VALUE_READ),
    "cpu": (lambda: SCALAR.cpu(), "Tensor.cpu", COPY_TO_HOST),
    "tolist": (lambda: VALUES.tolist(), "Tensor.tolist", COPY_TO_HOST),
    "numpy": (lambda: VALUES.numpy(), "Tensor.numpy", COPY_TO_HOST),
    "np.asarray": (lambda: np.asarray(VALUES), "Tensor.__array__", COPY_TO_HOST),
    "nonzero": (lambda: torch.nonzero(VALUES), "aten.nonzero", DATA_DEPENDENT_SHAPE),
    "where(cond)": (lambda: torch.where(MASK), "aten.nonzero", DATA_DEPENDENT_SHAPE),
    "masked_select": (
        lambda: torch.masked_select(VALUES, MASK),
        "aten.masked_select",
        DATA_DEPENDENT_SHAPE,
    ),
    "unique": (lambda: torch.unique(VALUES), "aten._unique2", DATA_DEPENDENT_SHAPE),
    "bincount": (
        lambda: torch.bincount(torch.tensor([0, 2])),
        "aten.bincount",
        DATA_DEPENDENT_SHAPE,
    ),
    "repeat_interleave": (
        lambda: torch.repeat_interleave(torch.tensor([1, 2])),
        "aten.repeat_interleave (no output_size)",
        DATA_DEPENDENT_SHAPE,
    ),
    "boolean mask read": (lambda: VALUES[MASK], "aten.index (boolean mask)", DATA_DEPENDENT_SHAPE),
    "boolean mask write": (
        lambda: VALUES.clone().__setitem__(MASK, 0.0),
        "aten.index_put_ (boolean mask)",
        DATA_DEPENDENT_SHAPE,
    ),
}

# Their device-side replacements, and other calls that never make the host wait.
DEVICE_SIDE_CALLS: dict[str, Callable[[], object]] = {
    "arithmetic": lambda: (VALUES * 2 + 1).sum(),
    "comparison kept as a tensor": lambda: SCALAR > 0,
    "torch.minimum": lambda: torch.minimum(SCALAR, SCALAR * 2),
    "where(cond, a, b)": lambda: torch.where(MASK, VALUES, 0.0),
    "masked_fill": lambda: VALUES.masked_fill(MASK, 0.0),
    "count of a mask": lambda: MASK.sum(),
    "integer indexing": lambda: VALUES[torch.tensor([1, 0])],
    "slicing": lambda: VALUES[:, 1:],
    "nonzero_static": lambda: torch.nonzero_static(MASK, size=6),
    "repeat_interleave with output_size": lambda: torch.repeat_interleave(
        torch.tensor([1, 2]), output_size=3
    ),
    "dtype change": lambda: VALUES.to(torch.float64),
    "detach and clone": lambda: VALUES.detach().clone(),
}


@pytest.mark.parametrize("name", sorted(SYNCING_CALLS))
def test_each_syncing_call_counts_once_with_its_name_and_kind(name: str) -> None:
    call, expected_name, expected_kind = SYNCING_CALLS[name]
    with HostSyncCounter() as syncs:
        call()
    assert syncs.by_call() == {expected_name: 1}
    assert syncs.by_kind()[expected_kind] == 1
    assert syncs.count == 1


@pytest.mark.parametrize("name", sorted(DEVICE_SIDE_CALLS))
def test_device_side_calls_count_zero(name: str) -> None:
    with HostSyncCounter() as syncs:
        DEVICE_SIDE_CALLS[name]()
    assert syncs.count == 0, syncs.by_call()


def test_print_counts_once_although_dispatch_modes_see_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with HostSyncCounter() as syncs:
        print(VALUES)
    assert syncs.by_call() == {"Tensor.__repr__": 1}
    assert "tensor(" in capsys.readouterr().out


def test_reads_inside_a_kernel_are_not_counted() -> None:
    # torch's CPU grouped_mm reads each of its 4 offsets inside its kernel: the profiler,
    # which records every dispatched op, sees them; the counter watches only the calls the
    # code makes, so it counts none (the limit chapter 4 states).
    inputs, weights = torch.randn(10, 8), torch.randn(4, 8, 8)
    offsets = torch.tensor([2, 5, 5, 10], dtype=torch.int32)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as profile, HostSyncCounter() as syncs:
        F.grouped_mm(inputs, weights, offs=offsets)
    names = [event.name for event in profile.events()]
    assert names.count("aten::_local_scalar_dense") == len(offsets)
    assert syncs.count == 0, syncs.by_call()
    with HostSyncCounter() as syncs:  # the same read, made by the code, counts
        offsets[0].item()
    assert syncs.count == 1


def test_reads_outside_the_block_are_not_counted() -> None:
    SCALAR.item()
    with HostSyncCounter() as syncs:
        SCALAR.item()
    SCALAR.item()
    assert syncs.count == 1


def test_entering_an_active_counter_again_raises() -> None:
    counter = HostSyncCounter()
    with counter, pytest.raises(RuntimeError, match="already active"), counter:
        pass


def test_by_call_orders_by_frequency_then_name() -> None:
    with HostSyncCounter() as syncs:
        VALUES.tolist()
        SCALAR.item()
        SCALAR.item()
        VALUES.numpy()
    assert list(syncs.by_call().items()) == [
        ("Tensor.item", 2),
        ("Tensor.numpy", 1),
        ("Tensor.tolist", 1),
    ]
    assert syncs.by_kind() == {VALUE_READ: 2, COPY_TO_HOST: 2, DATA_DEPENDENT_SHAPE: 0}


def test_device_filter_skips_tensors_on_other_devices() -> None:
    with HostSyncCounter(device="meta") as syncs:
        SCALAR.item()
        VALUES[MASK]
    assert syncs.count == 0


def test_copies_from_a_non_cpu_device_count_at_the_aten_level() -> None:
    # A meta tensor stands in for an accelerator's: the copy is counted before it fails.
    device_tensor = torch.empty(3, device="meta")
    with HostSyncCounter(device="meta") as syncs:
        with pytest.raises(NotImplementedError):
            device_tensor.to("cpu")
        with pytest.raises(NotImplementedError):
            device_tensor.cpu()
    assert syncs.by_call() == {"Tensor.cpu": 1, "aten._to_copy": 1}


def _one_adamw_step(**options: object) -> tuple[torch.optim.Optimizer, torch.Tensor]:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, **options)
    loss = model(VALUES).pow(2).mean()
    loss.backward()
    return optimizer, loss


def test_optimizer_step_counters_are_skipped_only_when_named() -> None:
    optimizer, loss = _one_adamw_step()
    with HostSyncCounter() as everything:
        optimizer.step()
    # The default AdamW on a CPU reads one CPU step counter per parameter (weight and bias).
    assert everything.by_call() == {"Tensor.item": 2}

    optimizer, loss = _one_adamw_step()
    with HostSyncCounter(optimizers=[optimizer]) as syncs:
        optimizer.step()
        loss.item()  # a real read of a computed value still counts
    assert syncs.by_call() == {"Tensor.item": 1}


def test_named_optimizers_skip_both_reads_of_the_foreach_implementation() -> None:
    # foreach, the default on an accelerator, reads each step counter twice per step.
    optimizer, loss = _one_adamw_step(foreach=True)
    with HostSyncCounter() as everything:
        optimizer.step()
    assert everything.by_call() == {"Tensor.item": 4}  # 2 parameters, 2 reads each

    optimizer, loss = _one_adamw_step(foreach=True)
    with HostSyncCounter(optimizers=[optimizer]) as syncs:
        optimizer.step()
        optimizer.step()  # the second step reads the same counters again
        loss.item()
    assert syncs.by_call() == {"Tensor.item": 1}


@pytest.mark.parametrize(("foreach", "reads"), [(False, 1), (True, 2)])
def test_each_adamw_implementation_reads_step_counters_as_documented(
    foreach: bool, reads: int
) -> None:
    optimizer, _ = _one_adamw_step(foreach=foreach)
    with HostSyncCounter() as syncs:
        optimizer.step()
    num_parameters = 2  # weight and bias
    assert syncs.by_call() == {"Tensor.item": reads * num_parameters}


# The module that defines torch's foreach device list, and the one Adam's default reads it from.
FOREACH_LIST_READERS = ("utils._foreach_utils", "optim.optimizer")


@pytest.mark.parametrize("cpu_on_foreach_list", [False, True])
def test_adam_step_counter_reads_follows_torchs_foreach_list(
    monkeypatch: pytest.MonkeyPatch, cpu_on_foreach_list: bool
) -> None:
    # torch's foreach device list decides AdamW's default implementation. Put the CPU on it
    # (in both places torch reads it), and a real step's reads and the function move together.
    modules = [importlib.import_module(f"torch.{name}") for name in FOREACH_LIST_READERS]
    listed = modules[0]._get_foreach_kernels_supported_devices()
    if cpu_on_foreach_list:

        def with_cpu() -> list[str]:
            return [*listed, "cpu"]

        for module in modules:
            monkeypatch.setattr(module, "_get_foreach_kernels_supported_devices", with_cpu)
    reads = adam_step_counter_reads("cpu")
    assert reads == (2 if cpu_on_foreach_list else 1)
    optimizer, _ = _one_adamw_step()
    with HostSyncCounter() as syncs:
        optimizer.step()
    assert syncs.by_call() == {"Tensor.item": reads * 2}  # weight and bias


def test_adam_step_counter_reads_on_accelerators_and_the_cpu() -> None:
    privateuse1 = torch._C._get_privateuse1_backend_name()  # "tpu" once TorchTPU renames it
    for accelerator in ("cuda", "xpu", torch.device("cuda", 1), privateuse1):
        assert adam_step_counter_reads(accelerator) == 2, accelerator
    for host_or_shape_only in ("cpu", torch.device("cpu"), "meta"):
        assert adam_step_counter_reads(host_or_shape_only) == 1, host_or_shape_only


@pytest.mark.parametrize(
    ("bad", "error", "shown"),
    [
        (0, TypeError, "got 0 (int)"),
        (None, TypeError, "got None (NoneType)"),
        ("nonsense", ValueError, "got 'nonsense'"),
        ("", ValueError, "got ''"),
    ],
)
def test_adam_step_counter_reads_names_a_bad_device(
    bad: object, error: type[Exception], shown: str
) -> None:
    with pytest.raises(error, match=re.escape(shown)):
        adam_step_counter_reads(bad)  # type: ignore[arg-type]


def test_optimizers_must_be_optimizers() -> None:
    with pytest.raises(TypeError, match="Linear"):
        HostSyncCounter(optimizers=[torch.nn.Linear(2, 2)])  # type: ignore[list-item]


SYNC_NAMES = sorted(SYNCING_CALLS)
DEVICE_SIDE_NAMES = sorted(DEVICE_SIDE_CALLS)


@settings(max_examples=40)
@given(
    st.lists(st.sampled_from([*SYNC_NAMES, *DEVICE_SIDE_NAMES]), min_size=0, max_size=12),
)
def test_count_equals_the_number_of_syncing_calls_in_any_sequence(names: list[str]) -> None:
    with HostSyncCounter() as syncs:
        for name in names:
            if name in SYNCING_CALLS:
                SYNCING_CALLS[name][0]()
            else:
                DEVICE_SIDE_CALLS[name]()
    expected_names = [SYNCING_CALLS[name][1] for name in names if name in SYNCING_CALLS]
    assert syncs.count == len(expected_names)
    assert sum(syncs.by_call().values()) == syncs.count
    for expected_name in set(expected_names):
        assert syncs.by_call()[expected_name] == expected_names.count(expected_name)


# --- explain_graphs -------------------------------------------------------------------


def damped_loss(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    loss = F.mse_loss(predictions, targets)
    if loss > 1.0:
        loss = loss * 0.5
    return loss


def loss_logged(predictions: torch.Tensor, targets: torch.Tensor, history: list) -> torch.Tensor:
    loss = F.mse_loss(predictions, targets)
    history.append(loss.item())
    return loss


def two_breaks(values: torch.Tensor) -> torch.Tensor:
    total = values.sum()
    if total > 0:
        total = total * 2
    positive = values[values > 0]
    return positive.sum() + total


def clean_loss(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    loss = F.mse_loss(predictions, targets)
    return torch.where(loss > 1.0, loss * 0.5, loss)


PREDICTIONS = torch.full((4, 1), 3.0)
TARGETS = torch.zeros(4, 1)


def test_a_python_if_on_a_tensor_splits_the_graph() -> None:
    report = explain_graphs(damped_loss, PREDICTIONS, TARGETS)
    assert (report.graph_count, report.graph_break_count) == (2, 1)
    assert len(report.breaks) == 1
    assert report.breaks[0].function == "damped_loss"
    assert report.breaks[0].code == "if loss > 1.0:"
    assert report.breaks[0].reason
    assert not report.is_single_graph


def test_a_trailing_item_is_a_reason_without_a_counted_break() -> None:
    history: list[float] = []
    report = explain_graphs(loss_logged, PREDICTIONS, TARGETS, history)
    assert (report.graph_count, report.graph_break_count) == (1, 0)
    assert [graph_break.code for graph_break in report.breaks] == ["history.append(loss.item())"]
    assert "item()" in report.breaks[0].reason
    assert not report.is_single_graph
    assert history == [9.0]  # the function really ran


def test_breaks_in_resumed_code_name_the_original_function() -> None:
    report = explain_graphs(two_breaks, VALUES)
    assert [graph_break.function for graph_break in report.breaks] == ["two_breaks"] * 2
    assert [graph_break.code for graph_break in report.breaks] == [
        "if total > 0:",
        "positive = values[values > 0]",
    ]
    assert "     if total > 0:" in str(report).splitlines()


def prints_then_doubles(predictions: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    loss = F.mse_loss(predictions, targets)
    print(f"loss {loss:.3f}")
    return loss * 2


def test_a_many_line_reason_is_cut_to_its_first_line(capsys: pytest.CaptureFixture[str]) -> None:
    # Dynamo's reason for a print runs on with an explanation, hints and a link.
    raw = torch._dynamo.explain(prints_then_doubles)(PREDICTIONS, TARGETS)
    assert len(raw.break_reasons[0].reason.strip().splitlines()) > 1
    report = explain_graphs(prints_then_doubles, PREDICTIONS, TARGETS)
    assert [graph_break.reason for graph_break in report.breaks] == [
        raw.break_reasons[0].reason.strip().splitlines()[0]
    ]
    assert report.breaks[0].code == 'print(f"loss {loss:.3f}")'
    assert capsys.readouterr().out == "loss 9.000\nloss 9.000\n"  # both calls really ran


def test_the_printout_fits_a_page_column_and_names_each_break() -> None:
    long_code = "if total > 0:  # " + "a comment that runs far past the page column " * 2
    report = GraphReport(
        graph_count=2,
        graph_break_count=1,
        op_count=3,
        breaks=(GraphBreak(reason="generic_jump TensorVariable()", function="f", code=long_code),),
    )
    lines = str(report).splitlines()
    assert lines[0] == "graphs: 2, graph breaks: 1, break reasons: 1"
    assert lines[1] == "  1. in f():"
    assert len(lines[2]) == 79 and lines[2].endswith("...")
    assert lines[2].strip().startswith("if total > 0:")
    assert lines[3] == "     generic_jump TensorVariable()"
    assert len(lines) == 4


def test_a_device_side_rewrite_is_one_graph() -> None:
    report = explain_graphs(clean_loss, PREDICTIONS, TARGETS)
    assert report.is_single_graph
    assert report.breaks == ()
    assert report.op_count >= 1


def test_explain_graphs_needs_a_callable() -> None:
    with pytest.raises(TypeError, match="int"):
        explain_graphs(3)  # type: ignore[arg-type]


def test_quiet_compiler_logs_keeps_warnings_off_stderr_and_restores_handlers(
    capfd: pytest.CaptureFixture[str],
) -> None:
    logger = logging.getLogger("torch._dynamo")
    handlers_before = logger.handlers[:]
    with quiet_compiler_logs() as records:
        logger.warning("graph break for the test")
    assert [record.getMessage() for record in records] == ["graph break for the test"]
    assert "graph break for the test" not in capfd.readouterr().err
    assert logger.handlers == handlers_before


def test_f_one_hot_range_checks_are_counted_as_cpu_only() -> None:
    ids = torch.tensor([0, 2, 1, 2])
    with HostSyncCounter() as syncs:
        F.one_hot(ids, num_classes=3)
    # torch 2.13's Onehot.cpp: on a CPU, aminmax then two .item() reads; elsewhere none.
    assert (syncs.count, syncs.cpu_only_count, syncs.accelerator_count) == (2, 2, 0)
    assert syncs.by_call() == {"aten._local_scalar_dense in F.one_hot (CPU only)": 2}
    with HostSyncCounter() as syncs:
        F.one_hot(ids)  # no num_classes: every device reads the largest id to size the output
    assert (syncs.count, syncs.cpu_only_count, syncs.accelerator_count) == (2, 1, 1)
    assert all(sync.cpu_only == ("CPU only" in sync.call) for sync in syncs.syncs)


def test_reads_after_f_one_hot_count_on_an_accelerator_again() -> None:
    ids = torch.tensor([0, 2, 1])
    with HostSyncCounter() as syncs:
        F.one_hot(ids, 3).sum().item()
    assert (syncs.count, syncs.accelerator_count) == (3, 1)
    assert syncs.by_call()["Tensor.item"] == 1
