"""`tpuready.runtime.timing`: waiting for a result on a (fake) accelerator, timing on a fake clock.

No accelerator is needed: a fake one replaces `torch.accelerator.current_accelerator`,
`is_available` and `synchronize`, and `Tensor.item` and `Tensor.cpu` record each host read
and copy, so the tests show what `wait_for` does on TorchTPU (one host read of a number that
needs every element, then a synchronize), on CUDA (a synchronize, no copy) and on a CPU
(nothing).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tpuready.runtime import timing
from tpuready.runtime.timing import TimingError, TimingResult, slow_steps, time_call, wait_for


class FakeAccelerator:
    """Records what a device would receive: host reads, copies and synchronizes, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def synchronize(self) -> None:
        self.events.append(("synchronize", None))

    def of(self, kind: str) -> list[object]:
        return [what for event, what in self.events if event == kind]


def install_fake(monkeypatch: pytest.MonkeyPatch, device_type: str) -> FakeAccelerator:
    """Make this process look as if it ran on a `device_type` accelerator."""
    fake = FakeAccelerator()
    real_item, real_cpu = torch.Tensor.item, torch.Tensor.cpu

    def recording_item(self: torch.Tensor) -> object:
        value = real_item(self)
        fake.events.append(("read", value))
        return value

    def recording_cpu(self: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        fake.events.append(("copy", tuple(self.shape)))
        return real_cpu(self, *args, **kwargs)

    accelerator = SimpleNamespace(type=device_type)  # torch.device("tpu") needs TorchTPU
    monkeypatch.setattr(
        torch.accelerator, "current_accelerator", lambda check_available=False: accelerator
    )
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "synchronize", fake.synchronize)
    monkeypatch.setattr(torch.Tensor, "item", recording_item)
    monkeypatch.setattr(torch.Tensor, "cpu", recording_cpu)
    return fake


@pytest.fixture
def tpu(monkeypatch: pytest.MonkeyPatch) -> FakeAccelerator:
    return install_fake(monkeypatch, "tpu")


@pytest.fixture
def cuda(monkeypatch: pytest.MonkeyPatch) -> FakeAccelerator:
    return install_fake(monkeypatch, "cuda")


class ModelOutputLike(Mapping):
    """A read-only mapping, as a Hugging Face `ModelOutput` is."""

    def __init__(self, **fields: object) -> None:
        self._fields = fields

    def __getitem__(self, key: str) -> object:
        return self._fields[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)


# ---------------------------------------------------------------------------------------------
# wait_for


def test_on_a_tpu_one_number_that_needs_every_element_is_read_then_synchronized(
    tpu: FakeAccelerator,
) -> None:
    logits, loss = torch.randn(4, 8), torch.randn(())
    hidden = [torch.randn(2, 3), torch.randn(3, 2)]
    result = ModelOutputLike(logits=logits, loss=loss, hidden_states=(hidden, {"last": hidden[1]}))
    # tolist(), not item(): the fake records every item() call as a host read.
    expected = torch.stack([t.sum() for t in (logits, loss, *hidden, hidden[1])]).sum().tolist()
    wait_for(result)
    (read,) = tpu.of("read")  # one number read on the host
    assert math.isclose(read, expected, rel_tol=1e-5)  # every element is in it
    assert tpu.of("copy") == []  # no copy of the whole result over the host link
    assert tpu.events[-1] == ("synchronize", None)


def test_on_a_tpu_the_read_comes_before_the_synchronize(tpu: FakeAccelerator) -> None:
    wait_for(torch.ones(3, 3))
    assert tpu.events == [("read", 9.0), ("synchronize", None)]


def test_on_a_tpu_changing_any_element_changes_the_number_read(tpu: FakeAccelerator) -> None:
    for position in range(6):
        values = torch.zeros(2, 3)
        values.view(-1)[position] = 1.0
        wait_for(values)
    assert tpu.of("read") == [1.0] * 6  # each element, wherever it sits, reaches the read


def test_on_a_tpu_bool_int_complex_and_grad_tensors_are_read_too(tpu: FakeAccelerator) -> None:
    weights = torch.ones(2, requires_grad=True)
    wait_for([torch.tensor([True, True]), torch.arange(3), torch.tensor([3 + 4j]), weights * 2])
    assert tpu.of("read") == [2.0 + 3.0 + 5.0 + 4.0]


def test_on_a_tpu_tensors_in_sets_and_list_subclasses_are_read_too(tpu: FakeAccelerator) -> None:
    class Batch(list):
        """A list subclass, which PyTorch's pytree keeps whole."""

    wait_for((Batch([torch.ones(2)]), {torch.ones(3)}, frozenset([torch.ones(4)])))
    assert tpu.of("read") == [2.0 + 3.0 + 4.0]


def test_on_cuda_a_synchronize_is_enough_and_nothing_is_copied(cuda: FakeAccelerator) -> None:
    wait_for({"logits": torch.randn(64, 64), "loss": torch.randn(())})
    assert cuda.events == [("synchronize", None)]


def test_non_tensor_leaves_are_ignored(tpu: FakeAccelerator) -> None:
    wait_for({"step": 3, "name": "loss", "value": None, "scores": [1.5, "x"]})
    assert tpu.events == [("synchronize", None)]


def test_on_a_cpu_nothing_is_read_or_synchronized(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("wait_for must not touch the device on a CPU")

    monkeypatch.setattr(
        torch.accelerator, "current_accelerator", lambda check_available=False: None
    )
    monkeypatch.setattr(torch.accelerator, "synchronize", refuse)
    monkeypatch.setattr(torch.Tensor, "cpu", refuse)
    monkeypatch.setattr(torch.Tensor, "item", refuse)
    wait_for((torch.randn(8), {"loss": torch.randn(())}))


# ---------------------------------------------------------------------------------------------
# time_call on a fake clock


class FakeClock:
    """A clock that moves only when the timed function says how long it took."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(timing, "perf_counter", fake)
    return fake


def test_warmup_calls_are_run_but_not_timed(clock: FakeClock) -> None:
    durations = iter([50.0, 40.0, 3.0, 1.0, 2.0])  # two slow warm-up calls, then three

    def work() -> None:
        clock.now += next(durations)

    result = time_call(work, warmup=2, repeats=3)
    assert result.seconds == (3.0, 1.0, 2.0)
    assert result.median == 2.0
    assert result.minimum == 1.0
    assert next(durations, "used up") == "used up"  # exactly warmup + repeats calls


def test_median_of_an_even_count_is_the_mean_of_the_middle_two(clock: FakeClock) -> None:
    durations = iter([0.0, 4.0, 1.0, 10.0, 2.0])

    def work() -> None:
        clock.now += next(durations)

    assert time_call(work, repeats=4).median == 3.0  # (2 + 4) / 2


def test_arguments_reach_the_function(clock: FakeClock) -> None:
    calls = []
    result = time_call(lambda *a, **k: calls.append((a, k)), 1, 2, warmup=0, repeats=2, scale=3)
    assert calls == [((1, 2), {"scale": 3})] * 2
    assert len(result.seconds) == 2


def test_each_call_waits_for_its_output(tpu: FakeAccelerator) -> None:
    outputs = [torch.full((2, 2), float(i)) for i in range(4)]
    produced = iter(outputs)
    time_call(lambda: next(produced), warmup=1, repeats=3)
    assert tpu.of("read") == [0.0, 4.0, 8.0, 12.0]  # the sum of each output, in order


def test_a_real_matmul_on_this_machine() -> None:
    matrix = torch.randn(64, 64)
    result = time_call(torch.mm, matrix, matrix, repeats=3)
    assert len(result.seconds) == 3
    assert 0 < result.minimum <= result.median < 10


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"warmup": -1}, "warmup must be at least 0, got -1"),
        ({"repeats": 0}, "repeats must be at least 1, got 0"),
        ({"repeats": 2.5}, "repeats must be a whole number, got 2.5"),
        ({"warmup": True}, "warmup must be a whole number, got True"),
    ],
)
def test_bad_counts_are_refused_by_name(arguments: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        time_call(lambda: None, **arguments)


def test_something_that_is_not_callable_is_refused() -> None:
    with pytest.raises(TimingError, match=r"fn must be callable, got tensor\(1\.\)"):
        time_call(torch.tensor(1.0))  # the result of a call, not the call


@pytest.mark.parametrize(
    ("seconds", "message"),
    [
        ((), "non-empty tuple"),
        ([1.0], "non-empty tuple"),
        ((1.0, -0.5), "got -0.5"),
        ((math.nan,), "got nan"),
        (("1.0",), "got '1.0'"),
    ],
)
def test_a_result_with_impossible_samples_is_refused(seconds: object, message: str) -> None:
    with pytest.raises(TimingError, match=message):
        TimingResult(seconds)  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# Properties of the summary figures

samples = st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=30)


@given(values=samples)
def test_minimum_is_a_sample_no_larger_than_any(values: list[float]) -> None:
    result = TimingResult(tuple(values))
    assert result.minimum in values
    assert all(result.minimum <= value for value in values)


@given(values=samples)
def test_median_splits_the_samples_in_half(values: list[float]) -> None:
    median = TimingResult(tuple(values)).median
    assert 2 * sum(value <= median for value in values) >= len(values)
    assert 2 * sum(value >= median for value in values) >= len(values)
    assert min(values) <= median <= max(values)


@given(data=st.data(), values=samples)
def test_order_of_the_samples_does_not_change_the_figures(data, values: list[float]) -> None:
    shuffled = data.draw(st.permutations(values))
    original, reordered = TimingResult(tuple(values)), TimingResult(tuple(shuffled))
    assert (original.median, original.minimum) == (reordered.median, reordered.minimum)


def test_a_timing_is_labelled_only_under_the_emulated_tpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import tpuready.emulator
    from tpuready.emulator.host import parse_host
    from tpuready.runtime.timing import EMULATED_NOTE, timing_note

    assert timing_note() == ""  # this interpreter runs no emulator
    monkeypatch.setattr(tpuready.emulator, "_LOADED", parse_host("1"))
    assert timing_note() == EMULATED_NOTE
    assert "not a TPU's" in EMULATED_NOTE


# ---------------------------------------------------------------------------------------------
# slow_steps: the steps that took much longer than the typical one


def test_the_step_that_compiled_is_named() -> None:
    # A run that compiled at step 0 and again at step 5 (a new shape), 10 ms a step otherwise.
    seconds = [2.0, 0.010, 0.011, 0.009, 0.010, 0.9, 0.010, 0.011]
    assert slow_steps(seconds) == [0, 5]


def test_a_steady_run_has_no_slow_step() -> None:
    assert slow_steps([0.010, 0.012, 0.011, 0.029]) == []


def test_the_factor_sets_how_much_slower_counts() -> None:
    seconds = [1.0, 1.0, 1.0, 2.5]
    assert slow_steps(seconds, factor=2.0) == [3]
    assert slow_steps(seconds, factor=3.0) == []


@pytest.mark.parametrize(
    ("seconds", "factor", "message"),
    [
        ([], 3.0, "seconds must be a non-empty sequence"),
        ("0.1", 3.0, "seconds must be a non-empty sequence"),
        (0.1, 3.0, "seconds must be a non-empty sequence"),
        ([0.1, -1.0], 3.0, r"seconds\[1\] must be .*got -1.0"),
        ([0.1, math.nan], 3.0, r"seconds\[1\].*nan"),
        ([0.1, 0.2], 1.0, "factor must be above 1, got 1.0"),
        ([0.1, 0.2], 0, "factor must be .*got 0"),
        ([0.1, 0.2], True, "factor must be a number, got True"),
    ],
)
def test_bad_step_times_and_factors_are_refused_by_name(
    seconds: object, factor: object, message: str
) -> None:
    with pytest.raises(TimingError, match=message):
        slow_steps(seconds, factor=factor)  # type: ignore[arg-type]


step_times = st.lists(
    st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=40
)
factors = st.floats(min_value=1.01, max_value=100)


@given(values=step_times, factor=factors)
def test_at_most_half_the_steps_are_slow(values: list[float], factor: float) -> None:
    flagged = slow_steps(values, factor=factor)
    assert 2 * len(flagged) <= len(values)
    assert flagged == sorted(set(flagged))


@given(values=step_times, factor=factors)
def test_a_step_is_flagged_exactly_when_it_exceeds_factor_times_the_median(
    values: list[float], factor: float
) -> None:
    median = TimingResult(tuple(values)).median
    flagged = set(slow_steps(values, factor=factor))
    for index, value in enumerate(values):
        assert (index in flagged) == (value > factor * median)


@given(values=step_times, factor=factors, scale=st.floats(min_value=1e-3, max_value=1e3))
def test_the_answer_does_not_depend_on_the_clock_unit(
    values: list[float], factor: float, scale: float
) -> None:
    # Seconds or milliseconds: the same steps are slow (up to rounding at the boundary).
    median = TimingResult(tuple(values)).median
    clear = [v for v in values if abs(v - factor * median) > 1e-6 * (1 + v)]
    if len(clear) == len(values):
        assert slow_steps(values, factor=factor) == slow_steps(
            [v * scale for v in values], factor=factor
        )
