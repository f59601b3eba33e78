"""Chapter 8 (meshes and DTensor): a sharded matmul and its collectives.

The notebook runs `sharded_matmul` twice: on a simulated 2x4 mesh in one
process (fake process group and `LocalTensorMode`), and on 4 real ranks
through `tpuready.runtime.launch.run_workers`, which calls `run_rank` on each
rank. Ranks return results and print nothing. As a script, the file runs the
same function under the standard launcher:

    torchrun --standalone --nproc-per-node=4 \\
        notebooks/workers/ch08_sharded_matmul.py

and rank 0 prints every rank's result, in rank order, as one JSON line.
"""

from __future__ import annotations

import json
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import (
    DTensor,
    Replicate,
    Shard,
    distribute_tensor,
)
from torch.distributed.tensor.debug import CommDebugMode

from tpuready.runtime.launch import (
    init_rank,
    rank_device,
    run_torchrun_main,
)

# The operands: A is (rows x inner), B is (inner x cols). Small enough for
# 2 CPU cores; every dimension divides by the mesh sizes used (2 and 4).
ROWS, INNER, COLS = 8, 16, 8
SEED = 0
MESH_DIM_NAMES = ("x", "y")

# The collectives DTensor emits, by the last part of their op's name (the
# same in `c10d_functional` and its native twin `_c10d_functional`), and the
# name the book uses.
COLLECTIVE_NAMES = {
    "all_gather_into_tensor": "all-gather",
    "reduce_scatter_tensor": "reduce-scatter",
    "all_reduce": "all-reduce",
    "shard_dim_alltoall": "all-to-all",
}


def collective_name(op: object) -> str:
    """The book's name for a collective op (`all-gather` ...), else its own."""
    full_name = str(getattr(op, "_overloadpacket", op))
    return COLLECTIVE_NAMES.get(full_name.rsplit(".", 1)[-1], full_name)


class CollectiveRecorder(CommDebugMode):
    """`CommDebugMode` that also records each collective's operand bytes.

    `CommDebugMode` counts collectives; the sizes of what they move (per
    rank, in the order they ran) are what it lacks.
    """

    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, Any]] = []

    def __enter__(self) -> CollectiveRecorder:
        self.records = []
        super().__enter__()
        return self

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        """Let `CommDebugMode` count the op; record a collective's bytes."""
        out = super().__torch_dispatch__(func, types, args, kwargs)
        name = collective_name(func)
        if out is not NotImplemented and name in COLLECTIVE_NAMES.values():
            self.records.append(
                {
                    "collective": name,
                    "input_bytes": args[0].numel() * args[0].element_size(),
                    "output_bytes": out.numel() * out.element_size(),
                }
            )
        return out

    def counts(self) -> dict[str, int]:
        """The counts of `CommDebugMode`, under the book's names, sorted."""
        counted = {
            collective_name(op): n for op, n in self.get_comm_counts().items()
        }
        return dict(sorted(counted.items()))


def make_operands(seed: int = SEED) -> tuple[torch.Tensor, torch.Tensor]:
    """A and B with small integer values: every product and sum is exact."""
    generator = torch.Generator().manual_seed(seed)
    a = torch.randint(-3, 4, (ROWS, INNER), generator=generator).float()
    b = torch.randint(-3, 4, (INNER, COLS), generator=generator).float()
    return a, b


def sharded_matmul(
    mesh: DeviceMesh, a: torch.Tensor, b: torch.Tensor
) -> tuple[DTensor, list[dict[str, Any]], dict[str, int]]:
    """C[I_X, K_Y] = A[I_X, J_Y] @ B[J_Y, K] on a 2-D mesh; collectives kept.

    The matmul moves nothing and leaves C unreduced over y ({U_Y}, a
    `Partial`); the redistribution to C[I_X, K_Y] is one reduce-scatter.
    """
    a_sharded = distribute_tensor(a, mesh, [Shard(0), Shard(1)])
    b_sharded = distribute_tensor(b, mesh, [Replicate(), Shard(0)])
    with CollectiveRecorder() as recorder:
        c_unreduced = a_sharded @ b_sharded  # C[I_X, K]{U_Y}
        c_sharded = c_unreduced.redistribute(mesh, [Shard(0), Shard(1)])
    return c_sharded, recorder.records, recorder.counts()


def run_rank(rank: int, world_size: int) -> dict[str, Any]:
    """One rank: a (2, world_size // 2) mesh, the matmul, what it holds."""
    # "tpu" on a TPU, "cuda" with a GPU per rank, else "cpu" (as here).
    device_type = rank_device().type  # tpuready.runtime.launch chose it
    mesh = init_device_mesh(
        device_type, (2, world_size // 2), mesh_dim_names=MESH_DIM_NAMES
    )
    a, b = make_operands()
    c_sharded, records, counts = sharded_matmul(mesh, a, b)
    return {
        "rank": rank,
        "coordinate": list(mesh.get_coordinate() or []),
        "local_block": c_sharded.to_local().tolist(),
        "full": c_sharded.full_tensor().tolist(),
        "records": records,
        "counts": counts,
    }


def main() -> None:
    """Under torchrun: join, run `run_rank`, rank 0 prints every result."""
    init_rank()  # the backend and device tpuready.runtime.launch chooses
    try:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        result = run_rank(rank, world_size)
        gathered: list[Any] = [None] * world_size
        dist.gather_object(result, gathered if rank == 0 else None, dst=0)
        if rank == 0:
            print(json.dumps(gathered, sort_keys=True))
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    run_torchrun_main(main, __file__, nproc_per_node=4)
