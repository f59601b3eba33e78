"""The emulated TPU's state in this process: its host, current device, matmul passes, claims.

Everything the kernels, `torch.tpu` and the patched `torch.accelerator` calls read lives here,
so the two host models differ in one place.
"""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import torch

from tpuready.emulator.host import TORCHTPU, Host

__all__ = [
    "CLAIMS_PREFIX",
    "PASSES_FOR_PRECISION",
    "STALE_CLAIMS_SECONDS",
    "EmulatorState",
    "remove_stale_claims",
    "state",
]

# Float32 matmul passes for each `torch.set_float32_matmul_precision` level, as TorchTPU remaps
# them: medium -> DEFAULT (1 bf16 pass), high -> HIGH (3), highest -> HIGHEST (6).
PASSES_FOR_PRECISION = {"medium": 1, "high": 3, "highest": 6}
DEFAULT_PASSES = 1  # TorchTPU's default, whatever torch's own setting says


class EmulatorState:
    """One per process, made when the emulator loads."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self.current_index = 0
        self.passes = DEFAULT_PASSES
        self.local = threading.local()  # .precision_stack: torch.tpu.precision overrides
        self.eager_mode = "DEFER_NEVER"
        self.generator = torch.Generator()  # the device's generator, apart from the CPU's
        self.launch_environment: str | None = None  # the launch variables at start
        self._claimed: set[int] = set()
        self.initialized = host.model == TORCHTPU  # TorchTPU initialises at load

    @property
    def device_count(self) -> int:
        """Devices this process sees: 1 under TorchTPU, the host's N on a multi-device host."""
        return self.host.devices_per_process

    def active_passes(self) -> int:
        """bf16 passes per float32 matmul now: a `torch.tpu.precision` block, else the setting."""
        stack = getattr(self.local, "precision_stack", None)
        return stack[-1] if stack else self.passes

    def resolve(self, device: torch.device | None) -> int:
        """The (logical) device index a `tpu` request lands on. TorchTPU drops any index (one
        device per process, upstream issue #4164). A multi-device host checks and claims it;
        there index 0 also means "the current device", because PyTorch's C++ side fills a
        missing index with the device guard's, which is always 0 for a Python backend."""
        from tpuready.emulator.findings import report

        index = None if device is None else device.index
        if self.host.model == TORCHTPU:
            if index not in (None, 0):
                report().record("ignored_indices", f"tpu:{index} -> tpu:0")
            return 0
        if not index:
            index = self.current_index
        self.check_index(index)
        self.claim(index)
        return index

    def check_index(self, index: int) -> None:
        """Refuse an index the host does not have, as CUDA does ("invalid device ordinal")."""
        if not 0 <= index < self.device_count:
            raise RuntimeError(
                f"invalid device ordinal: tpu:{index} on the emulated {self.host.describe()}, "
                f"whose indices are 0 to {self.device_count - 1}"
            )

    def claim(self, index: int) -> None:
        """Record that this rank uses device `index`; another rank of the job on it is an error.

        Only a rank of a launched job (RANK and MASTER_PORT set) claims. Claims are files in a
        folder per job, each naming the rank and process that holds the index."""
        if index in self._claimed:
            return
        rank, port = os.environ.get("RANK"), os.environ.get("MASTER_PORT")
        if rank is None or port is None:
            self._claimed.add(index)
            return
        job = os.environ.get("TORCHELASTIC_RUN_ID") or f"{os.environ.get('MASTER_ADDR', '')}-{port}"
        folder = Path(tempfile.gettempdir()) / f"{CLAIMS_PREFIX}{job}"
        if not folder.exists():
            remove_stale_claims(folder.parent)
            folder.mkdir(exist_ok=True)
        claim = folder / f"tpu{index}"
        mine = f"{rank} {os.getpid()}"
        try:
            with open(claim, "x") as file:
                file.write(mine)
        except FileExistsError:
            holder = claim.read_text().split()
            if holder and holder[0] != rank and _alive(int(holder[1])):
                raise RuntimeError(
                    f"ranks {holder[0]} and {rank} of one job both use tpu:{index} on the "
                    f"emulated {self.host.describe()}: on a host with several devices, each rank "
                    "must bind its own, torch.accelerator.set_device_index(local_rank), before "
                    "it makes tensors (tpuready.runtime.launch.init_rank does)"
                ) from None
            claim.write_text(mine)
        self._claimed.add(index)


CLAIMS_PREFIX = "tpuready-emulated-host-"
STALE_CLAIMS_SECONDS = 3600.0  # no job of the book runs an hour: its claims are left over


def remove_stale_claims(parent: Path) -> None:
    """Remove the claim folders of jobs that ended long ago (ranks exit without clean-up)."""
    import shutil
    import time

    for folder in parent.glob(f"{CLAIMS_PREFIX}*"):
        try:
            if time.time() - folder.stat().st_mtime > STALE_CLAIMS_SECONDS:
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


_STATE: EmulatorState | None = None


def state() -> EmulatorState:
    """The emulator's state; raises when the emulated TPU is not loaded in this process."""
    if _STATE is None:
        raise RuntimeError(
            "the emulated TPU is not loaded: set TPUREADY_EMULATE_TPU=1 before Python starts"
        )
    return _STATE


def install(host: Host) -> EmulatorState:
    """Make this process's state (once)."""
    global _STATE
    if _STATE is None:
        _STATE = EmulatorState(host)
    return _STATE
