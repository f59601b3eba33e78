"""The emulated TPU's memory: `tpu` storages over CPU buffers that the emulator owns.

A real backend allocates device memory through a C++ allocator. Here every `tpu` storage is
made by `torch._C._construct_storage_from_data_pointer` over the memory of a CPU storage, and
that CPU storage is kept alive in `_OWNERS` until the `tpu` storage dies (storages keep their
Python object as long as they live, so a weak reference to it says when). The bytes are real:
`torch.save` writes them, `copy.deepcopy` copies them, and a CPU view of the same memory lets
any CPU kernel read and write a `tpu` tensor in place.
"""

from __future__ import annotations

import threading
import weakref
from typing import cast

import torch

__all__ = [
    "SET_STORAGE",
    "adopt",
    "allocated_bytes",
    "cpu_view",
    "cpu_view_and_index",
    "logical_index",
    "new_tensor",
    "on_device",
    "resize_storage",
]

_CPU = torch.device("cpu")
# Every emulated tensor lives on `tpu:0` as far as PyTorch's C++ side knows: a Python backend's
# device guard has one index, and PyTorch's autograd engine refuses any other. The index a rank
# asked for on the multi-device host is kept beside the storage, as its *logical* index.
TPU = torch.device("privateuseone", 0)  # "tpu:0" once the emulator has renamed PrivateUse1
_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
SET_STORAGE = torch.ops.aten.set_.source_Storage_storage_offset
# StorageImpl address -> [CPU storage that owns the bytes, logical index, weak reference].
_OWNERS: dict[int, list] = {}
_LOCK = threading.Lock()


def _forget(key: int) -> None:
    with _LOCK:
        _OWNERS.pop(key, None)


def adopt(cpu_storage: torch.UntypedStorage, index: int = 0) -> torch.UntypedStorage:
    """A `tpu` storage over `cpu_storage`'s bytes; it keeps them alive while it lives."""
    storage = cast(  # torch's stub says a Storage; it returns an UntypedStorage
        "torch.UntypedStorage",
        torch._C._construct_storage_from_data_pointer(
            cpu_storage.data_ptr(), TPU, cpu_storage.nbytes()
        ),
    )
    key = storage._cdata
    reference = weakref.ref(storage, lambda _: _forget(key))
    with _LOCK:
        _OWNERS[key] = [cpu_storage, index, reference]
    return storage


def new_tensor(
    storage: torch.UntypedStorage,
    offset: int | torch.SymInt,
    size: tuple[int, ...] | torch.Size,
    stride: tuple[int, ...],
    dtype: torch.dtype,
) -> torch.Tensor:
    """A plain `tpu` tensor over `storage` (no copy)."""
    tensor = torch._C._acc.create_empty_tensor((0,), dtype)
    SET_STORAGE.redispatch(_CPU_KEYS, tensor, storage, offset, size, stride)
    return tensor


_WIDE = (torch.float64, torch.complex128)


def on_device(cpu_tensor: torch.Tensor, index: int = 0) -> torch.Tensor:
    """`cpu_tensor`'s bytes as a `tpu` tensor of logical `index`, same sizes and strides (every
    new device tensor comes through here: the report counts the float64 ones)."""
    if cpu_tensor.dtype in _WIDE:
        from tpuready.emulator.findings import report

        report().record("float64", f"a {cpu_tensor.dtype} tensor on the device")
    storage = adopt(cpu_tensor.untyped_storage(), index)
    return new_tensor(
        storage,
        cpu_tensor.storage_offset(),
        cpu_tensor.shape,
        cpu_tensor.stride(),
        cpu_tensor.dtype,
    )


def cpu_view_and_index(tensor: torch.Tensor) -> tuple[torch.Tensor, int]:
    """A CPU tensor over the same bytes as the device tensor `tensor` (writes go through), and
    the tensor's logical device index."""
    storage = tensor.untyped_storage()
    with _LOCK:
        owner = _OWNERS.get(storage._cdata)
    if owner is None or owner[0].data_ptr() != storage.data_ptr():
        cpu_storage = torch._C._construct_storage_from_data_pointer(
            storage.data_ptr(), _CPU, storage.nbytes()
        )
        index = 0 if owner is None else owner[1]
    else:
        cpu_storage, index = owner[0], owner[1]
    view = torch.empty(0, dtype=tensor.dtype)
    view.set_(cpu_storage, tensor.storage_offset(), tensor.shape, tensor.stride())
    return view, index


def cpu_view(tensor: torch.Tensor) -> torch.Tensor:
    """A CPU tensor over the same bytes as the device tensor `tensor`: writes go through."""
    return cpu_view_and_index(tensor)[0]


def logical_index(storage: torch.UntypedStorage) -> int:
    """The device index a rank asked for when this storage was made (0 under TorchTPU)."""
    with _LOCK:
        owner = _OWNERS.get(storage._cdata)
    return 0 if owner is None else owner[1]


def _swap(storage: torch.UntypedStorage, other: torch.UntypedStorage) -> None:
    """Swap the bytes of two device storages, and which CPU buffer owns them."""
    storage._swap_data_ptr_(other)  # type: ignore[attr-defined]  # in torch, not in its stub
    with _LOCK:
        mine, theirs = _OWNERS.get(storage._cdata), _OWNERS.get(other._cdata)
        if mine is None or theirs is None:
            raise RuntimeError(
                "the emulated TPU can resize only storages it allocated; this one came from "
                "elsewhere (torch._C._construct_storage_from_data_pointer?)"
            )
        mine[0], theirs[0] = theirs[0], mine[0]


def resize_storage(storage: torch.UntypedStorage, nbytes: int) -> None:
    """Give `storage` `nbytes` bytes, keeping the first ones (FSDP2 frees and refills this way)."""
    if nbytes < 0:
        raise ValueError(f"a storage cannot have {nbytes} bytes")
    if nbytes == storage.nbytes():
        return
    index = logical_index(storage)
    replacement = torch.empty(nbytes, dtype=torch.uint8)
    kept = min(nbytes, storage.nbytes())
    if kept:
        old = torch.empty(0, dtype=torch.uint8).set_(
            torch._C._construct_storage_from_data_pointer(storage.data_ptr(), _CPU, kept)
        )
        replacement[:kept].copy_(old)
    if storage.nbytes():  # _swap_data_ptr_ needs equal sizes or one empty side
        _swap(storage, adopt(torch.UntypedStorage(0), index))
    if nbytes:
        _swap(storage, adopt(replacement.untyped_storage(), index))


def allocated_bytes(index: int | None = None) -> int:
    """Bytes held by live emulated storages (of logical device `index`, or of all devices)."""
    with _LOCK:
        owners = list(_OWNERS.values())
    return sum(o[0].nbytes() for o in owners if index is None or o[1] == index)


def host_memory_bytes() -> int:
    """This machine's RAM: what `get_device_properties().total_memory` reports (not a TPU's HBM)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return 0
