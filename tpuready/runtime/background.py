"""Run another program from a notebook: bounded by a clock, and never left running.

Chapter 25 drives vLLM, which lives in a venv of its own, from the book's kernel: offline
generation as a program that runs to its end (`run_guarded`), and the OpenAI-compatible server
as a program that runs while a `with` block does (`serve`). Both start the program under a
guardian, a small Python process (`python -m tpuready.runtime.background`), which puts the program
in a process group of its own and ends that whole group (the program and every process it started)
when

- the program's time is up,
- the caller is done with it (the `with` block or the call ends, even by an exception or an
  interrupt), or
- the caller dies, even by SIGKILL, as when a notebook's kernel is killed: the guardian holds
  the read end of a pipe whose write end only the caller holds, so it reads end of file the
  moment the caller is gone.

It sends SIGTERM first, and SIGKILL to whatever of the group is left after a grace period.
Requests to the program go to 127.0.0.1 directly, whatever proxy the environment names. POSIX
only.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import IO

from tpuready.validate import InputError, number

__all__ = [
    "BackgroundError",
    "BackgroundTimeout",
    "Server",
    "free_port",
    "run_guarded",
    "serve",
]

GRACE_SECONDS = 10.0
"""How long a program has to exit after SIGTERM before its process group gets SIGKILL."""

LOG_TAIL_BYTES = 4000
"""How much of a program's log an error message quotes."""


class BackgroundError(RuntimeError):
    """A program exited with an error, or before it was ready; the message quotes its log."""


class BackgroundTimeout(BackgroundError):
    """A program ran past its time and was stopped; the message quotes its log."""


def _checked_command(command: Sequence[str]) -> list[str]:
    if isinstance(command, str) or not command or not all(isinstance(p, str) for p in command):
        raise InputError(
            f"command must be a non-empty list of strings, got {command!r}: pass it as for "
            "subprocess.run, e.g. ['python', 'script.py']"
        )
    return list(command)


def _checked_seconds(name: str, value: object) -> float:
    return number(name, value, fix="give the seconds the program may take", error=InputError)


def _tail(log: IO[bytes]) -> str:
    size = os.fstat(log.fileno()).st_size
    start = max(0, size - LOG_TAIL_BYTES)
    text = os.pread(log.fileno(), size - start, start).decode(errors="replace")
    return text if start == 0 else "...\n" + text


class _Guarded:
    """One program under its guardian; `stop()` ends its process group."""

    def __init__(
        self,
        command: list[str],
        *,
        env: Mapping[str, str] | None,
        cwd: str | os.PathLike[str] | None,
        stdout: int | IO[bytes],
        stderr: int | IO[bytes],
    ) -> None:
        read_end, self._write_end = os.pipe()
        try:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tpuready.runtime.background",
                    str(read_end),
                    "--",
                    *command,
                ],
                pass_fds=(read_end,),
                start_new_session=True,  # a Ctrl-C in a terminal does not reach the guardian
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env=None if env is None else dict(env),
                cwd=cwd,
            )
        except BaseException:
            os.close(self._write_end)
            raise
        finally:
            os.close(read_end)

    def stop(self) -> None:
        """Close the pipe, so the guardian ends the program's group; wait for the guardian.
        Calling it again does nothing more."""
        if self._write_end >= 0:
            os.close(self._write_end)
            self._write_end = -1
        try:
            self.process.wait(timeout=GRACE_SECONDS + 5)
        except subprocess.TimeoutExpired:  # the guardian is stuck (never seen): end it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def run_guarded(
    command: Sequence[str],
    *,
    timeout_seconds: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> str:
    """Run `command` to its end within `timeout_seconds` and return its standard output;
    raise `BackgroundError` (or `BackgroundTimeout`) with the end of its standard error."""
    program = _checked_command(command)
    seconds = _checked_seconds("timeout_seconds", timeout_seconds)
    with tempfile.TemporaryFile(mode="a+b") as log:
        guarded = _Guarded(program, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=log)
        try:
            output, _ = guarded.process.communicate(timeout=seconds)
        except subprocess.TimeoutExpired:
            guarded.stop()
            guarded.process.communicate()
            raise BackgroundTimeout(
                f"{program[0]} ran past its {seconds:g} s and was stopped; the end of its "
                f"log:\n{_tail(log)}"
            ) from None
        finally:  # an interrupt, too, ends the program and what it started
            guarded.stop()
        if guarded.process.returncode != 0:
            raise BackgroundError(
                f"{program[0]} exited with code {guarded.process.returncode}; the end of its "
                f"log:\n{_tail(log)}"
            )
    return output.decode()


@dataclass
class Server:
    """A program started by `serve`: its log so far, and how long it took to get ready."""

    startup_seconds: float
    _log: IO[bytes]

    def log_tail(self) -> str:
        """The end of what the program has written to its standard output and error."""
        return _tail(self._log)


_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _ready(url: str) -> bool:
    try:
        with _DIRECT.open(url, timeout=2) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, ConnectionError, TimeoutError, http.client.HTTPException):
        return False


@contextlib.contextmanager
def serve(
    command: Sequence[str],
    *,
    ready_url: str,
    start_timeout_seconds: float,
    env: Mapping[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
) -> Iterator[Server]:
    """Start a server, wait until `ready_url` answers 200 (at most `start_timeout_seconds`),
    and stop it, with every process it started, when the `with` block ends."""
    program = _checked_command(command)
    seconds = _checked_seconds("start_timeout_seconds", start_timeout_seconds)
    with tempfile.TemporaryFile(mode="a+b") as log:
        guarded = _Guarded(program, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
        try:
            started = time.perf_counter()
            while not _ready(ready_url):
                if guarded.process.poll() is not None:
                    raise BackgroundError(
                        f"{program[0]} exited with code {guarded.process.returncode} before "
                        f"{ready_url} answered; the end of its log:\n{_tail(log)}"
                    )
                if time.perf_counter() - started > seconds:
                    raise BackgroundTimeout(
                        f"{ready_url} did not answer within {seconds:g} s, so {program[0]} "
                        f"was stopped; the end of its log:\n{_tail(log)}"
                    )
                time.sleep(0.25)
            yield Server(startup_seconds=time.perf_counter() - started, _log=log)
        finally:
            guarded.stop()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a server started next)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _end_group(group: int, program: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the group; SIGKILL to whatever of it is left after the grace period."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_SECONDS
    while time.monotonic() < deadline:
        program.poll()  # reap the program, so that a zombie does not count as left
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return  # the whole group is gone
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(group, signal.SIGKILL)


def _guard(arguments: Sequence[str]) -> int:
    """The guardian: start the program in a group of its own, end the group when the caller's
    pipe closes or the program exits, and exit with the program's code."""
    watched_fd, separator, *program_command = arguments
    if separator != "--" or not program_command:
        raise SystemExit("usage: python -m tpuready.runtime.background FD -- COMMAND ...")
    program = subprocess.Popen(program_command, start_new_session=True)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # after the start: the program keeps SIGINT
    ended = threading.Event()

    def watch_caller() -> None:
        with contextlib.suppress(OSError):
            while os.read(int(watched_fd), 1024):
                pass
        ended.set()
        _end_group(program.pid, program)

    watcher = threading.Thread(target=watch_caller, daemon=True)
    watcher.start()
    code = program.wait()
    if ended.is_set():
        watcher.join()  # it is ending the group: let it finish before this process exits
    else:
        _end_group(program.pid, program)
    return code


if __name__ == "__main__":
    sys.exit(_guard(sys.argv[1:]))
