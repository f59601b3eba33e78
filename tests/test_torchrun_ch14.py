"""Chapter 14's pipeline worker runs unchanged under torchrun and agrees with `run_workers`.

The notebook starts `workers/ch14_pipeline.py` with `tpuready.runtime.launch.run_workers`; readers
run the same file with `torchrun`. Both must report the same microbatch losses and activation
peaks, and those must show what step 7 teaches.
"""

from __future__ import annotations

import itertools
import sys

from conftest import NOTEBOOK_DIR
from conftest import run_torchrun as run_torchrun_with_timeout

from tpuready.runtime.launch import run_workers

if str(NOTEBOOK_DIR) not in sys.path:
    sys.path.insert(0, str(NOTEBOOK_DIR))

from workers import ch14_pipeline

TIMEOUT_SECONDS = 300


def test_pipeline_worker_under_torchrun_matches_run_workers() -> None:
    printed = run_torchrun_with_timeout(
        NOTEBOOK_DIR / "workers" / "ch14_pipeline.py", 2, timeout_seconds=TIMEOUT_SECONDS
    )
    results = run_workers(ch14_pipeline.pipeline_worker, 2, timeout_seconds=TIMEOUT_SECONDS)
    last = results[-1]
    for schedule, by_count in last.items():
        for count, result in by_count.items():
            # JSON turns the microbatch counts (dictionary keys) into strings.
            got = printed[schedule][str(count)]
            assert got["losses"] == result["losses"], (schedule, count)
            assert got["peak_saved_bytes"] == result["peak_saved_bytes"], (schedule, count)
            assert len(result["losses"]) == count  # one loss per microbatch
    first = results[0]
    few, many = ch14_pipeline.MICROBATCH_COUNTS
    # Both schedules compute the same microbatch losses; 1F1B holds less than GPipe, and
    # less as the microbatches grow in number, on the first stage.
    assert last["GPipe"][many]["losses"] == last["1F1B"][many]["losses"]
    assert first["1F1B"][many]["peak_saved_bytes"] < first["GPipe"][many]["peak_saved_bytes"] / 2
    assert first["1F1B"][many]["peak_saved_bytes"] < first["1F1B"][few]["peak_saved_bytes"]


def test_stages_cover_every_layer_once() -> None:
    for num_stages in (1, 2, 3, 9):
        bounds = ch14_pipeline.stage_bounds(num_stages)
        assert bounds[0] == 0 and bounds[-1] == ch14_pipeline.NUM_LAYERS + 1
        assert all(a < b for a, b in itertools.pairwise(bounds))
    assert ch14_pipeline.whole_model_name(1, 2, "0.0.weight") == "4.0.weight"
