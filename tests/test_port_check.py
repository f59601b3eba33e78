"""tpuready.runtime.port_check grades what a port does on each host, not how it reads (chapter 9).

`devices_per_rank` runs a port's launch lines once per local rank on a TorchTPU host (one `tpu`
device per process) and on a multi-device host (CUDA's model, one device per rank). Every
correct port must place rank r where it belongs on both; a port that leaves every rank on the
current device, or binds `local_rank` on TorchTPU, must not.
"""

from __future__ import annotations

import pytest

from tpuready.audit import audit_code
from tpuready.runtime.port_check import (
    MULTI_DEVICE_HOST,
    TORCHTPU_HOST,
    PortCheckError,
    devices_per_rank,
)

RIGHT = {TORCHTPU_HOST: ["tpu:0"] * 4, MULTI_DEVICE_HOST: [f"cuda:{r}" for r in range(4)]}

# What `python -m tpuready audit-source` suggests for `torch.cuda.set_device(local_rank)`.
AUDIT_PORT = """
local_rank = int(os.environ["LOCAL_RANK"])
index = local_rank if torch.accelerator.device_count() > 1 else 0
torch.accelerator.set_device_index(index)
device_type = torch.accelerator.current_accelerator().type
device = torch.device(device_type, index)
dist.init_process_group()
model = model.to(device)
"""
# The book's launcher, as chapter 9's workers use it.
LAUNCHER_PORT = """
from tpuready.runtime.launch import init_rank, rank_device
init_rank()
model = model.to(rank_device())
"""
# Passes the audit, yet every rank of a multi-GPU host lands on device 0.
CURRENT_DEVICE_PORT = """
device = (torch.accelerator.current_accelerator(check_available=True)
          or torch.device("cpu"))
dist.init_process_group()
model = model.to(device)
"""


@pytest.mark.parametrize("lines", [AUDIT_PORT, LAUNCHER_PORT], ids=["audit", "launcher"])
def test_every_correct_port_puts_each_rank_on_its_own_device(lines: str) -> None:
    assert audit_code(lines) == []
    assert devices_per_rank(lines) == RIGHT


def test_a_port_to_the_current_device_shares_device_0_on_a_multi_device_host() -> None:
    assert audit_code(CURRENT_DEVICE_PORT) == []  # the text looks right: behaviour tells
    placed = devices_per_rank(CURRENT_DEVICE_PORT)
    assert placed[TORCHTPU_HOST] == RIGHT[TORCHTPU_HOST]
    assert placed[MULTI_DEVICE_HOST] == ["cuda:0"] * 4


def test_binding_local_rank_fails_on_torchtpu_ranks_and_missing_steps_are_named() -> None:
    binds_local_rank = """
local_rank = int(os.environ["LOCAL_RANK"])
torch.accelerator.set_device_index(local_rank)
dist.init_process_group()
model = model.to(torch.accelerator.current_accelerator())
"""
    placed = devices_per_rank(binds_local_rank, num_ranks=2)
    assert placed[MULTI_DEVICE_HOST] == ["cuda:0", "cuda:1"]
    assert placed[TORCHTPU_HOST][0] == "tpu:0"
    assert placed[TORCHTPU_HOST][1].startswith("RuntimeError: set_device_index(1)")
    never_joins = "model = model.to(torch.accelerator.current_accelerator())"
    assert devices_per_rank(never_joins, num_ranks=1)[TORCHTPU_HOST] == [
        "joined the process group 0 times"
    ]


def test_what_the_lines_print_leaves_the_answer_alone() -> None:
    chatty = 'print("joining")\n' + LAUNCHER_PORT
    assert devices_per_rank(chatty, num_ranks=1) == {
        TORCHTPU_HOST: ["tpu:0"],
        MULTI_DEVICE_HOST: ["cuda:0"],
    }


@pytest.mark.parametrize(
    ("lines", "num_ranks", "named"),
    [(b"x = 1", 4, "lines"), ("x = 1", True, "num_ranks"), ("x = 1", 0, "num_ranks")],
)
def test_bad_arguments_name_the_argument(lines: object, num_ranks: object, named: str) -> None:
    with pytest.raises(PortCheckError, match=named):
        devices_per_rank(lines, num_ranks)  # type: ignore[arg-type]
