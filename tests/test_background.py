"""tpuready.runtime.background: programs run within their time, and nothing they start outlives
them.

The tests start real processes; those about stopping check, by process id in /proc, that the
program and the process it started are gone (so they run where /proc exists: Linux).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from tpuready.runtime.background import (
    BackgroundError,
    BackgroundTimeout,
    free_port,
    run_guarded,
    serve,
)
from tpuready.validate import InputError

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads process states from /proc"),
]

# A program that starts a grandchild (sleep), prints both ids, then waits forever.
SPAWNS_AND_WAITS = textwrap.dedent(
    """
    import os, subprocess, sys, time
    child = subprocess.Popen(["sleep", "300"])
    print(os.getpid(), child.pid, flush=True)
    time.sleep(300)
    """
)


def _gone(pid: int, within_seconds: float = 15) -> bool:
    deadline = time.monotonic() + within_seconds
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:  # a zombie of ours counts as gone once reaped; others' zombies have no status file
            with open(f"/proc/{pid}/status") as status:
                if "\nState:\tZ" in status.read():
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_a_program_that_finishes_returns_its_output() -> None:
    assert run_guarded([sys.executable, "-c", "print('hello')"], timeout_seconds=30) == "hello\n"


def test_a_failing_program_names_its_exit_code_and_quotes_its_log() -> None:
    failing = "import sys; print('what went wrong', file=sys.stderr); sys.exit(3)"
    with pytest.raises(BackgroundError, match=r"exited with code 3(.|\n)*what went wrong"):
        run_guarded([sys.executable, "-c", failing], timeout_seconds=30)


def test_a_program_past_its_time_is_stopped_with_what_it_started(tmp_path) -> None:
    ids = tmp_path / "ids"
    program = SPAWNS_AND_WAITS.replace("flush=True)", f"file=open({str(ids)!r}, 'w'), flush=True)")
    # The program waits 300 s: the timeout, not its end, is what raises here.
    with pytest.raises(BackgroundTimeout, match="ran past its 2 s"):
        run_guarded([sys.executable, "-c", program], timeout_seconds=2)
    parent, grandchild = map(int, ids.read_text().split())
    assert _gone(parent) and _gone(grandchild)


def test_a_server_answers_inside_the_block_and_is_gone_after_it() -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    with serve(command, ready_url=url, start_timeout_seconds=30) as server:
        with urllib.request.urlopen(url, timeout=5) as response:
            assert response.status == 200
        assert server.startup_seconds > 0
        assert "GET / HTTP" in server.log_tail()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def test_a_server_that_exits_during_start_up_says_so() -> None:
    command = [sys.executable, "-c", "print('cannot start'); raise SystemExit(4)"]
    url = f"http://127.0.0.1:{free_port()}/"
    with (
        pytest.raises(BackgroundError, match=r"exited with code 4(.|\n)*cannot start"),
        serve(command, ready_url=url, start_timeout_seconds=30),
    ):
        pass


def test_a_server_that_never_answers_is_stopped_at_its_start_timeout(tmp_path) -> None:
    ids = tmp_path / "ids"
    program = SPAWNS_AND_WAITS.replace("flush=True)", f"file=open({str(ids)!r}, 'w'), flush=True)")
    url = f"http://127.0.0.1:{free_port()}/"
    with (
        pytest.raises(BackgroundTimeout, match="did not answer within 2 s"),
        serve([sys.executable, "-c", program], ready_url=url, start_timeout_seconds=2),
    ):
        pass
    parent, grandchild = map(int, ids.read_text().split())
    assert _gone(parent) and _gone(grandchild)


def test_nothing_outlives_a_caller_killed_with_sigkill(tmp_path) -> None:
    """As when Jupyter kills a kernel: no `finally` runs in the caller, the guardian acts."""
    ids = tmp_path / "ids"
    program = SPAWNS_AND_WAITS.replace("flush=True)", f"file=open({str(ids)!r}, 'w'), flush=True)")
    caller = textwrap.dedent(
        f"""
        import sys, time
        from tpuready.runtime.background import run_guarded
        run_guarded([sys.executable, "-c", {program!r}], timeout_seconds=300)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", caller])
    deadline = time.monotonic() + 30
    while not (ids.exists() and len(ids.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the program never started"
        time.sleep(0.1)
    process.send_signal(signal.SIGKILL)
    process.wait()
    parent, grandchild = map(int, ids.read_text().split())
    assert _gone(parent) and _gone(grandchild)


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda: run_guarded("python -c 1", timeout_seconds=5), "command must be a non-empty"),
        (lambda: run_guarded([], timeout_seconds=5), "command must be a non-empty"),
        (lambda: run_guarded(["true"], timeout_seconds=0), "timeout_seconds"),
        (
            lambda: serve(
                ["true"], ready_url="http://127.0.0.1:1/", start_timeout_seconds=-1
            ).__enter__(),
            "start_timeout_seconds",
        ),
    ],
)
def test_bad_arguments_are_named(call, named: str) -> None:
    with pytest.raises(InputError, match=named):
        call()


def test_a_program_that_ignores_sigterm_gets_sigkill_after_the_grace_period(tmp_path) -> None:
    ids = tmp_path / "ids"
    program = SPAWNS_AND_WAITS.replace(
        "import os, subprocess, sys, time",
        "import os, signal, subprocess, sys, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)",
    ).replace("flush=True)", f"file=open({str(ids)!r}, 'w'), flush=True)")
    with pytest.raises(BackgroundTimeout):
        run_guarded([sys.executable, "-c", program], timeout_seconds=1)
    parent, _ = map(int, ids.read_text().split())
    assert _gone(parent, within_seconds=5)  # the grace period is over when run_guarded returns


def test_an_interrupted_call_stops_the_program_while_the_caller_lives_on(tmp_path) -> None:
    """Jupyter's interrupt button: KeyboardInterrupt in the caller, which keeps running."""
    ids = tmp_path / "ids"
    program = SPAWNS_AND_WAITS.replace("flush=True)", f"file=open({str(ids)!r}, 'w'), flush=True)")
    caller = textwrap.dedent(
        f"""
        import signal, sys, time
        from tpuready.runtime.background import run_guarded
        # A kernel turns Ctrl-C into KeyboardInterrupt whatever it inherited; a runner started
        # as a shell's background job passes SIGINT ignored, and Python would keep it so.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            run_guarded([sys.executable, "-c", {program!r}], timeout_seconds=300)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        time.sleep(60)
        """
    )
    process = subprocess.Popen([sys.executable, "-c", caller], stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not (ids.exists() and len(ids.read_text().split()) == 2):
            assert time.monotonic() < deadline, "the program never started"
            time.sleep(0.1)
        process.send_signal(signal.SIGINT)
        assert process.stdout.readline() == "interrupted\n"
        parent, grandchild = map(int, ids.read_text().split())
        assert _gone(parent) and _gone(grandchild)
        assert process.poll() is None, "the caller itself goes on"
    finally:
        process.kill()
        process.wait()


def test_a_process_the_server_started_that_ignores_sigterm_is_killed_too(tmp_path) -> None:
    ids = tmp_path / "ids"
    stubborn_child = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(300)"
    )
    program = textwrap.dedent(
        f"""
        import http.server, os, subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", {stubborn_child!r}])
        print(child.pid, file=open({str(ids)!r}, "w"), flush=True)
        http.server.test(http.server.SimpleHTTPRequestHandler, port=int(sys.argv[1]),
                         bind="127.0.0.1")
        """
    )
    port = free_port()
    command = [sys.executable, "-c", program, str(port)]
    with serve(command, ready_url=f"http://127.0.0.1:{port}/", start_timeout_seconds=30):
        child = int(ids.read_text())
    assert _gone(child, within_seconds=2)  # the grace period was spent inside the block's exit
