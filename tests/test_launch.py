"""tpuready.runtime.launch: real gloo ranks on CPU, rank-ordered results, loud failures, no
leftovers.

Each run spawns processes that import torch (2-4 s each on two cores), so the tests share
runs where one run can show several behaviours.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import ipaddress
import math
import multiprocessing.context
import multiprocessing.resource_tracker
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import launch_workers
import pytest
import torch
from conftest import NOTEBOOK_DIR
from launch_workers import (
    Holder,
    die_mid_message,
    exit_abruptly_on_one_rank,
    fail_late_on_one_rank,
    fail_on_one_rank,
    hang_on_some_ranks,
    noisy_all_reduce,
    return_unpicklable,
    tensor_result,
)

import tpuready.runtime.launch
from tpuready.runtime.launch import (
    KNOWN_WORKER_WARNINGS,
    LOG_TAIL_BYTES,
    LOG_TAIL_LINES,
    WorkerCrashedError,
    WorkersTimedOutError,
    quiet_known_warnings,
    run_torchrun_main,
    run_workers,
)

# A safety net: no test may hang the suite even if the launcher's own timeout broke.
pytestmark = pytest.mark.timeout(180)


def child_process_ids() -> set[int]:
    """Processes whose parent is this test process, zombies included (read from /proc).

    Leaves out multiprocessing's resource tracker: `spawn` starts one per caller on first use,
    and it lives as long as the caller does, by design.
    """
    resource_tracker_id = multiprocessing.resource_tracker._resource_tracker._pid
    children = set()
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The fields after "(command name)" start with the state, then the parent's id.
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        process_id = int(stat_file.parent.name)
        if int(fields[1]) == os.getpid() and process_id != resource_tracker_id:
            children.add(process_id)
    return children


def is_loopback_address(address: str) -> bool:
    """127.0.0.0/8 or ::1, also written as an IPv4-mapped IPv6 address (::ffff:127.0.0.1)."""
    parsed = ipaddress.ip_address(address)
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        parsed = parsed.ipv4_mapped
    return parsed.is_loopback


@pytest.fixture(autouse=True)
def nothing_left_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test must leave no child process (running or zombie) and no temporary file."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("counting child processes reads /proc (Linux)")
    temporary_dir = tmp_path / "tmp"
    temporary_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary_dir))
    children_before = child_process_ids()
    yield
    assert child_process_ids() <= children_before, "a rank was left running or unreaped"
    assert list(temporary_dir.iterdir()) == [], "the launcher left temporary files"


@pytest.fixture
def spawning_forbidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make any attempt to start a spawned process fail the test."""

    def refuse_to_start(process: object) -> None:
        raise AssertionError("run_workers started a process before rejecting its input")

    monkeypatch.setattr(multiprocessing.context.SpawnProcess, "start", refuse_to_start)


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_all_reduce_and_results_come_back_in_rank_order(
    world_size: int, capfd: pytest.CaptureFixture[str]
) -> None:
    results = run_workers(noisy_all_reduce, world_size, scale=0.5)

    assert [result["rank"] for result in results] == list(range(world_size))
    expected_sum = 0.5 * world_size * (world_size + 1) / 2
    assert [result["sum"] for result in results] == [expected_sum] * world_size
    assert all(result["gathered"] == list(range(world_size)) for result in results)
    assert [result["environment"] for result in results] == [
        {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size)}
        for rank in range(world_size)
    ]
    assert {result["master_addr"] for result in results} == {"127.0.0.1"}
    assert {result["gloo_interface"] for result in results} <= {"lo", "lo0"}
    # Gloo and the rendezvous store listen and connect on loopback only.
    addresses = {address for result in results for address in result["socket_addresses"]}
    assert addresses and all(is_loopback_address(address) for address in addresses), addresses
    # Under `make test` (TPUREADY_OFFLINE=1) the ranks run under the network guard too.
    guard_expected = os.environ.get("TPUREADY_OFFLINE") == "1"
    assert {result["offline_guard"] for result in results} == {guard_expected}
    process_ids = {result["pid"] for result in results}
    assert len(process_ids) == world_size and os.getpid() not in process_ids
    # The workers printed, warned and wrote to fd 2: none of it may reach the caller.
    assert capfd.readouterr() == ("", "")


def test_a_crashing_rank_raises_its_traceback_without_waiting_for_the_timeout(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Rank 0 waits in an all_reduce that rank 1 never joins: it must be stopped at once. The
    # test's own timeout (180 s) is far below the launcher's 600 s, so waiting for the
    # launcher's clock would fail the test.
    with pytest.raises(WorkerCrashedError) as caught:
        run_workers(fail_on_one_rank, 2, 1, timeout_seconds=600)

    error = caught.value
    assert error.rank == 1
    message = str(error)
    assert message.splitlines()[0] == "rank 1 of 2 failed: ValueError: rank 1 failed on purpose"
    assert "Traceback (most recent call last)" in error.remote_traceback
    assert "in fail_on_one_rank" in message
    assert "rank 1 is about to fail" in error.log_tail  # the rank's own output, from its log
    assert capfd.readouterr() == ("", "")


def test_a_failing_rank_shows_the_last_lines_of_its_log_not_the_first() -> None:
    # The error names what the rank did last, where it failed: the tail of its log.
    log = tpuready.runtime.launch.LogFile.create()
    try:
        assert log.tail() == "(nothing)\n"
        lines = [f"line {number}" for number in range(LOG_TAIL_LINES + 10)]
        os.write(log.fd, ("\n".join(lines) + "\n").encode())
        assert log.tail() == "\n".join(lines[-LOG_TAIL_LINES:]) + "\n"
        # A log longer than LOG_TAIL_BYTES is read from its end, and the line cut there is
        # dropped: only whole lines from the end come back.
        os.write(log.fd, b"x" * LOG_TAIL_BYTES + b"\nlast words\n")
        assert log.tail() == "last words\n"
    finally:
        log.close()


def test_a_rank_that_dies_without_a_traceback_is_named_with_its_exit_code() -> None:
    # Rank 0 also hosts the rendezvous store: its death must be reported, not rank 1's
    # follow-on failure in the all_reduce.
    with pytest.raises(WorkerCrashedError) as caught:
        run_workers(exit_abruptly_on_one_rank, 2, 0, timeout_seconds=120)

    assert caught.value.rank == 0
    assert str(caught.value).splitlines()[0] == (
        "rank 0 of 2 failed: its process exited with code 3"
    )


def test_a_silent_death_that_arrives_after_another_ranks_error_is_the_one_named() -> None:
    # The order a rank's error and a dead rank's end of pipe reach the caller is not fixed: a
    # dying process closes its files one by one, and its peers' collectives can fail first.
    with pytest.raises(WorkerCrashedError) as caught:
        run_workers(fail_late_on_one_rank, 2, 0, True, timeout_seconds=120)

    assert caught.value.rank == 0
    assert "exited with code 3" in str(caught.value).splitlines()[0]


def test_of_two_errors_with_tracebacks_the_first_to_arrive_is_the_one_named() -> None:
    with pytest.raises(WorkerCrashedError) as caught:
        run_workers(fail_late_on_one_rank, 2, 0, False, timeout_seconds=120)

    assert caught.value.rank == 1


def test_hung_ranks_are_named_and_every_process_is_ended(
    capfd: pytest.CaptureFixture[str],
) -> None:
    # The worker's clock starts once every rank has joined, so a slow start-up on a busy
    # machine cannot turn rank 0 into a hung rank.
    with pytest.raises(WorkersTimedOutError) as caught:
        run_workers(hang_on_some_ranks, 2, [1], timeout_seconds=5)

    assert caught.value.hung_ranks == [1]
    assert str(caught.value).startswith(
        "rank(s) [1] of 2 reported no result within 5 s; all ranks were stopped."
    )
    assert capfd.readouterr() == ("", "")
    # nothing_left_behind then checks that both processes are gone and reaped.


def test_ranks_that_do_not_join_in_time_are_named() -> None:
    # Half a second is far less than importing torch takes, so no rank can join.
    with pytest.raises(WorkersTimedOutError) as caught:
        run_workers(hang_on_some_ranks, 2, [], startup_timeout_seconds=0.5)

    assert caught.value.hung_ranks == [0, 1]
    assert str(caught.value).startswith(
        "rank(s) [0, 1] of 2 did not join the process group within 0.5 s of starting;"
    )


def test_a_rank_that_dies_mid_message_gets_the_same_report_as_a_silent_death() -> None:
    # The caller's recv raises OSError ("got end of file during message"), not EOFError.
    with pytest.raises(WorkerCrashedError) as caught:
        run_workers(die_mid_message, 1)

    assert caught.value.rank == 0
    assert str(caught.value).splitlines()[0] == (
        "rank 0 of 1 failed: its process exited with code 5"
    )
    assert caught.value.remote_traceback == (
        "(no traceback: the process ended without reporting)\n"
    )


# A caller that launches two ranks which sleep; the test kills it without warning.
CALLER_SCRIPT = """
import sys
from launch_workers import report_pid_and_sleep
from tpuready.runtime.launch import run_workers
run_workers(report_pid_and_sleep, 2, sys.argv[1], timeout_seconds=3600)
"""


def process_is_gone(process_id: int) -> bool:
    """True once the process has ended (a zombie waiting for init to reap it counts)."""
    try:
        state = Path(f"/proc/{process_id}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return True
    return state in {"Z", "X"}


def wait_until(condition: Callable[[], bool], seconds: float) -> bool:
    """Poll `condition` every 0.1 s until it holds or `seconds` pass; return its last value."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return condition()
        time.sleep(0.1)
    return True


@pytest.mark.parametrize("signal_number", [signal.SIGKILL, signal.SIGTERM], ids=lambda s: s.name)
def test_ranks_exit_and_leave_no_files_when_the_caller_is_killed(
    signal_number: signal.Signals, tmp_path: Path
) -> None:
    # SIGKILL, and SIGTERM's default action, end the caller without running its `finally`:
    # the ranks must notice on their own.
    pid_dir = tmp_path / "pids"
    caller_temporary_dir = tmp_path / "caller-tmp"
    pid_dir.mkdir()
    caller_temporary_dir.mkdir()
    # The caller imports the same tpuready as this test (and launch_workers from here).
    package_root = Path(tpuready.runtime.launch.__file__).parents[2]
    python_path = [str(Path(__file__).parent), str(package_root), os.environ.get("PYTHONPATH", "")]
    environment = dict(
        os.environ,
        TMPDIR=str(caller_temporary_dir),
        PYTHONPATH=os.pathsep.join(filter(None, python_path)),
    )
    caller = subprocess.Popen(
        [sys.executable, "-c", CALLER_SCRIPT, str(pid_dir)],
        env=environment,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    rank_ids: list[int] = []
    try:
        # Start-up bound only: importing torch takes 2-4 s per rank, far more on a busy machine.
        started = wait_until(
            lambda: len(list(pid_dir.glob("rank?"))) == 2 or caller.poll() is not None, 150
        )
        rank_ids = [int(path.read_text()) for path in sorted(pid_dir.glob("rank?"))]
        assert started and len(rank_ids) == 2, caller.stderr.read() if caller.poll() else ""
        assert not any(process_is_gone(process_id) for process_id in rank_ids)

        caller.send_signal(signal_number)
        caller.wait(timeout=30)
        assert caller.returncode == -signal_number  # killed, no cleanup of its own

        # A bound on a hang, not a speed check: the ranks check on their parent every second.
        assert wait_until(lambda: all(process_is_gone(pid) for pid in rank_ids), 60), (
            f"ranks {rank_ids} outlived their caller"
        )
        assert list(caller_temporary_dir.iterdir()) == [], "the killed caller left files behind"
    finally:
        for process_id in rank_ids:  # do not leak sleeping ranks if the test failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(process_id, signal.SIGKILL)
        if caller.poll() is None:
            caller.kill()
        caller.wait()
        caller.stderr.close()


def test_an_unpicklable_result_is_reported_as_a_crash() -> None:
    with pytest.raises(WorkerCrashedError, match=r"rank 0 of 1 failed: .*pickle") as caught:
        run_workers(return_unpicklable, 1)
    assert caught.value.rank == 0


def test_tensor_results_survive_the_rank_that_made_them() -> None:
    # torch's multiprocessing pickler would share the tensor's memory with the caller; the
    # rank exits right after sending, so the result must travel as a copy.
    results = run_workers(tensor_result, 2)
    for rank, tensor in enumerate(results):
        assert torch.equal(tensor, torch.full((64, 32), float(rank)))


def nested_worker_factory() -> object:
    def nested_worker(rank: int, world_size: int) -> int:
        return rank

    return nested_worker


def worker_defined_in_main(rank: int, world_size: int) -> int:
    return rank


worker_defined_in_main.__module__ = "__main__"  # what a function defined in a notebook has


@pytest.mark.parametrize(
    "worker",
    [
        lambda rank, world_size: rank,
        nested_worker_factory(),
        worker_defined_in_main,
        Holder().work,
        functools.partial(launch_workers.hang_on_some_ranks, hanging_ranks=[]),
    ],
    ids=["lambda", "nested function", "defined in __main__", "bound method", "partial"],
)
@pytest.mark.usefixtures("spawning_forbidden")
def test_workers_the_ranks_cannot_import_are_refused_before_spawning(worker: object) -> None:
    with pytest.raises(ValueError, match=r"put the worker in an importable \.py file"):
        run_workers(worker, 2)


@pytest.mark.usefixtures("spawning_forbidden")
def test_a_worker_that_is_not_callable_is_refused() -> None:
    with pytest.raises(TypeError, match="worker must be a function, got 42"):
        run_workers(42, 2)  # type: ignore[arg-type]


@pytest.mark.usefixtures("spawning_forbidden")
def test_unpicklable_arguments_are_refused_before_spawning() -> None:
    with pytest.raises(TypeError, match="must be picklable"):
        run_workers(hang_on_some_ranks, 2, threading.Lock())


@pytest.mark.parametrize("world_size", [0, -2, 2.0, True, "2", None])
@pytest.mark.usefixtures("spawning_forbidden")
def test_a_bad_world_size_is_refused_with_its_value(world_size: object) -> None:
    with pytest.raises(ValueError, match=f"^world_size .*got {re.escape(repr(world_size))}"):
        run_workers(noisy_all_reduce, world_size)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["timeout_seconds", "startup_timeout_seconds"])
@pytest.mark.parametrize("seconds", [0, -1.5, math.nan, math.inf, "5", True, None])
@pytest.mark.usefixtures("spawning_forbidden")
def test_a_bad_timeout_is_refused_with_its_value(name: str, seconds: object) -> None:
    with pytest.raises(ValueError, match=f"^{name} .*got {re.escape(repr(seconds))}"):
        run_workers(noisy_all_reduce, 2, **{name: seconds})


def test_quiet_known_warnings_hides_the_listed_warnings_and_no_other() -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        quiet_known_warnings()
        for message, category, _ in KNOWN_WORKER_WARNINGS:
            example = message.replace(r"\(.*\)", "(Linear)")
            warnings.warn_explicit(example, category, "x.py", 1, module="torch.distributed.fsdp")
        warnings.warn("an unexpected warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["an unexpected warning"]


def test_run_torchrun_main_runs_main_under_torchrun_and_names_the_command_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran = []
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match=r"torchrun --standalone --nproc-per-node=4 .*worker\.py"):
        run_torchrun_main(lambda: ran.append(1), "worker.py", nproc_per_node=4)
    assert ran == []
    monkeypatch.setenv("RANK", "0")
    with warnings.catch_warnings():
        run_torchrun_main(lambda: ran.append(1), "worker.py", nproc_per_node=4)
    assert ran == [1]


def test_no_worker_silences_every_warning() -> None:
    for path in sorted((NOTEBOOK_DIR / "workers").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and ast.unparse(node.func).endswith(
                ("filterwarnings", "simplefilter")
            ):
                keywords = {k.arg for k in node.keywords}
                assert "message" in keywords or len(node.args) > 1, (
                    f"{path.name} line {node.lineno}: filter the warning you mean "
                    "(tpuready.runtime.launch.quiet_known_warnings), not all of them"
                )
