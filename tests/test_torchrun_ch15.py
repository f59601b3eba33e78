"""Chapter 15's worker under the standard launcher gives what the notebook gets.

The notebook runs `notebooks/workers/ch15_checkpoints.py` through
`tpuready.runtime.launch.run_workers`; readers run the same file with `torchrun`. The test saves a
checkpoint on 4 ranks and resumes it on 2, both ways, each in its own folder, and compares
what rank 0 reports. Same code, same data, same gloo sums in the same order, one torch
thread per rank: losses and the digests of the full state must be equal, with no tolerance.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import NOTEBOOK_DIR
from conftest import run_torchrun as run_torchrun_with_timeout

from tpuready.runtime.launch import run_workers

# The notebook imports its workers as `workers.ch15_...` from notebooks/; so do we (the
# spawned ranks inherit this path).
if str(NOTEBOOK_DIR) not in sys.path:
    sys.path.insert(0, str(NOTEBOOK_DIR))

from workers.ch15_checkpoints import digest, latest_complete_checkpoint, train_worker

SCRIPT = NOTEBOOK_DIR / "workers" / "ch15_checkpoints.py"
# Importing torch and joining the group takes seconds per rank, far more on a busy machine.
TIMEOUT_SECONDS = 300

pytestmark = pytest.mark.timeout(4 * TIMEOUT_SECONDS)


def run_torchrun(num_ranks: int, *arguments: object) -> dict:
    """Run the worker under torchrun on `num_ranks` CPU processes; return rank 0's JSON."""
    return run_torchrun_with_timeout(SCRIPT, num_ranks, *arguments, timeout_seconds=TIMEOUT_SECONDS)


def summary(result: dict) -> dict:
    """What rank 0 prints under torchrun, computed from a `run_workers` result."""
    loaded = result["loaded"]
    return {
        "resumed_from": result["resumed_from"],
        "losses": result["losses"],
        "loaded_digest": None if loaded is None else digest(loaded),
        "final_digest": digest(result["final"]),
    }


def test_save_on_4_and_resume_on_2_match_under_torchrun(tmp_path: Path) -> None:
    by_torchrun, by_launcher = tmp_path / "torchrun", tmp_path / "launcher"
    by_torchrun.mkdir()
    by_launcher.mkdir()

    saved = run_torchrun(4, by_torchrun, 3, 3)
    launched = run_workers(train_worker, 4, str(by_launcher), 3, 3, timeout_seconds=TIMEOUT_SECONDS)
    assert saved["world_size"] == 4
    assert saved["resumed_from"] == 0 and saved["loaded_digest"] is None
    assert {k: v for k, v in saved.items() if k != "world_size"} == summary(launched[0])
    for root in (by_torchrun, by_launcher):
        latest = latest_complete_checkpoint(root)
        assert latest is not None and latest.name == "step-00003"

    resumed = run_torchrun(2, by_torchrun, 9, 2)
    relaunched = run_workers(
        train_worker, 2, str(by_launcher), 9, 2, timeout_seconds=TIMEOUT_SECONDS
    )
    assert resumed["world_size"] == 2
    assert resumed["resumed_from"] == 3
    # The state loaded on 2 ranks is the state the 4 ranks saved, bit for bit.
    assert resumed["loaded_digest"] == saved["final_digest"]
    assert resumed["losses"][:3] == saved["losses"]
    assert {k: v for k, v in resumed.items() if k != "world_size"} == summary(relaunched[0])
