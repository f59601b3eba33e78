"""Chapter 9's workers under the standard launcher give what the notebook gets.

The notebook runs `notebooks/workers/ch09_ddp.py` and `ch09_fsdp.py` through
`tpuready.runtime.launch.run_workers`; readers run the same files with `torchrun`. Each test
runs a worker both ways on the same number of CPU ranks and compares what rank 0 reports.
Same code, same data, same gloo sums in the same order, one torch thread per rank (the
tests' environment): the numbers must be equal, with no tolerance. Chapter 10's worker has
its own test, tests/test_torchrun_ch10.py.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from conftest import NOTEBOOK_DIR
from conftest import run_torchrun as run_torchrun_with_timeout

from tpuready.runtime.launch import run_workers

# The notebook imports its workers as `workers.ch09_...` from notebooks/; so do we (the
# spawned ranks inherit this path).
if str(NOTEBOOK_DIR) not in sys.path:
    sys.path.insert(0, str(NOTEBOOK_DIR))

from workers.ch09_ddp import ddp_worker
from workers.ch09_fsdp import fsdp_worker

# Importing torch and joining the group takes seconds per rank, far more on a busy machine.
TORCHRUN_TIMEOUT_SECONDS = 300


def run_torchrun(script: Path, num_ranks: int) -> dict:
    """Run `script` under torchrun; return rank 0's JSON line (tests/conftest.py)."""
    return run_torchrun_with_timeout(script, num_ranks, timeout_seconds=TORCHRUN_TIMEOUT_SECONDS)


def test_ddp_worker_under_torchrun_matches_run_workers() -> None:
    printed = run_torchrun(NOTEBOOK_DIR / "workers" / "ch09_ddp.py", 2)
    results = run_workers(ddp_worker, 2, timeout_seconds=TORCHRUN_TIMEOUT_SECONDS)
    assert printed["world_size"] == 2
    # init_rank() chose gloo on this CPU-only host (tpuready.runtime.launch.choose_rank_placement).
    assert "cpu:gloo" in printed["backend"]
    assert printed["losses"] == results[0]["losses"]
    assert printed["losses"][-1] < printed["losses"][0]  # it trained


@pytest.mark.parametrize("num_ranks", [2])
def test_fsdp_worker_under_torchrun_matches_run_workers(num_ranks: int) -> None:
    printed = run_torchrun(NOTEBOOK_DIR / "workers" / "ch09_fsdp.py", num_ranks)
    results = run_workers(fsdp_worker, num_ranks, timeout_seconds=TORCHRUN_TIMEOUT_SECONDS)
    expected = results[0]
    assert printed["losses"] == expected["losses"]
    assert printed["final_weights"] == expected["final_weights"]
    # JSON turns the sharding degrees (dictionary keys) into strings.
    assert printed["memory"] == {str(k): v for k, v in expected["memory"].items()}
