"""Tests for `tpuready.audit.syntax`: the small readers of Python's syntax that every rule
shares (which text names CUDA, nccl, a rank's own index)."""

from __future__ import annotations

import ast

import pytest

from tpuready.audit import syntax


def expression(code: str) -> ast.expr:
    return ast.parse(code, mode="eval").body


@pytest.mark.parametrize(
    ("code", "nccl"),
    [
        ('"nccl"', True),
        ('"cpu:gloo,cuda:NCCL"', True),
        ("dist.Backend.NCCL", True),
        ('"nccl" if use_gpu else "gloo"', True),
        ('os.environ.get("DIST_BACKEND", "nccl")', True),  # what an unset variable gives
        ('os.environ.get("DIST_BACKEND", default="nccl")', True),
        ('os.getenv("BACKEND") or "nccl"', True),
        ('os.environ.get("DIST_BACKEND", "gloo")', False),
        ('os.environ.get("NCCL_DEBUG")', False),  # a variable's name is not its value
        ('settings.get("backend", "nccl")', False),  # not the environment
        ('"gloo"', False),
        ("backend", False),
    ],
)
def test_which_values_name_nccl(code: str, nccl: bool) -> None:
    assert syntax.is_nccl(expression(code)) is nccl


@pytest.mark.parametrize(
    ("code", "index"),
    [
        ("local_rank", "local_rank"),
        ("args.gpu", "args.gpu"),
        ('int(os.environ["LOCAL_RANK"])', 'int(os.environ["LOCAL_RANK"])'),
        ('int(os.environ.get("LOCAL_RANK", 0))', 'int(os.environ.get("LOCAL_RANK", 0))'),
        ("index", None),
        ("0", None),
        ('int(os.environ["WORLD_SIZE"])', None),
    ],
)
def test_a_ranks_own_index_is_told_from_other_numbers(code: str, index: str | None) -> None:
    shown = syntax.rank_index(expression(code))
    assert shown == (None if index is None else ast.unparse(expression(index)))


@pytest.mark.parametrize(
    ("code", "cuda"),
    [
        ('"cuda"', True),
        ('"cuda:1"', True),
        ('f"cuda:{rank}"', True),
        ('"cuda:" + str(rank)', True),
        ('"cpu"', False),
        ('f"{device_type}:{rank}"', False),  # the accelerator style: a rank index, not CUDA
        ('"cudagraphs"', False),
    ],
)
def test_which_texts_name_a_cuda_device(code: str, cuda: bool) -> None:
    assert syntax.is_cuda_device_text(expression(code)) is cuda


def test_dotted_names_start_at_a_plain_name() -> None:
    assert syntax.dotted_parts(expression("torch.cuda.is_available")) == [
        "torch",
        "cuda",
        "is_available",
    ]
    assert syntax.dotted_parts(expression("get().cuda")) is None
