"""Which host the emulated TPU pretends to be: `TPUREADY_EMULATE_TPU`'s value, parsed.

Two host models:

- `torchtpu` (the default, `TPUREADY_EMULATE_TPU=1`): TorchTPU 0.2.0's. Each process sees one
  device, `tpu:0`; a job starts one process per device, and a host holds the rank counts its
  generation allows (`tpuready.calc.hardware.TPU_RANKS_PER_HOST`). `TPUREADY_EMULATE_TPU=v6e-1`
  names the generation and the chips of the host (default `v6e-8`: 8 chips, one VM). The count
  is chips: Cloud's slice names count TensorCores for v4 and v5p (a v5p-8 is 4 chips), and
  here `v5p-4` is that host.
- `multi-device` (`TPUREADY_EMULATE_TPU=multi-device` or `multi-device:8`): the host model of
  CUDA, ROCm and XPU. Every process sees all N devices (default 4); a rank must bind its own
  index, and two ranks of one job on one index is an error naming both.

Both keep the device type `tpu`: the emulator is a `PrivateUse1` backend renamed `tpu`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

__all__ = [
    "DEFAULT_TORCHTPU_HOST",
    "ENVIRONMENT_VARIABLE",
    "MULTI_DEVICE",
    "TORCHTPU",
    "Host",
    "host_from_environment",
    "parse_host",
]

ENVIRONMENT_VARIABLE = "TPUREADY_EMULATE_TPU"
DEFAULT_TORCHTPU_HOST = "v6e-8"
DEFAULT_MULTI_DEVICE_COUNT = 4
MAX_DEVICES = 64
TORCHTPU = "torchtpu"
MULTI_DEVICE = "multi-device"
_OFF = {"", "0"}
_SLICE = re.compile(r"^(?P<generation>v\d+[a-z]*)-(?P<chips>\d+)$")
_MULTI = re.compile(r"^multi-device(?::(?P<devices>\d+))?$")


@dataclass(frozen=True)
class Host:
    """The emulated host: its model, TPU generation (torchtpu model only), chips and devices."""

    model: str
    generation: str | None
    chips: int
    devices: int

    @property
    def devices_per_process(self) -> int:
        """How many devices one process sees: 1 under TorchTPU, all of them otherwise."""
        return 1 if self.model == TORCHTPU else self.devices

    def describe(self) -> str:
        """One phrase for messages and the report: `TorchTPU host v6e-8 (8 devices)`."""
        devices = "1 device" if self.devices == 1 else f"{self.devices} devices"
        if self.model == TORCHTPU:
            return f"TorchTPU host {self.generation}-{self.chips} ({devices})"
        return f"multi-device host ({devices})"


def _syntax_error(value: str) -> ValueError:
    return ValueError(
        f"{ENVIRONMENT_VARIABLE}={value!r} is not a host the emulated TPU knows: use 1 (a "
        f"TorchTPU {DEFAULT_TORCHTPU_HOST} host), a TorchTPU host such as v6e-1, v5p-4 or v7-4 "
        "(generation-chips), or multi-device[:N] (N devices every process sees, as on CUDA)"
    )


def parse_host(value: str) -> Host | None:
    """The host `value` names, or None when it switches the emulator off ("" or "0")."""
    from tpuready.calc.hardware import TPU_RANKS_PER_HOST

    text = value.strip().lower()
    if text in _OFF:
        return None
    if text in ("1", TORCHTPU):
        text = DEFAULT_TORCHTPU_HOST
    text = text.removeprefix(f"{TORCHTPU}:")
    multi = _MULTI.match(text)
    if multi:
        devices = int(multi.group("devices") or DEFAULT_MULTI_DEVICE_COUNT)
        if not 1 <= devices <= MAX_DEVICES:
            raise ValueError(
                f"{ENVIRONMENT_VARIABLE}={value!r}: a multi-device host has 1 to {MAX_DEVICES} "
                f"devices, got {devices}"
            )
        return Host(MULTI_DEVICE, None, devices, devices)
    tpu_slice = _SLICE.match(text)
    if not tpu_slice:
        raise _syntax_error(value)
    generation, chips = tpu_slice.group("generation"), int(tpu_slice.group("chips"))
    if generation not in TPU_RANKS_PER_HOST:
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE}={value!r}: unknown TPU generation {generation!r}; known: "
            f"{', '.join(TPU_RANKS_PER_HOST)}"
        )
    from tpuready.calc.hardware import get_chip

    devices = chips * get_chip(generation).devices_per_chip  # a v7 chip is two devices
    sizes = TPU_RANKS_PER_HOST[generation]  # one rank per device: a host's device counts
    if devices not in sizes:
        chips_per_host = ", ".join(str(n // get_chip(generation).devices_per_chip) for n in sizes)
        raise ValueError(
            f"{ENVIRONMENT_VARIABLE}={value!r}: a {generation} host has {chips_per_host} chips "
            f"(the count after the dash is chips, not Cloud's slice suffix), got {chips}"
        )
    return Host(TORCHTPU, generation, chips, devices)


def host_from_environment() -> Host | None:
    """The host `TPUREADY_EMULATE_TPU` names in this process's environment (None: off)."""
    return parse_host(os.environ.get(ENVIRONMENT_VARIABLE, ""))
