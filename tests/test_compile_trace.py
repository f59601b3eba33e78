"""`read_compilations` reads what TORCH_TRACE writes: each compile, its id and its reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tpuready.inspection.compile_trace import Compilation, CompileTraceError, read_compilations

SCRIPT = """
import torch
def double_sum(x):
    return (x * 2).sum()
compiled = torch.compile(double_sum, backend="aot_eager", dynamic=False)
for length in (3, 4, 4, 5):
    compiled(torch.ones(length))
"""


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real run under TORCH_TRACE: three lengths, so one compile and two recompiles."""
    directory = tmp_path_factory.mktemp("trace")
    subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=dict(os.environ, TORCH_TRACE=str(directory), OMP_NUM_THREADS="1"),
        check=True,
        timeout=120,
    )
    return directory


def test_a_run_records_one_compilation_per_shape_with_its_reason(traced: Path) -> None:
    compilations = read_compilations(traced)
    assert [c.compile_id for c in compilations] == ["0/0", "0/1", "0/2"]
    assert {c.function for c in compilations} == {"double_sum"}
    assert all(c.compiled and c.fail_reason is None for c in compilations)
    assert [c.is_recompile for c in compilations] == [False, True, True]
    assert compilations[0].recompile_reason is None
    assert "size mismatch at index 0. expected 3, actual 4" in compilations[1].recompile_reason
    assert "expected 4, actual 5" in compilations[2].recompile_reason
    assert all(c.seconds is not None and c.seconds > 0 for c in compilations)


LIMITED_SCRIPT = """
import torch
torch._dynamo.config.recompile_limit = 2
def double(x):
    return x * 2
compiled = torch.compile(double, backend="eager", dynamic=False)
for length in (1, 2, 3, 4, 5):
    compiled(torch.ones(length))
"""


def test_the_recompile_limit_shows_as_a_failed_attempt_not_a_graph(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-c", LIMITED_SCRIPT],
        env=dict(os.environ, TORCH_TRACE=str(tmp_path), OMP_NUM_THREADS="1"),
        check=True,
        timeout=120,
        capture_output=True,  # Dynamo warns on stderr when it hits the limit
    )
    compilations = read_compilations(tmp_path)
    # Two graphs, then one failed attempt; lengths 4 and 5 run eagerly, unrecorded.
    assert [c.compile_id for c in compilations] == ["0/0", "0/1", "0/2"]
    assert [c.compiled for c in compilations] == [True, True, False]
    limited = compilations[-1]
    assert limited.is_recompile and limited.function is None
    assert limited.fail_reason.splitlines()[0] == "Dynamo recompile limit exceeded"
    assert "expected 2, actual 3" in limited.recompile_reason
    assert {c.rank for c in compilations} == {None}


SKIPPED_SCRIPT = """
import torch
def identity(x):
    return x
torch.compile(identity, backend="eager")(torch.ones(2))
"""


def test_a_frame_dynamo_skips_is_recorded_but_not_compiled(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-c", SKIPPED_SCRIPT],
        env=dict(os.environ, TORCH_TRACE=str(tmp_path), OMP_NUM_THREADS="1"),
        check=True,
        timeout=120,
    )
    compilations = read_compilations(tmp_path)
    assert [c.compile_id for c in compilations] == ["0/0"]
    assert compilations[0].fail_type is None and not compilations[0].compiled


def test_each_torchrun_rank_log_gives_its_records_their_rank(tmp_path: Path) -> None:
    def record(compile_id: str) -> str:
        return (
            'V1203 17:32:16.990000 1 torch/_dynamo/utils.py:1] {"compilation_metrics": '
            f'{{"compile_id": "{compile_id}", "co_name": "step", "graph_op_count": 3}}}}\n'
        )

    (tmp_path / "dedicated_log_torch_trace_rank_10_ab.log").write_text(record("0/1"))
    (tmp_path / "dedicated_log_torch_trace_rank_2_cd.log").write_text(record("0/0"))
    compilations = read_compilations(tmp_path)
    assert [(c.rank, c.compile_id) for c in compilations] == [(2, "0/0"), (10, "0/1")]
    assert all(c.compiled and c.function == "step" for c in compilations)


def test_payload_lines_and_other_records_are_skipped(tmp_path: Path) -> None:
    (tmp_path / "dedicated_log_torch_trace_x.log").write_text(
        'V1203 17:32:16.790000 1 torch/_dynamo/utils.py:2350] {"chromium_event": {}}\n'
        '\t{\n\t"name": "dynamo"\n\t}\n'
        'V1203 17:32:16.990000 1 torch/_dynamo/utils.py:1] {"compilation_metrics": '
        '{"compile_id": "2/1", "co_name": "step", "recompile_reason": "why", '
        '"entire_frame_compile_time_s": 0.5}}\n'
    )
    assert read_compilations(tmp_path) == [Compilation("2/1", "step", "why", 0.5)]
    assert not read_compilations(tmp_path)[0].compiled  # no graph_op_count: no graph


def test_a_missing_or_empty_directory_says_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(CompileTraceError, match="is not a directory: run the script with"):
        read_compilations(tmp_path / "absent")
    with pytest.raises(CompileTraceError, match=r"holds no \.log file"):
        read_compilations(tmp_path)
