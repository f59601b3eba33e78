"""Chapter 8's worker runs unchanged under torchrun and gives what the notebook saw.

The notebook starts `run_rank` through `tpuready.runtime.launch.run_workers`; the chapter tells
readers to run the same file with `torchrun`. Both must give every rank the same block, the
same full product and the same recorded collectives, to the last bit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import NOTEBOOK_DIR, REPOSITORY, run_torchrun

from tpuready.runtime.launch import run_workers

WORKER_FILE = NOTEBOOK_DIR / "workers" / "ch08_sharded_matmul.py"
WORLD_SIZE = 4
LAUNCH_TIMEOUT_SECONDS = 240

pytestmark = pytest.mark.timeout(2 * LAUNCH_TIMEOUT_SECONDS + 60)


@pytest.fixture(scope="module")
def worker_module():
    """The worker module, imported as the notebook imports it (`workers.ch08_...`)."""
    sys.path.insert(0, str(NOTEBOOK_DIR))  # spawned ranks inherit sys.path
    try:
        from workers import ch08_sharded_matmul

        yield ch08_sharded_matmul
    finally:
        sys.path.remove(str(NOTEBOOK_DIR))


@pytest.fixture(scope="module")
def from_torchrun() -> list[dict]:
    """Run the worker file with the standard launcher; return rank 0's JSON line."""
    return run_torchrun(WORKER_FILE, WORLD_SIZE, timeout_seconds=LAUNCH_TIMEOUT_SECONDS)


def test_torchrun_gives_what_run_workers_gives(worker_module, from_torchrun) -> None:
    from_run_workers = run_workers(
        worker_module.run_rank, WORLD_SIZE, timeout_seconds=LAUNCH_TIMEOUT_SECONDS
    )
    # The JSON round trip turns tuples into lists; the numbers themselves are exact.
    assert from_torchrun == json.loads(json.dumps(from_run_workers))
    assert [result["rank"] for result in from_torchrun] == list(range(WORLD_SIZE))


def test_results_are_the_product_and_one_reduce_scatter(worker_module, from_torchrun) -> None:
    """Guards the comparison above against two launches that agree on a wrong answer."""
    import torch

    a, b = worker_module.make_operands()
    for result in from_torchrun:
        assert torch.equal(torch.tensor(result["full"]), a @ b)
        assert result["counts"] == {"reduce-scatter": 1}


def test_the_file_refuses_to_run_without_torchrun() -> None:
    completed = subprocess.run(
        [sys.executable, str(WORKER_FILE)],
        cwd=REPOSITORY,
        env={key: value for key, value in os.environ.items() if key != "RANK"},
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_SECONDS,
        check=False,
    )
    assert completed.returncode != 0
    assert "torchrun" in completed.stderr
