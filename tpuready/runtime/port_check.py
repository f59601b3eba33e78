"""Run a port's launch lines as each rank of a host would, and see where each rank's model went.

Taught in `notebooks/09_fsdp2.ipynb`, whose exercise "Port the launch lines" grades what a
port does, not how it reads. `devices_per_rank` runs the lines once per local rank of a job on
each of two host models, with LOCAL_RANK, LOCAL_WORLD_SIZE, RANK and WORLD_SIZE set as torchrun
sets them:

- a TorchTPU host: `torch.accelerator` shows each process one `tpu` device, index 0, and
  `set_device_index` with another index raises (as TorchTPU 0.2.0's does);
- a multi-device host, CUDA's model: every process sees one `cuda` device per rank, so rank r
  must bind device r itself.

Nothing runs on a device: `torch.accelerator` answers as the host would, the lines'
`dist.init_process_group` records that it was called, and their `model` records where `.to()`
sent it (a device without an index means the process's current device, as on CUDA). The lines
may use `os`, `torch`, `dist` (`torch.distributed`) and `model`, and the book's launcher,
`init_rank()` and `rank_device()` from `tpuready.runtime.launch`, which decides from the same
answers.

The lines run in a fresh Python (`python -m tpuready.runtime.port_check`, reading JSON on stdin):
`torch.device("tpu")` parses only once PrivateUse1 is renamed "tpu", which a process can do
once and a notebook's kernel must not do. That Python loads no device backend (no TorchTPU, no
emulated TPU), so the answers above are the only ones it sees.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any
from unittest import mock

from tpuready.validate import InputError, whole_number

__all__ = [
    "MULTI_DEVICE_HOST",
    "TORCHTPU_HOST",
    "PortCheckError",
    "devices_per_rank",
]

TORCHTPU_HOST = "TorchTPU host"
MULTI_DEVICE_HOST = "multi-device host"
TIMEOUT_SECONDS = 120.0  # a fresh Python imports torch in a few seconds, far more when busy


class PortCheckError(InputError):
    """`devices_per_rank` was given something it cannot run; the message says what and why."""


def devices_per_rank(lines: str, num_ranks: int = 4) -> dict[str, list[str]]:
    """Where each local rank's `model` went when it ran `lines`, for each host model.

    Each entry is a device ("tpu:0", "cuda:2"), or what went wrong instead: the rank's error
    (type and first line), a process group joined other than once, or a model never moved.
    """
    if not isinstance(lines, str):
        raise PortCheckError(f"lines must be Python source as a str, got {type(lines).__name__}")
    num_ranks = whole_number(
        "num_ranks", num_ranks, fix="pass the ranks of one host", error=PortCheckError
    )
    environment = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    environment.pop("TPUREADY_EMULATE_TPU", None)
    completed = subprocess.run(
        [sys.executable, "-m", "tpuready.runtime.port_check"],
        input=json.dumps({"lines": lines, "num_ranks": num_ranks}),
        capture_output=True,
        text=True,
        env=environment,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"the port check's own Python failed:\n{completed.stderr}")
    return json.loads(completed.stdout)


class _Host:
    """What `torch.accelerator` answers in one process of one host, and what the lines did."""

    def __init__(self, host_model: str, num_ranks: int) -> None:
        import torch

        one_device = host_model == TORCHTPU_HOST
        # The second host is CUDA's model, so its devices are CUDA's.
        cuda = "cuda"  # tpuready: ignore[cuda-device-string]
        self.type = "tpu" if one_device else cuda
        self.count = 1 if one_device else num_ranks
        self.index = 0  # the current device, until the process sets one
        self.joins = 0
        self.placed: torch.device | None = None  # where model.to() sent the model

    def current_accelerator(self, check_available: bool = False) -> Any:
        import torch

        return torch.device(self.type)

    def set_device_index(self, index: Any) -> None:
        import torch

        if isinstance(index, str | torch.device):
            index = torch.device(index).index
        if index is None or index == -1:  # torch's "leave it" values
            return
        if self.type == "tpu" and index != 0:
            raise RuntimeError(
                f"set_device_index({index}): a TorchTPU process has one device, index 0"
            )
        if not 0 <= index < self.count:
            raise RuntimeError(
                f"set_device_index({index}): this host has {self.count} {self.type} devices"
            )
        self.index = index

    def init_process_group(self, *args: Any, **kwargs: Any) -> None:
        self.joins += 1

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """torch's answers for this host, while the lines run."""
        import torch
        import torch.distributed as dist

        answers = {
            "current_accelerator": self.current_accelerator,
            "device_count": lambda: self.count,
            "is_available": lambda: True,
            "set_device_index": self.set_device_index,
            "set_device_idx": self.set_device_index,
            "current_device_index": lambda: self.index,
            "current_device_idx": lambda: self.index,
        }
        with contextlib.ExitStack() as stack:
            for name, answer in answers.items():
                stack.enter_context(mock.patch.object(torch.accelerator, name, answer))
            stack.enter_context(
                mock.patch.object(dist, "init_process_group", self.init_process_group)
            )
            yield


class _Model:
    """The script's model, standing in: it records where `.to()` sent it."""

    def __init__(self, host: _Host) -> None:
        self._host = host

    def to(self, *args: Any, **kwargs: Any) -> _Model:
        import torch

        target = kwargs.get("device", args[0] if args else None)
        if isinstance(target, int | str):
            target = torch.device(target)
        if isinstance(target, torch.device):
            index = self._host.index if target.index is None else target.index
            self._host.placed = torch.device(target.type, index)
        return self


def _one_rank(lines: str, host_model: str, rank: int, num_ranks: int) -> str:
    """Run `lines` as local rank `rank` of `num_ranks` on `host_model`; where `model` went."""
    import torch
    import torch.distributed as dist

    import tpuready.runtime.launch

    host = _Host(host_model, num_ranks)
    variables = {  # as torchrun sets them, on one host
        "LOCAL_RANK": str(rank),
        "RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(num_ranks),
        "WORLD_SIZE": str(num_ranks),
    }
    namespace = {
        "os": os,
        "torch": torch,
        "dist": dist,
        "model": _Model(host),
        "init_rank": tpuready.runtime.launch.init_rank,
        "rank_device": tpuready.runtime.launch.rank_device,
    }
    tpuready.runtime.launch.forget_placement()  # each rank is a process of its own
    try:
        # What the lines print goes to stderr: stdout carries the answer.
        with (
            mock.patch.dict(os.environ, variables),
            host.installed(),
            contextlib.redirect_stdout(sys.stderr),
        ):
            exec(compile(lines, "<ported_lines>", "exec"), namespace)
    except Exception as error:  # the lines failed on this rank: say how
        return f"{type(error).__name__}: {error}".splitlines()[0]
    if host.joins != 1:
        return f"joined the process group {host.joins} times"
    if host.placed is None:
        return "model was not moved to a device"
    return str(host.placed)


def _main() -> None:
    """Read {"lines", "num_ranks"} as JSON on stdin; print each host's devices as JSON."""
    import torch

    torch.utils.rename_privateuse1_backend("tpu")  # as TorchTPU does
    request = json.load(sys.stdin)
    lines, num_ranks = request["lines"], request["num_ranks"]
    placed = {
        host: [_one_rank(lines, host, rank, num_ranks) for rank in range(num_ranks)]
        for host in (TORCHTPU_HOST, MULTI_DEVICE_HOST)
    }
    print(json.dumps(placed))


if __name__ == "__main__":
    _main()
