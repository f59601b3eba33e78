"""Run one worker function on N processes joined by `torch.distributed`, each on its own device.

Taught in the Part II chapters: every sharding lesson starts its ranks with `run_workers`,
so the collectives you watch are real ones between real processes on your laptop.

Each rank's backend and device come from one place, `choose_rank_placement`, used by
`run_workers` and by every worker file's torchrun `main()` (through `init_rank`):

- no accelerator: gloo on the CPU (the laptop, and CI);
- CUDA with at least one GPU per rank: nccl, rank `i` of a host on `cuda:i`; with fewer GPUs
  than ranks (4 ranks on a 1-GPU workstation): gloo on the CPU, and the reason says so;
- a TPU (TorchTPU): `tpu_dist`, every rank on `tpu:0`, as TorchTPU shows each process its
  one device; the launch variables TorchTPU needs are set in the caller first
  (`prepare_launch_environment`), and a host runs only the rank counts of its generation
  (`tpuready.calc.hardware.TPU_RANKS_PER_HOST`; `smallest_world_size` picks a count it runs);
- the book's emulated multi-device host (`TPUREADY_EMULATE_TPU=multi-device`, CUDA's host
  model with the device type `tpu`): one device per rank, as for CUDA below;
- another accelerator: its default backend in torch.distributed (xccl for XPU) with one
  device per rank, else gloo on the CPU.

A worker asks `rank_device()` for its device and builds meshes with
`init_device_mesh(rank_device().type, ...)`, so a CPU fallback makes a CPU mesh.

What `run_workers` guarantees, and why:

- Processes start with `spawn`, as TorchTPU requires (`fork` is unsafe once threads exist).
  So the worker must be a module-level function in an importable .py file: a notebook
  keeps its workers in a file next to it.
- Everything stays on this machine: the caller binds a free port on 127.0.0.1 and hands the
  socket to rank 0, whose rendezvous store listens there (and nowhere else); gloo and NCCL
  use the loopback interface.
- The ranks print nothing to your screen. Each rank's stdout, stderr and warnings go to a
  temporary log file; the tail of that log comes back inside the error if the rank fails.
  Results come back as return values, in rank order, so output is the caller's to print.
- A failing rank raises `WorkerCrashedError` in the caller at once, with its traceback (the
  other ranks get up to `FAILURE_GRACE_SECONDS` to report too, so that when a rank's silent
  death made its peers' collectives fail, the dead rank is the one named). Ranks
  that take too long raise `WorkersTimedOutError`, which names them. Two clocks run: one for
  start-up (importing torch and joining the group takes 2-4 s per rank, far more on a busy
  laptop) and one for the worker itself, started once every rank has joined.
  Either way every process is ended and reaped.
- Nothing outlives the caller, even one killed with SIGKILL (or SIGTERM, whose default
  handler skips `finally`): each rank watches its parent and exits the moment the parent
  is gone, and the logs are files without a name on disk (unlinked when created), so the
  system frees them once the last process holding them ends.
- A rank that dies, cleanly or halfway through sending its result, is reported the same
  way: which rank, its exit code, and the last lines of its log.

Why `run_workers` is not built on `torch.distributed.launcher.api.elastic_launch` (read in
torch 2.13, and measured on this book's 2-core machine). elastic_launch already spawns
`nproc_per_node` processes (`spawn` by default) under a local elastic agent with a
rendezvous, sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE and MASTER_ADDR/PORT,
can redirect each rank's stdout and stderr to files, returns `{rank: return value}`
(through a multiprocessing queue, the ranks waiting until the agent has read it), wraps
the function in `@record`, so a failure raises `ChildFailedError` naming the first failed
rank with its traceback, restarts failed ranks up to `max_restarts`, and sets PDEATHSIG
(SIGINT, Linux only) in its children. What it lacks, and `run_workers` keeps:

- no clock on the ranks (its rendezvous timeout is for hosts joining): the agent polls until
  every rank exits, so a rank that never joins the group, or a collective that one rank
  never reaches, hangs the caller forever, and nothing names the hung ranks;
- no process group: the function must join one itself, with no start-up clock around it;
- its logs are named folders (`/tmp/torchelastic_*/<run>/attempt_0/<rank>/stdout.log`)
  left on disk after the run, and on a failure the agent logs the rank's traceback to the
  caller's stderr through torch's logging (23 lines for one `ValueError`, measured): text
  on the notebook's screen unless torch's loggers are reconfigured;
- the parent-death watch is PDEATHSIG, which fires on the death of the thread that started
  the rank, not of the process, and on Linux only.

Measured, 2 ranks that join gloo and return their rank: 2.7 s and 2.9 s with elastic_launch,
2.0 s and 1.8 s with `run_workers` (5.5 s against 4.0 s on the first, cold run); one rank
raising right after joining: `ChildFailedError` after 4.8 s, `WorkerCrashedError` after
1.6 s. Building on it would keep its spawning and its result map and rewrite everything
else around it (clocks, silence, log clean-up, parent watch), with more moving parts than
the code here, so this module does not use it.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickle
import socket
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from enum import Enum
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import DupFd
from typing import TYPE_CHECKING, Any, Literal

from tpuready.validate import InputError, number, whole_number

if TYPE_CHECKING:  # torch is imported where it is used: in a rank, after its output is redirected
    import torch

__all__ = [
    "KNOWN_WORKER_WARNINGS",
    "LOG_TAIL_BYTES",
    "LOG_TAIL_LINES",
    "LaunchInputError",
    "LogFile",
    "RankPlacement",
    "WorkerCrashedError",
    "WorkersTimedOutError",
    "allowed_rank_counts",
    "choose_rank_placement",
    "forget_placement",
    "init_rank",
    "prepare_launch_environment",
    "quiet_known_warnings",
    "rank_device",
    "run_torchrun_main",
    "run_workers",
    "smallest_world_size",
]

LOOPBACK_ADDRESS = "127.0.0.1"
LOG_TAIL_LINES = 20
LOG_TAIL_BYTES = 64 * 1024
# A rank whose caller is gone checks this often, and exits with this code.
PARENT_CHECK_SECONDS = 1.0
PARENT_GONE_EXIT_CODE = 1
# After `terminate` (SIGTERM) a process gets this long to exit before `kill` (SIGKILL).
STOP_GRACE_SECONDS = 5.0
# After a rank reports an error, the others get this long to report too, so that a rank whose
# silent death caused that error (its peers' collectives fail) is the one named.
FAILURE_GRACE_SECONDS = 2.0

# The warnings the book's workers are known to trigger, each harmless where they trigger it
# (measured: every worker under torchrun on CPU ranks, torch 2.13): (message, category, module).
KNOWN_WORKER_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    # FSDP2 on a model whose forward returns a view: the workers apply no in-place op to it.
    (r"FSDP2-wrapped module \(.*\) returned a view tensor", UserWarning, r"torch\.distributed"),
    # A module tracker's backward hooks (CommDebugMode, chapter 11) on a first layer whose
    # input needs no gradient: the hook has nothing to report there.
    (
        r"Full backward hook is firing when gradients are computed with respect to module outputs",
        UserWarning,
        "",  # any module: torch attributes it to the frame that runs the backward pass
    ),
)


def quiet_known_warnings() -> None:
    """Hide the warnings in `KNOWN_WORKER_WARNINGS`, and only those, so a worker's log and a
    reader's torchrun screen stay clean while any other warning still shows. Each rank of
    `run_workers` and `run_torchrun_main` calls it: a worker file need not."""
    for message, category, module in KNOWN_WORKER_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)


def run_torchrun_main(main: Callable[[], None], script: str, nproc_per_node: int) -> None:
    """A worker file's entry point: run `main` where torchrun started this process (RANK is
    set), else exit with the torchrun command that runs `script`, instead of failing later."""
    if "RANK" not in os.environ:
        raise SystemExit(
            f"run this file with torchrun, not with python alone: torchrun --standalone "
            f"--nproc-per-node={nproc_per_node} {os.path.relpath(script)}"
        )
    quiet_known_warnings()
    main()


class LaunchInputError(InputError):
    """An argument the launcher cannot use (a count, a timeout, a worker the ranks cannot
    import); an `InputError`, so a `ValueError`, naming the argument and the value."""


class WorkerCrashedError(RuntimeError):
    """A rank raised an exception or died; `rank` names it, the message holds its traceback."""

    def __init__(self, message: str, rank: int, remote_traceback: str, log_tail: str) -> None:
        super().__init__(message)
        self.rank = rank
        self.remote_traceback = remote_traceback
        self.log_tail = log_tail


class WorkersTimedOutError(RuntimeError):
    """Some ranks reported no result within the timeout; `hung_ranks` lists them."""

    def __init__(self, message: str, hung_ranks: list[int]) -> None:
        super().__init__(message)
        self.hung_ranks = hung_ranks


class _FromTorch(Enum):
    """`choose_rank_placement`'s default accelerator: ask torch (None means there is none)."""

    ASK = "ask"


@dataclass(frozen=True)
class RankPlacement:
    """Where one rank runs: its process-group backend, its device, and why, in one sentence."""

    backend: str  # "gloo", "nccl", "tpu_dist", or another accelerator's default ("xccl")
    device: torch.device  # cpu, cuda:<local rank>, tpu:0, or <type>:<local rank>
    reason: str


# The rank's placement once `init_rank` has run in this process; `rank_device` reads it.
_placement: RankPlacement | None = None


def _counted(count: int, noun: str) -> str:
    """`1 CUDA device`, `4 ranks`: a count with its noun, plural when needed."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _check_count(name: str, value: object, minimum: int) -> int:
    """Refuse a count that is not a whole number of at least `minimum` (bools are not counts)."""
    return whole_number(
        name, value, minimum=minimum, fix=f"pass a count, {minimum} or more", error=LaunchInputError
    )


def _one_device_per_process(accelerator: torch.device) -> bool:
    """Whether this `tpu` shows each process one device, as TorchTPU does. The one `tpu` that
    does not is the book's emulated multi-device host (`TPUREADY_EMULATE_TPU=multi-device`),
    which shows every process all its devices, as CUDA does."""
    from tpuready.emulator import emulated_host

    host = emulated_host()
    return accelerator.type == "tpu" and (host is None or host.model == "torchtpu")


def allowed_rank_counts() -> tuple[int, ...] | None:
    """The rank counts TorchTPU starts on one host of this machine's TPU generation
    (`hardware.TPU_RANKS_PER_HOST`); None where any count goes (a CPU, a GPU) or the generation is
    not in the table (a TPU the book does not know: TorchTPU itself then says what it allows)."""
    import torch

    from tpuready.calc import hardware
    from tpuready.emulator import emulated_host

    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is None or not _one_device_per_process(accelerator):
        return None
    host = emulated_host()
    if host is not None:
        return hardware.TPU_RANKS_PER_HOST[host.generation or ""]
    try:
        chip = hardware.chip_for_device_name("tpu", torch.tpu.get_device_name())  # type: ignore[attr-defined]  # TorchTPU's module
    except hardware.NoPeakFigureError:
        return None
    return hardware.tpu_ranks_per_host(chip)


def smallest_world_size(at_least: int = 1) -> int:
    """The fewest ranks, and at least `at_least`, that one host of this machine starts: the
    number asked for on a CPU or a GPU; on a TPU the smallest count its generation allows
    (4 where 2 are asked for on a v5e or v6e host, whose hosts run 1, 4 or 8 ranks)."""
    _check_count("at_least", at_least, 1)
    allowed = allowed_rank_counts()
    if allowed is None:
        return at_least
    fits = [count for count in allowed if count >= at_least]
    if not fits:
        raise LaunchInputError(
            f"a host of this TPU runs at most {max(allowed)} ranks, fewer than {at_least}"
        )
    return min(fits)


def choose_rank_placement(
    local_rank: int,
    local_world_size: int,
    *,
    accelerator: torch.device | Literal[_FromTorch.ASK] | None = _FromTorch.ASK,
    device_count: int | None = None,
) -> RankPlacement:
    """Which backend and device rank `local_rank` of `local_world_size` on this host gets.

    Pure but for one fact: the defaults read `torch.accelerator.current_accelerator(
    check_available=True)` and `torch.accelerator.device_count()` (tests pass a fake
    accelerator and count instead), and a `tpu` accelerator follows the host model of this
    process (TorchTPU's, unless the book's emulated multi-device host is loaded).
    """
    import torch
    import torch.distributed as dist

    _check_count("local_world_size", local_world_size, 1)
    _check_count("local_rank", local_rank, 0)
    if local_rank >= local_world_size:
        raise LaunchInputError(
            f"local_rank must be below local_world_size ({local_world_size}), got {local_rank}"
        )
    if accelerator is _FromTorch.ASK:
        accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is not None and not isinstance(accelerator, torch.device):
        raise LaunchInputError(f"accelerator must be a torch.device or None, got {accelerator!r}")
    if accelerator is None or accelerator.type == "cpu":
        return RankPlacement("gloo", torch.device("cpu"), "no accelerator: gloo on the CPU")
    kind = accelerator.type
    if _one_device_per_process(accelerator):
        return RankPlacement(
            "tpu_dist",
            torch.device("tpu", 0),
            "a TPU: tpu_dist, and every TorchTPU rank sees its one device as tpu:0",
        )
    if device_count is None:
        device_count = torch.accelerator.device_count()
    _check_count("device_count", device_count, 0)
    backend = dist.Backend.default_device_backend_map.get(kind, "gloo")
    if backend == "gloo":  # gloo moves CPU and CUDA tensors only
        return RankPlacement(
            "gloo",
            torch.device("cpu"),
            f"{kind} has no collective backend in torch.distributed: gloo on the CPU",
        )
    if kind == "cuda":
        devices, need = _counted(device_count, "CUDA device"), "NCCL needs one GPU per rank"
    else:
        devices, need = _counted(device_count, f"{kind} device"), f"{backend} needs one per rank"
    ranks = _counted(local_world_size, "rank")
    if device_count < local_world_size:
        fix = ""
        if device_count > 0:
            them = "it" if device_count == 1 else "them"
            fix = f"; start at most {_counted(device_count, 'rank')} per host to use {them}"
        return RankPlacement(
            "gloo", torch.device("cpu"), f"{ranks} but {devices}: gloo on the CPU ({need}){fix}"
        )
    # One device per rank is counted above, and a TPU returned earlier with its index 0.
    device = torch.device(kind, local_rank)  # tpuready: ignore[set-device-index]
    return RankPlacement(backend, device, f"{ranks} on {devices}: {backend}, this rank on {device}")


def _read_environment_count(name: str, minimum: int) -> int:
    """An integer launch variable (LOCAL_RANK ...), or an error that names it and the fix."""
    value = os.environ.get(name)
    if value is None:
        raise RuntimeError(
            f"{name} is not set: start this process with torchrun (which sets LOCAL_RANK and "
            "LOCAL_WORLD_SIZE) or through tpuready.runtime.launch.run_workers"
        )
    try:
        return _check_count(name, int(value), minimum)
    except ValueError:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}") from None


def init_rank(
    *,
    timeout: timedelta | None = None,
    store: Any = None,
    rank: int | None = None,
    world_size: int | None = None,
) -> RankPlacement:
    """Join the default process group with this rank's backend and set its device.

    LOCAL_RANK and LOCAL_WORLD_SIZE come from the environment (torchrun and `run_workers`
    set both); `rank`, `world_size`, `store` and `timeout` go to `init_process_group` when
    given (else it reads RANK, WORLD_SIZE and MASTER_ADDR/PORT). On an accelerator with one
    device per rank, the device is set before joining: NCCL binds its communicator to it.
    """
    global _placement
    import torch
    import torch.distributed as dist

    local_rank = _read_environment_count("LOCAL_RANK", 0)
    local_world_size = _read_environment_count("LOCAL_WORLD_SIZE", 1)
    placement = choose_rank_placement(local_rank, local_world_size)
    if placement.device.type != "cpu":  # on TorchTPU, index 0: each rank's only device
        torch.accelerator.set_device_index(placement.device.index)
    options: dict[str, Any] = {"backend": placement.backend}
    for name, value in {
        "timeout": timeout,
        "store": store,
        "rank": rank,
        "world_size": world_size,
    }.items():
        if value is not None:
            options[name] = value
    dist.init_process_group(**options)
    _placement = placement
    return placement


def forget_placement() -> None:
    """Forget this process's placement, as a new rank process starts with none (port_check
    runs each rank's lines in one process)."""
    global _placement
    _placement = None


def rank_device() -> torch.device:
    """This rank's device, as `init_rank` chose it: where its tensors and mesh belong."""
    if _placement is None:
        raise RuntimeError(
            "rank_device() is called before init_rank(): join the group with "
            "tpuready.runtime.launch.init_rank() (run_workers does it in each rank) first"
        )
    return _placement.device


def prepare_launch_environment(nproc_per_node: int, nnodes: int = 1) -> None:
    """Set what the ranks need in the caller, before spawning them; only a TPU needs anything.

    TorchTPU ranks read launch variables from their parent's environment; without them the
    first collective fails with "Check failed: client != nullptr".
    """
    import torch

    _check_count("nproc_per_node", nproc_per_node, 1)
    _check_count("nnodes", nnodes, 1)
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is not None and _one_device_per_process(accelerator):
        torch.tpu.distributed.set_tpu_launch_env(nnodes=nnodes, nproc_per_node=nproc_per_node)  # type: ignore[attr-defined]  # TorchTPU's module


def run_workers(
    worker: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_seconds: float = 120.0,
    startup_timeout_seconds: float = 120.0,
    **kwargs: Any,
) -> list[Any]:
    """Call `worker(rank, world_size, *args, **kwargs)` on `world_size` processes; return results.

    Each process has joined the default process group (`init_rank`: gloo on a CPU, nccl with
    a GPU per rank, tpu_dist on a TPU) before `worker` runs and leaves it afterwards, so the
    worker can call `dist.all_reduce` and friends directly, on the device `rank_device()`
    names. The returned list holds the worker's return values ordered by rank; arguments and
    results travel by pickle, so both must be picklable (plain numbers, lists, CPU tensors).
    Every rank must join the group within `startup_timeout_seconds` of the start, and
    return within `timeout_seconds` of the moment the last rank joined. A rank ends as soon
    as it has reported, without running `atexit` hooks: close any file the worker writes.
    The two timeouts belong to the launcher; any other keyword goes to the worker.
    """
    world_size = _check_count("world_size", world_size, 1)
    _check_seconds("timeout_seconds", timeout_seconds)
    _check_seconds("startup_timeout_seconds", startup_timeout_seconds)
    _check_importable(worker)
    try:
        payload = pickle.dumps((worker, args, kwargs))
    except Exception as error:
        raise TypeError(
            f"the worker's arguments must be picklable to reach the other processes: {error}"
        ) from error

    # The group's own timeout outlasts both clocks, so that a hang is reported by the
    # launcher, with the ranks' names, rather than as a backend error on the ranks that waited.
    group_timeout_seconds = startup_timeout_seconds + timeout_seconds
    prepare_launch_environment(world_size)
    context = multiprocessing.get_context("spawn")
    processes: list[BaseProcess] = []
    process: BaseProcess
    connections: dict[Connection, int] = {}
    logs: list[LogFile] = []
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as store_socket:
        # Port 0 lets the system pick a free port; holding the bound socket until rank 0
        # takes it over means no other program can grab the port in between.
        store_socket.bind((LOOPBACK_ADDRESS, 0))
        try:
            logs.extend(LogFile.create() for _ in range(world_size))
            for rank in range(world_size):
                parent_end, child_end = context.Pipe()
                process = context.Process(
                    target=_run_rank,
                    args=(rank, world_size, store_socket.getsockname()[1], group_timeout_seconds),
                    kwargs={
                        "connection": child_end,
                        "log": logs[rank],
                        "payload": payload,
                        "store_socket": store_socket if rank == 0 else None,
                    },
                    name=f"tpuready-rank{rank}",
                )
                process.start()
                child_end.close()  # the child holds its own copy; ours would hide its EOF
                processes.append(process)
                connections[parent_end] = rank
            results = _collect_results(
                connections, processes, logs, timeout_seconds, startup_timeout_seconds
            )
            exit_deadline = time.monotonic() + STOP_GRACE_SECONDS
            for process in processes:  # every rank has reported: let them exit on their own
                process.join(max(exit_deadline - time.monotonic(), 0))
            return results
        finally:
            _stop(processes)
            for connection in connections:
                connection.close()
            for log in logs:
                log.close()


def _check_seconds(name: str, value: object) -> None:
    """Refuse a duration that is not a positive, finite number of seconds."""
    number(name, value, fix="pass a number of seconds, such as 60", error=LaunchInputError)


def _check_importable(worker: Callable[..., Any]) -> None:
    """Refuse, before anything starts, a worker that spawned processes could not import."""
    if not callable(worker):
        raise TypeError(f"worker must be a function, got {worker!r}")
    module_name = getattr(worker, "__module__", None)
    qualified_name = getattr(worker, "__qualname__", None)
    found: object = None
    if module_name not in (None, "__main__", "__mp_main__") and qualified_name:
        try:
            found = importlib.import_module(module_name)
            for attribute in qualified_name.split("."):
                found = getattr(found, attribute)
        except (ImportError, AttributeError):
            found = None
    if found is not worker:
        raise LaunchInputError(
            f"worker {qualified_name or worker!r} (module {module_name!r}) cannot be imported by "
            "the spawned processes: put the worker in an importable .py file as a module-level "
            "function (not a lambda, a nested function, or a function defined in a notebook or "
            "in __main__) and import it from there"
        )


def _collect_results(
    connections: dict[Connection, int],
    processes: list[BaseProcess],
    logs: list[LogFile],
    timeout_seconds: float,
    startup_timeout_seconds: float,
) -> list[Any]:
    """Read each rank's messages ("joined", then a result or an error) until all have reported.

    Raises as soon as a rank fails, or when a rank misses the start-up or the worker clock.
    """
    world_size = len(processes)
    results: list[Any] = [None] * world_size
    pending = dict(connections)  # the ranks that have not reported a result yet
    joined: set[int] = set()
    deadline = time.monotonic() + startup_timeout_seconds
    while pending:
        ready: list[Connection] = wait(list(pending), timeout=max(deadline - time.monotonic(), 0))  # type: ignore[assignment]  # wait returns some of the Connections it got
        if not ready:
            _stop(processes)
            raise _timed_out(
                joined,
                sorted(pending.values()),
                world_size,
                logs,
                timeout_seconds,
                startup_timeout_seconds,
            )
        failures: list[tuple[int, tuple[str, str] | None]] = []
        for connection in ready:
            rank = pending[connection]
            kind, value = _read_message(connection)
            if kind == "joined":
                joined.add(rank)
                if len(joined) == world_size:  # everyone is in: the worker's clock starts
                    deadline = time.monotonic() + timeout_seconds
            elif kind == "result":
                results[rank] = value
                del pending[connection]
            else:
                failures.append((rank, value))
                del pending[connection]
        if failures:
            failures.sort(key=lambda failure: (failure[1] is not None, failure[0]))
            if failures[0][1] is not None:
                failures.extend(_silent_deaths(pending))
            raise _crashed(failures, joined, processes, logs)
    return results


def _read_message(connection: Connection) -> tuple[str, Any]:
    """One message from a rank: ("joined", None), ("result", value) or ("error", details).

    The details are a (summary, traceback) pair, or None for a rank that ended without a word.
    """
    try:
        return pickle.loads(connection.recv_bytes())
    except (EOFError, OSError):
        # The process died without a word (killed, os._exit, segfault), or halfway through a
        # message (the pipe ends mid-message: OSError). Same report either way.
        return "error", None
    except Exception as error:  # a whole message that cannot be unpickled here
        summary = f"the caller could not unpickle its message: {type(error).__name__}"
        return "error", (f"{summary}: {error}", traceback.format_exc())


def _silent_deaths(pending: dict[Connection, int]) -> list[tuple[int, None]]:
    """The ranks among `pending` that die without a word within `FAILURE_GRACE_SECONDS`.

    A rank's error can reach the caller before the end of the pipe of a rank that died a
    moment earlier (a process closes its files one by one as it exits): the dead rank is
    the cause, and the error that arrived first is only its consequence.
    """
    deaths: list[tuple[int, None]] = []
    waiting = dict(pending)
    grace_deadline = time.monotonic() + FAILURE_GRACE_SECONDS
    while waiting and not deaths:
        ready: list[Connection] = wait(  # type: ignore[assignment]  # wait returns some of the Connections it got
            list(waiting), timeout=max(grace_deadline - time.monotonic(), 0)
        )
        if not ready:
            break
        for connection in ready:
            kind, value = _read_message(connection)
            if kind != "joined":  # a rank that only joined now may still die: keep watching
                rank = waiting.pop(connection)
                if kind == "error" and value is None:
                    deaths.append((rank, None))
    return deaths


def _timed_out(
    joined: set[int],
    unfinished_ranks: list[int],
    world_size: int,
    logs: list[LogFile],
    timeout_seconds: float,
    startup_timeout_seconds: float,
) -> WorkersTimedOutError:
    """The error for ranks that missed a clock, with the last lines each of them wrote."""
    if len(joined) < world_size:
        hung_ranks = [rank for rank in range(world_size) if rank not in joined]
        problem = (
            f"did not join the process group within {startup_timeout_seconds:g} s of starting; "
            "all ranks were stopped. Raise startup_timeout_seconds if this machine is busy."
        )
    else:
        hung_ranks = unfinished_ranks
        problem = (
            f"reported no result within {timeout_seconds:g} s; all ranks were stopped. "
            "Look for a collective that not every rank reaches, or raise timeout_seconds."
        )
    tails = "".join(
        f"\nLast lines of rank {rank}'s output:\n{logs[rank].tail()}" for rank in hung_ranks
    )
    return WorkersTimedOutError(
        f"rank(s) {hung_ranks} of {world_size} {problem}{tails}", hung_ranks
    )


def _crashed(
    failures: list[tuple[int, tuple[str, str] | None]],
    joined: set[int],
    processes: list[BaseProcess],
    logs: list[LogFile],
) -> WorkerCrashedError:
    """Stop every rank, then build the error for the failure that caused the others.

    A rank that died silently (no summary and traceback) wins: its death makes the other
    ranks' collectives fail, and their errors can arrive first. Otherwise the first error to
    arrive wins (the lowest rank among those that arrived together).
    """
    # `failures` is in order of arrival, and min keeps the first of equals.
    rank, error = min(failures, key=lambda failure: failure[1] is not None)
    _stop(processes)
    if error is None:
        summary = f"its process exited with code {processes[rank].exitcode}"
        if rank not in joined:  # the usual cause: spawn re-ran a script's unguarded code
            summary += (
                ' while starting (in a script, call run_workers under `if __name__ == "__main__":`)'
            )
        remote_traceback = "(no traceback: the process ended without reporting)\n"
    else:
        summary, remote_traceback = error
    log_tail = logs[rank].tail()
    return WorkerCrashedError(
        f"rank {rank} of {len(processes)} failed: {summary}\n"
        f"The other ranks were stopped.\n"
        f"Remote traceback of rank {rank}:\n{remote_traceback}"
        f"Last lines of rank {rank}'s output:\n{log_tail}",
        rank,
        remote_traceback,
        log_tail,
    )


def _stop(processes: list[BaseProcess]) -> None:
    """End every process still alive (SIGTERM, then SIGKILL) and reap them all."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for process in processes:
        process.join(max(deadline - time.monotonic(), 0))
        if process.is_alive():
            process.kill()
            process.join()


class LogFile:
    """A rank's log: a file with no name on disk, which the caller and the rank share by fd.

    Nothing to delete afterwards, and nothing left behind if the caller is killed: the
    system frees the file when the last process holding it ends.
    """

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def create(cls) -> LogFile:
        """A new empty log in the temporary folder, unlinked from the start."""
        # On Linux TemporaryFile opens with O_TMPFILE (never named); elsewhere it unlinks
        # the name at once.
        with tempfile.TemporaryFile(prefix="tpuready-rank-") as file:
            return cls(os.dup(file.fileno()))

    def __reduce__(self) -> tuple[Callable[..., LogFile], tuple[Any]]:
        # Pickled while `spawn` starts a rank: DupFd hands the descriptor to the child.
        return _inherit_log, (DupFd(self.fd),)

    def close(self) -> None:
        os.close(self.fd)

    def tail(self) -> str:
        """The last lines the rank wrote, or a note that it wrote nothing."""
        size = os.fstat(self.fd).st_size
        start = max(size - LOG_TAIL_BYTES, 0)
        # pread leaves the offset the rank writes at untouched.
        lines = os.pread(self.fd, size - start, start).decode(errors="replace").splitlines()
        if start > 0:
            lines = lines[1:]  # the first line read may be cut
        if not lines:
            return "(nothing)\n"
        return "\n".join(lines[-LOG_TAIL_LINES:]) + "\n"


def _inherit_log(duplicate: Any) -> LogFile:
    """Rebuild a `LogFile` in the rank from the descriptor `spawn` passed to it."""
    return LogFile(duplicate.detach())


def _exit_with_parent() -> None:
    """End this rank as soon as the process that launched it is gone, however it ended.

    A daemon thread waits on the parent's sentinel (a pipe that reaches end-of-file when the
    parent dies) and, once a second, checks that the parent is still this process's parent.
    """
    parent = multiprocessing.parent_process()
    if parent is None:  # not started by multiprocessing: nothing to watch
        return
    sentinel, parent_id = parent.sentinel, parent.pid

    def watch() -> None:
        while os.getppid() == parent_id:
            if wait([sentinel], timeout=PARENT_CHECK_SECONDS):
                try:
                    if os.read(sentinel, 4096) == b"":  # end of file: the parent is gone
                        break
                except OSError:
                    break
        os._exit(PARENT_GONE_EXIT_CODE)

    threading.Thread(target=watch, name="tpuready-parent-watch", daemon=True).start()


def _send(connection: Connection, message: tuple[str, Any]) -> None:
    """Send a message as plain pickle bytes.

    `Connection.send` would use multiprocessing's pickler, with which torch shares a tensor's
    memory instead of copying it; the rank exits right after sending its result, and the
    caller could then no longer read the tensor.
    """
    connection.send_bytes(pickle.dumps(message))


def _loopback_interface() -> str | None:
    """The loopback network interface's name: `lo` on Linux, `lo0` on macOS."""
    names = {name for _, name in socket.if_nameindex()}
    return next((name for name in ("lo", "lo0") if name in names), None)


def _run_rank(
    rank: int,
    world_size: int,
    master_port: int,
    group_timeout_seconds: float,
    *,
    connection: Connection,
    log: LogFile,
    payload: bytes,
    store_socket: socket.socket | None,
) -> None:
    """The body of each spawned process: silence it, join the group, run the worker, report."""
    _exit_with_parent()
    # First of all, send this process's stdout and stderr (Python's and C++'s: warnings,
    # prints, gloo logs) to its log file, so that nothing reaches the caller's screen.
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log.fd, 1)
    os.dup2(log.fd, 2)
    log.close()
    os.environ.update(
        MASTER_ADDR=LOOPBACK_ADDRESS,
        MASTER_PORT=str(master_port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),  # one host: local rank and world size are the global ones
        LOCAL_WORLD_SIZE=str(world_size),
    )
    interface = _loopback_interface()
    if interface is not None:  # gloo and NCCL otherwise use the address the host resolves to
        os.environ["GLOO_SOCKET_IFNAME"] = interface
        os.environ["NCCL_SOCKET_IFNAME"] = interface

    exit_code = 0
    try:
        import torch.distributed as dist  # imported only now, so its messages go to the log

        quiet_known_warnings()  # as run_torchrun_main does: a failing rank's log stays readable
        worker, args, kwargs = pickle.loads(payload)
        timeout = timedelta(seconds=group_timeout_seconds)
        # Rank 0 serves the rendezvous store on the socket the caller bound; the others connect.
        store = dist.TCPStore(
            LOOPBACK_ADDRESS,
            master_port,
            world_size,
            is_master=rank == 0,
            timeout=timeout,
            master_listen_fd=store_socket.detach() if store_socket is not None else None,
        )
        init_rank(store=store, rank=rank, world_size=world_size, timeout=timeout)
        _send(connection, ("joined", None))
        result = worker(rank, world_size, *args, **kwargs)
        dist.destroy_process_group()
        _send(connection, ("result", result))  # fails here if the result is not picklable
    except BaseException as error:
        exit_code = 1
        summary = f"{type(error).__name__}: {error}".splitlines()[0]
        sys.stdout.flush()
        sys.stderr.flush()
        _send(connection, ("error", (summary, traceback.format_exc())))
        # Wait for the caller to stop us instead of leaving the group now: leaving would make
        # the other ranks fail too, and their errors could reach the caller before ours.
        connection.poll(group_timeout_seconds)
    sys.stdout.flush()
    sys.stderr.flush()
    # Everything the caller needs has been sent: skip the interpreter's teardown, which takes
    # 1-3 s once torch is imported (so a worker must close the files it writes itself).
    os._exit(exit_code)
