"""Chapter 11's workers run unchanged under torchrun and agree with `run_workers`.

The notebook starts its workers with `tpuready.runtime.launch.run_workers`; the chapter also shows
the standard command, `torchrun --standalone --nproc-per-node=N notebooks/workers/...`. Each
test runs a worker file both ways and compares what rank 0 reports.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import NOTEBOOK_DIR, run_torchrun_with_stderr
from conftest import run_torchrun as run_torchrun_with_timeout

from tpuready.calc.hardware import TPU_RANKS_PER_HOST
from tpuready.runtime.launch import run_workers

# The notebook imports its workers as `workers.ch11_...` from notebooks/; so do we. Spawned
# ranks inherit this sys.path.
if str(NOTEBOOK_DIR) not in sys.path:
    sys.path.insert(0, str(NOTEBOOK_DIR))

from workers import (
    ch11_fsdp_tp_practice,
    ch11_qwen3_tp_plan,
    ch11_tensor_parallel,
    ch11_vocab_parallel,
)

# Importing torch (and transformers) on every rank takes seconds each, far more on a busy
# 2-core machine: generous bounds, so a hang fails the test instead of stalling the suite.
TORCHRUN_TIMEOUT_SECONDS = 400
WORKER_TIMEOUT_SECONDS = 300


def run_torchrun(script: Path, nproc: int) -> dict:
    """Run `script` under torchrun; return rank 0's JSON line (tests/conftest.py)."""
    return run_torchrun_with_timeout(script, nproc, timeout_seconds=TORCHRUN_TIMEOUT_SECONDS)


def assert_same_checksum(printed: float, array: np.ndarray) -> None:
    """A worker's printed `checksum` equals that of `array` to float32 rounding (1e-4 of the
    checksum of its magnitudes: a moved shard or a sign error is far larger)."""
    scale = ch11_tensor_parallel.checksum(np.abs(array))
    expected = ch11_tensor_parallel.checksum(array)
    assert math.isclose(printed, expected, rel_tol=0.0, abs_tol=1e-4 * scale), (printed, expected)


def test_tensor_parallel_worker_under_torchrun_matches_run_workers() -> None:
    world_size = 4
    from_torchrun = run_torchrun(NOTEBOOK_DIR / "workers" / "ch11_tensor_parallel.py", world_size)
    results = run_workers(
        ch11_tensor_parallel.run_all_layouts,
        world_size,
        timeout_seconds=WORKER_TIMEOUT_SECONDS,
        startup_timeout_seconds=WORKER_TIMEOUT_SECONDS,
    )
    from_run_workers = ch11_tensor_parallel.summarise(results[0])
    assert from_torchrun.keys() == from_run_workers.keys() == set(ch11_tensor_parallel.LAYOUTS)
    for layout, expected in from_run_workers.items():
        got = from_torchrun[layout]
        # Same ranks, same seeds, same collectives: the collective counts are equal, and the
        # outputs' checksums agree to float32 rounding (the launchers may differ in threads).
        assert got["forward_collectives"] == expected["forward_collectives"], layout
        assert math.isclose(got["outputs_sum"], expected["outputs_sum"], rel_tol=1e-5), layout
    # And the counts are the chapter's formula: two collectives of each kind per block.
    num_layers = ch11_tensor_parallel.MODEL_SIZES["num_layers"]
    assert from_torchrun["tp"]["forward_collectives"] == {"all_reduce": 2 * num_layers}


def test_qwen3_tp_plan_worker_under_torchrun_matches_run_workers(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    world_size = 2
    from_torchrun = run_torchrun(NOTEBOOK_DIR / "workers" / "ch11_qwen3_tp_plan.py", world_size)
    model = ch11_qwen3_tp_plan.build_and_save_qwen3(str(tmp_path))
    with torch.no_grad():
        reference = model(ch11_qwen3_tp_plan.example_input_ids()).logits.numpy()
    results = run_workers(
        ch11_qwen3_tp_plan.tp_plan_logits,
        world_size,
        str(tmp_path),
        timeout_seconds=WORKER_TIMEOUT_SECONDS,
        startup_timeout_seconds=WORKER_TIMEOUT_SECONDS,
    )
    from_run_workers = ch11_qwen3_tp_plan.summarise(results[0]["logits"], reference)
    # Both launches shard the same seeded model and match the unsharded logits to float32
    # rounding (about 2e-7 here); their checksums agree.
    assert from_torchrun["max_abs_difference"] < 1e-5, from_torchrun
    assert from_run_workers["max_abs_difference"] < 1e-5, from_run_workers
    assert math.isclose(
        from_torchrun["logits_sum"], from_run_workers["logits_sum"], rel_tol=1e-5, abs_tol=1e-3
    )


def test_qwen3_splits_into_every_rank_count_step_6_may_start() -> None:
    """Step 6 starts `smallest_world_size(2)` ranks: 2 on a CPU or a GPU, the smallest count
    of at least 2 that a TPU host runs (4 on v5e and v6e). Column-wise q/k/v and gate/up must
    give each of them whole heads, whole KV heads and an equal share of the MLP."""
    counts = {2} | {min(n for n in allowed if n >= 2) for allowed in TPU_RANKS_PER_HOST.values()}
    assert counts == {2, 4}
    sizes = ch11_qwen3_tp_plan.QWEN3_SIZES
    for count in counts:
        for name in ("num_attention_heads", "num_key_value_heads", "intermediate_size"):
            assert sizes[name] % count == 0, (name, sizes[name], count)
    # Grouped-query attention, as in Qwen3: fewer KV heads than query heads.
    assert sizes["num_key_value_heads"] < sizes["num_attention_heads"]


def test_vocab_parallel_worker_under_torchrun_matches_run_workers() -> None:
    world_size = 4
    from_torchrun = run_torchrun(NOTEBOOK_DIR / "workers" / "ch11_vocab_parallel.py", world_size)
    results = run_workers(
        ch11_vocab_parallel.vocab_parallel_worker,
        world_size,
        timeout_seconds=WORKER_TIMEOUT_SECONDS,
        startup_timeout_seconds=WORKER_TIMEOUT_SECONDS,
    )
    model, input_ids, targets = ch11_vocab_parallel.build_language_model_and_batch()
    reference_loss = ch11_vocab_parallel.next_token_loss(model(input_ids), targets)
    reference_loss.backward()
    reference = reference_loss.item()
    reference_gradients = {
        name: parameter.grad.numpy() for name, parameter in model.named_parameters()
    }
    positions = ch11_tensor_parallel.BATCH_SIZE * ch11_tensor_parallel.SEQ_LEN
    for head in ch11_vocab_parallel.HEADS:
        got, expected = from_torchrun[head], results[0][head]
        assert math.isclose(got["loss"], expected["loss"], rel_tol=1e-6), head
        assert math.isclose(expected["loss"], reference, rel_tol=1e-5), head
        assert [tuple(r) for r in got["loss_sizes"]] == expected["loss_sizes"], head
        # The gradients: every parameter's, gathered whole, equals one process's to float32
        # rounding (the sums over vocabulary shards are ordered differently); the torchrun
        # launch reports the embedding's as a checksum.
        gradients = expected["gradients"]
        assert gradients.keys() == reference_gradients.keys(), head
        for name, reference_gradient in reference_gradients.items():
            np.testing.assert_allclose(
                gradients[name], reference_gradient, rtol=1e-4, atol=1e-6, err_msg=name
            )
        assert_same_checksum(got["embed_gradient_checksum"], gradients["embed.weight"])
        assert np.abs(reference_gradients["embed.weight"]).max() > 0, "a gradient that is zero"
    # loss_parallel: three all-reduces of one float32 per position, logits sharded.
    assert results[0]["loss_parallel"]["loss_sizes"] == [("all_reduce", positions * 4)] * 3
    assert results[0]["loss_parallel"]["local_logits_shape"][-1] == (
        ch11_vocab_parallel.VOCAB_SIZE // world_size
    )
    assert results[0]["gathered"]["loss_sizes"] == []


def test_fsdp_tp_practice_under_torchrun_matches_run_workers() -> None:
    world_size = 4
    from_torchrun, stderr = run_torchrun_with_stderr(
        NOTEBOOK_DIR / "workers" / "ch11_fsdp_tp_practice.py",
        world_size,
        timeout_seconds=TORCHRUN_TIMEOUT_SECONDS,
        extra_env={"TORCH_LOGS": "recompiles"},
    )
    expected = run_workers(
        ch11_fsdp_tp_practice.fsdp_tp_practice,
        world_size,
        timeout_seconds=WORKER_TIMEOUT_SECONDS,
        startup_timeout_seconds=WORKER_TIMEOUT_SECONDS,
    )[0]
    for key in ("meshes", "compiled_graphs", "graph_breaks", "standard_clip_error"):
        assert from_torchrun[key] == expected[key], key
    # The norms' weights on dp alone, the rest on dp x tp: the standard call refuses them.
    assert expected["meshes"] == {"dp": 4, "dp/tp": 14}
    assert expected["standard_clip_error"] == "RuntimeError"
    # One graph per block, and the chapter's reason for the second, read from Dynamo's log.
    assert expected["compiled_graphs"] == ch11_tensor_parallel.MODEL_SIZES["num_layers"]
    assert expected["graph_breaks"] == {}
    assert "tensor 'x' requires_grad mismatch" in stderr
    # The norm of norms is one process's norm; the clipped gradients are its gradients scaled.
    model, inputs = ch11_tensor_parallel.build_model_and_batch()
    model(inputs).pow(2).mean().backward()
    reference_norm = torch.nn.utils.clip_grad_norm_(
        model.parameters(), ch11_fsdp_tp_practice.MAX_NORM
    ).item()
    assert reference_norm > ch11_fsdp_tp_practice.MAX_NORM
    for result in (from_torchrun, expected):
        assert math.isclose(result["norm_before"], reference_norm, rel_tol=1e-5)
        assert math.isclose(result["norm_after"], ch11_fsdp_tp_practice.MAX_NORM, rel_tol=1e-5)
    for name, parameter in model.named_parameters():
        clipped = parameter.grad.numpy()
        np.testing.assert_allclose(
            expected["clipped_gradients"][name], clipped, rtol=1e-4, atol=1e-7, err_msg=name
        )
        assert_same_checksum(from_torchrun["clipped_gradient_checksums"][name], clipped)


def test_by_mesh_refuses_plain_parameters() -> None:
    with pytest.raises(TypeError, match="shard the model first, got a Parameter"):
        ch11_fsdp_tp_practice.by_mesh(torch.nn.Linear(2, 2).parameters())
