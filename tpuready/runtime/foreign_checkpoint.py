"""Checkpoints as another machine would send them, for exercises that grade how they are loaded.

Chapter 2's exercise asks for a loader that takes weights saved on `cuda:3` of a GPU server onto
any device and refuses a checkpoint that runs code. Grading it needs such files without the
server: `save_as_if_saved_on` writes a CPU state dict with another device recorded for every
tensor (what `torch.load` reads to place it), and `RunsCodeWhenLoaded` is a stand-in for a
malicious object, whose unpickling calls a function. `torch.save` stores each tensor's device
as a pickled string inside the archive's `data.pkl`; the writer rewrites that string, so the file
is byte for byte what the other machine would have written, bar the tensors' storage.
"""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import torch

from tpuready.validate import InputError

__all__ = ["ForeignCheckpointError", "RunsCodeWhenLoaded", "save_as_if_saved_on"]

# A device as torch.save records it: a type, then an optional index ("cpu", "cuda:3", "tpu:0").
DEVICE_STRING = re.compile(r"[a-z][a-z0-9_]*(:\d+)?")


class ForeignCheckpointError(InputError):
    """Raised for a state or a device that cannot be written as another machine's checkpoint."""


def _pickled_string(text: str) -> bytes:
    """`text` as pickle's BINUNICODE opcode writes it: 'X', a 4-byte length, the UTF-8 bytes."""
    data = text.encode()
    return b"X" + len(data).to_bytes(4, "little") + data


def save_as_if_saved_on(state: dict[str, torch.Tensor], path: Path | str, device: str) -> None:
    """`torch.save` a CPU `state` to `path`, recording `device` (e.g. 'cuda:3') as every
    tensor's device, as if it had been saved there."""
    if not isinstance(device, str) or not DEVICE_STRING.fullmatch(device):
        raise ForeignCheckpointError(
            f"device must name a device as torch records it, got {device!r}: "
            "pass a string such as 'cuda:3' or 'tpu:0'"
        )
    if not isinstance(state, dict) or not all(
        isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"
        for tensor in state.values()
    ):
        raise ForeignCheckpointError(
            f"state must map names to CPU tensors, got {type(state).__name__}: "
            "pass module.state_dict() of a model on the CPU"
        )
    buffer = io.BytesIO()
    torch.save(state, buffer)
    cpu_tag, foreign_tag = _pickled_string("cpu"), _pickled_string(device)
    with zipfile.ZipFile(buffer) as source, zipfile.ZipFile(path, "w") as out:
        for item in source.infolist():
            data = source.read(item)
            if item.filename.endswith("/data.pkl"):
                data = data.replace(cpu_tag, foreign_tag)
            out.writestr(item, data)


class RunsCodeWhenLoaded:
    """Unpickling this object calls `print`: a stand-in for any code a checkpoint could run."""

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return print, ("this line ran while the checkpoint loaded",)
