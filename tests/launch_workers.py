"""Workers for tests/test_launch.py: spawned processes import them from this file.

Each takes `(rank, world_size, ...)` as `tpuready.runtime.launch.run_workers` passes them.
"""

from __future__ import annotations

import gc
import multiprocessing.connection
import os
import struct
import sys
import time
import warnings
from pathlib import Path

import psutil  # installed with ipykernel
import torch
import torch.distributed as dist

from tpuready.runtime.offline import network_guard_installed


def noisy_all_reduce(rank: int, world_size: int, scale: float = 1.0) -> dict[str, object]:
    """Print, warn and write to fd 2 (none of it may reach the caller), then sum over ranks."""
    print(f"rank {rank} says hello on stdout")
    print(f"rank {rank} says hello on stderr", file=sys.stderr)
    warnings.warn(f"rank {rank} warns", UserWarning, stacklevel=1)
    os.write(2, f"rank {rank} writes to fd 2\n".encode())
    values = torch.tensor([float(rank + 1) * scale])
    dist.all_reduce(values)
    gathered = [torch.zeros(1) for _ in range(world_size)]
    dist.all_gather(gathered, torch.tensor([float(rank)]))
    return {
        "rank": rank,
        "sum": values.item(),
        "gathered": [tensor.item() for tensor in gathered],
        "environment": {name: os.environ[name] for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE")},
        "master_addr": os.environ["MASTER_ADDR"],
        "gloo_interface": os.environ.get("GLOO_SOCKET_IFNAME"),
        "offline_guard": network_guard_installed(),
        "socket_addresses": sorted(
            {
                address.ip
                for connection in psutil.Process().net_connections(kind="inet")
                for address in (connection.laddr, connection.raddr)
                if address
            }
        ),
        "pid": os.getpid(),
    }


def fail_on_one_rank(rank: int, world_size: int, failing_rank: int) -> float:
    """`failing_rank` raises; the others block in an all_reduce it never joins."""
    if rank == failing_rank:
        print(f"rank {rank} is about to fail")
        raise ValueError(f"rank {rank} failed on purpose")
    values = torch.ones(1)
    dist.all_reduce(values)
    return values.item()


def exit_abruptly_on_one_rank(rank: int, world_size: int, failing_rank: int) -> float:
    """`failing_rank` leaves with os._exit (no traceback); the others block in an all_reduce."""
    if rank == failing_rank:
        os._exit(3)
    values = torch.ones(1)
    dist.all_reduce(values)
    return values.item()


def fail_late_on_one_rank(rank: int, world_size: int, late_rank: int, silently: bool) -> None:
    """The other ranks raise at once; `late_rank` fails a moment later, by os._exit or raising."""
    if rank == late_rank:
        time.sleep(0.5)
        if silently:
            os._exit(3)
    raise ValueError(f"rank {rank} failed on purpose")


def hang_on_some_ranks(rank: int, world_size: int, hanging_ranks: list[int]) -> int:
    """The ranks in `hanging_ranks` sleep far past any test timeout; the others return."""
    if rank in hanging_ranks:
        time.sleep(3600)
    return rank


def report_pid_and_sleep(rank: int, world_size: int, pid_dir: str) -> int:
    """Write this rank's process id to `pid_dir/rank<N>`, then sleep far past any test."""
    path = Path(pid_dir, f"rank{rank}")
    path.with_suffix(".part").write_text(str(os.getpid()))
    path.with_suffix(".part").rename(path)  # the file appears whole or not at all
    time.sleep(3600)
    return rank


def die_mid_message(rank: int, world_size: int) -> int:
    """Send the caller the first bytes of a message on the result pipe, then die (code 5).

    The pipe is the only open `multiprocessing.connection.Connection` in a rank. The header
    announces 1000 bytes and 7 follow, so the caller's `recv` ends mid-message (OSError).
    """
    (connection,) = [
        item
        for item in gc.get_objects()
        if isinstance(item, multiprocessing.connection.Connection) and not item.closed
    ]
    os.write(connection.fileno(), struct.pack("!i", 1000) + b"partial")
    os._exit(5)


def return_unpicklable(rank: int, world_size: int) -> object:
    """A result that cannot travel back to the caller."""
    return lambda: rank


class Holder:
    """Holds a method that the launcher must refuse (a bound method is not importable)."""

    def work(self, rank: int, world_size: int) -> int:
        return rank


def tensor_result(rank: int, world_size: int) -> torch.Tensor:
    """Return a tensor large enough that torch's multiprocessing pickler would share it."""
    return torch.full((64, 32), float(rank))
