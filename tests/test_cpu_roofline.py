"""`tpuready.runtime.cpu_roofline`: this CPU's peak and bandwidth, measured in a blink."""

from __future__ import annotations

import pytest

from tpuready.calc.roofline import Roofline
from tpuready.runtime import cpu_roofline
from tpuready.runtime.cpu_roofline import (
    best_seconds,
    measure_bytes_per_second,
    measure_cpu_roofline,
    measure_peak_flops_per_second,
)
from tpuready.runtime.timing import TimingError


def test_best_seconds_is_the_shortest_run(monkeypatch) -> None:
    # A fake clock: the three runs take 3, 1 and 2 seconds; the best is 1.
    ticks = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])
    monkeypatch.setattr(cpu_roofline.time, "perf_counter", lambda: next(ticks))
    calls = []
    assert best_seconds(lambda: calls.append(1), 3) == 1.0
    assert len(calls) == 3


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_best_seconds_refuses_a_count_that_is_not_a_whole_number_above_zero(bad) -> None:
    with pytest.raises(TimingError, match="num_repeats"):
        best_seconds(lambda: None, bad)


def test_best_seconds_refuses_a_run_it_cannot_call() -> None:
    with pytest.raises(TimingError, match="run must be callable"):
        best_seconds(42, 3)  # type: ignore[arg-type]


def fixed_seconds(seconds: float):
    """A `best_seconds` that runs `run` once and says it took `seconds`."""

    def best(run, num_repeats: int) -> float:
        run()
        return seconds

    return best


def test_the_peak_counts_two_flops_per_multiply_add(monkeypatch) -> None:
    # Every run "takes" 0.5 s: a 64-side matmul, 2 * 64**3 FLOPs, at 2 * 64**3 / 0.5 FLOP/s.
    monkeypatch.setattr(cpu_roofline, "best_seconds", fixed_seconds(0.5))
    assert measure_peak_flops_per_second(side=64, num_repeats=2) == 2 * 64**3 / 0.5


def test_the_bandwidth_counts_two_reads_and_one_write_of_float32(monkeypatch) -> None:
    monkeypatch.setattr(cpu_roofline, "best_seconds", fixed_seconds(0.25))
    assert measure_bytes_per_second(num_elements=1000, num_repeats=2) == 3 * 4 * 1000 / 0.25


def test_a_real_measurement_gives_a_roofline_with_a_ridge_point_of_a_cpu() -> None:
    line = measure_cpu_roofline()
    assert isinstance(line, Roofline) and line.name == "this CPU"
    # Any CPU core of this century: above 1 GFLOP/s and 0.1 GB/s, a ridge point under 1,000.
    assert line.peak_flops_per_second > 1e9 and line.bytes_per_second > 1e8
    assert 0 < line.ridge_point_flops_per_byte < 1000


@pytest.mark.parametrize(
    ("call", "argument"),
    [
        (lambda: measure_peak_flops_per_second(side=0), "side"),
        (lambda: measure_peak_flops_per_second(side=64, num_repeats=0), "num_repeats"),
        (lambda: measure_bytes_per_second(num_elements=1.5), "num_elements"),
    ],
)
def test_bad_sizes_name_the_argument(call, argument) -> None:
    with pytest.raises(TimingError, match=argument):
        call()
