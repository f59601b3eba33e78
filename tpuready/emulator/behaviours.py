"""What the emulated TPU emulates, each with its source and its test: the reference page.

The page "The emulated TPU" (`book/reference/emulated-tpu.md`) is generated from these tuples (by
`tpuready.pages.emulated_tpu`) when the site is built, and `tests/test_emulator.py` checks that
every behaviour names a test that exists, so the page, the code and the tests cannot drift apart.
Sources are the book's notes on TorchTPU 0.2.0 (read from its wheel, documentation and issues; the
set-up page summarises them), by section and line.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BEHAVIOURS", "NEVER_CLAIMED", "NOT_EMULATED", "Behaviour"]


@dataclass(frozen=True)
class Behaviour:
    """One TorchTPU behaviour: what the emulator does, where the notes say so, its test."""

    name: str
    emulated: str
    notes: str
    test: str


BEHAVIOURS: tuple[Behaviour, ...] = (
    Behaviour(
        "Loaded by `import torch`",
        "A `torch.backends` entry point of `tpuready` renames `PrivateUse1` to `tpu` when "
        "`TPUREADY_EMULATE_TPU` is set; it backs off, with one line on stderr, where another "
        "torch backend is installed (TorchTPU on a TPU VM). `python -m tpuready.emulator "
        "script.py` rehearses there anyway: that process loads no other backend.",
        "Packaging, lines 13-19",
        "test_it_backs_off_with_one_line_when_another_tpu_backend_is_installed",
    ),
    Behaviour(
        "The legacy device calls raise",
        "`torch.tpu.is_available`, `device_count`, `current_device`, `set_device`, `device`, "
        "`set_stream`, `current_stream`, `synchronize`, `initial_seed` and `get_rng_state` raise "
        "a RuntimeError naming the portable call (`torch.accelerator`'s; for the two "
        "generator calls, which have none there, `torch.initial_seed`, and the CPU's "
        "`torch.get_rng_state` or a `torch.Generator` of one's own: TorchTPU's public API sets "
        "the device's generator, `torch.tpu.set_rng_state`, but has no getter that works); "
        "`TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1` makes it a one-time warning. Calls from torch's "
        "own modules pass (`torch.accelerator.device_count()` itself calls "
        "`torch.tpu.device_count()`); whether TorchTPU lets `torch.serialization` through is "
        "not documented.",
        "Device-agnostic code, lines 22-27",
        "test_every_legacy_device_call_raises_naming_its_replacement",
    ),
    Behaviour(
        "One device per process",
        "`torch.accelerator.device_count()` is 1; `set_device_index(i)` raises for i other than "
        "0; `.to(1)` lands on `tpu:0` (the report counts each), and so does `.to('tpu:3')`, "
        "which the notes do not cover (the emulator's reading of upstream issue #4164).",
        "Device-agnostic code, lines 32-34",
        "test_one_device_per_process",
    ),
    Behaviour(
        "float32 matmuls in bf16 passes",
        "`mm`, `bmm`, `addmm`, `baddbmm` and `linear` on float32 tensors run as one bf16 pass by "
        "default; `set_float32_matmul_precision` 'high' gives 3 passes, 'highest' 6, and "
        "`torch.tpu.precision(...)` overrides a block. The result equals "
        "`tpuready.inspection.check`'s model of the passes bit for bit. Convolutions and "
        "`grouped_mm` follow the same rule, the emulator's reading (the notes say matmuls); "
        "bf16 matmuls sum in float32 and round once.",
        "Device-agnostic code, lines 36-38",
        "test_float32_matmuls_run_as_1_3_or_6_bf16_passes",
    ),
    Behaviour(
        "Autocast in bfloat16",
        "`torch.autocast('tpu')` defaults to bfloat16. Which operators it casts is CUDA's lists "
        "(matmuls and convolutions down, reductions, norms and losses kept in float32), and "
        "`get_amp_supported_dtype()` is bfloat16 and float16: the emulator's choices, since the "
        "notes give only the default dtype.",
        "Device-agnostic code, line 35",
        "test_autocast_on_the_tpu_is_bfloat16",
    ),
    Behaviour(
        "`torch.compile` patched",
        "With no `backend=`, graphs with TPU inputs go to the `tpu` backend with "
        "`dynamic=False` (a new graph per new shape); on TPU inputs `dynamic=True` raises "
        "NotImplementedError, `mode=` and any option but the backend's own (`bucket_size` and "
        "its kin, accepted and ignored) raise TypeError, `backend='inductor'` raises and "
        "compiling under `torch.inference_mode` raises.",
        "torch.compile on TorchTPU, lines 61-68",
        "test_compile_refuses_what_torchtpu_refuses",
    ),
    Behaviour(
        "Static shapes by default",
        "Three new input lengths compile three graphs; the report counts graphs and recompiles.",
        "torch.compile on TorchTPU, lines 61-63",
        "test_compile_defaults_to_static_shapes_on_the_tpu",
    ),
    Behaviour(
        "`tpu_dist` and the launch rules",
        "`init_process_group()` picks `tpu_dist` (alias `tpu`), which moves the bytes with gloo; "
        "a rank whose launch variables were not set before it started "
        "(`set_tpu_launch_env` in its parent) fails with 'Check failed: client != nullptr'; a "
        "host runs only its generation's rank counts (v5e and v6e: 1, 4 or 8).",
        "Sharding on TorchTPU, lines 83-87",
        "test_set_tpu_launch_env_keeps_the_rank_counts_of_torchtpu",
    ),
    Behaviour(
        "Collectives, DTensor, FSDP2",
        "Every collective gives gloo's CPU result; DTensor over `init_device_mesh('tpu', ...)` "
        "and FSDP2 train, and a reshard frees the gathered parameters.",
        "Sharding on TorchTPU, lines 79-83",
        "test_collectives_on_the_emulated_tpu_equal_gloo_on_the_cpu",
    ),
    Behaviour(
        "Workers are spawned",
        "A process forked from one that loaded the emulator refuses every device operation, as "
        "TorchTPU wants its workers spawned.",
        "Device-agnostic code, line 34",
        "test_a_forked_child_may_not_use_the_device",
    ),
    Behaviour(
        "Mixed devices raise",
        "An operation given tensors on the TPU and the CPU raises 'Expected all tensors to be on "
        "the same device', as on CUDA; a CPU scalar and CPU indices are allowed, as there.",
        "not in the notes: PyTorch's rule on CUDA, which a dispatcher backend shares",
        "test_operations_on_two_devices_raise_as_on_cuda",
    ),
    Behaviour(
        "Real memory",
        "A `tpu` tensor's bytes live in CPU memory the emulator owns: `torch.save` round-trips "
        "them bit for bit, `copy.deepcopy` copies them, `Module.to('tpu')` keeps Parameter "
        "objects, so tied weights stay tied (as a C++ backend with PyTorch's shallow-copy support "
        "does; a Python backend without it unties them), and "
        "`tpuready.emulator.memory_allocated()` counts them. `torch.load(map_location='tpu')` "
        "works here, while chapter 2 calls it untested on TorchTPU.",
        "not in the notes: the emulator's choices, as PyTorch's reference backend OpenReg "
        "makes them",
        "test_save_and_load_round_trip_bit_exact",
    ),
    Behaviour(
        "A second host model: CUDA's",
        "With `TPUREADY_EMULATE_TPU=multi-device[:N]` every process sees N devices and a rank "
        "binds its own; two ranks of one job on one index raise, naming both. (Tensors there "
        "report `tpu:0`: PyTorch's autograd engine takes one index from a Python backend.)",
        "not TorchTPU's: the host of CUDA, ROCm and XPU",
        "test_a_multi_device_host_refuses_two_ranks_on_one_index",
    ),
    Behaviour(
        "Host syncs reported",
        "`.item()`, copies to the host, `print(tensor)` and the data-dependent operators "
        "(`nonzero`, `masked_select`, `unique`, `bincount`, `repeat_interleave` without an "
        "output size, boolean indexing) are counted in the report with the line that made them.",
        "Shapes and alignment, lines 99-101",
        "test_the_report_names_syncs_float64_and_known_gaps",
    ),
    Behaviour(
        "Known gaps reported",
        "Operators on the notes' list of gaps run, and the report names them: Cholesky, `unique` "
        "with `dim`, and for 'some pooling and interpolation gradients' the emulator's guess "
        "(the pooling and upsampling backward operators).",
        "Pain points, line 112 (op coverage gaps)",
        "test_the_report_names_syncs_float64_and_known_gaps",
    ),
)

# Documented TorchTPU behaviours the emulator does not model (and why not).
NOT_EMULATED: tuple[tuple[str, str], ...] = (
    (
        "Guards on a view's `storage_offset` (upstream issue #4163)",
        "Dynamo's own guards decide here; a view at a new offset does not recompile",
    ),
    (
        "`mark_dynamic(t, dim, min=, max=)` and TorchTPU's bucket padding to multiples of 128",
        "a dimension marked dynamic stays dynamic here, unpadded",
    ),
    (
        "`DEFER_AND_FUSE` and the other eager modes",
        "the emulator runs every mode op by op; a rank that diverges does not hang",
    ),
    (
        "`capturable=True` for compiled optimizers",
        "an optimizer compiles without it",
    ),
    (
        "`torch.tpu.ops`, `torch.tpu.optimizers`, `torch.tpu.pallas`",
        "each call raises NotImplementedError naming it",
    ),
    (
        "Matrix-vector and vector products (`mv`, `addmv`, `dot`) in bf16 passes",
        "they run in float32, as `tpuready.inspection.check`'s model keeps them; whether TorchTPU "
        "runs them as passes is not documented",
    ),
    (
        "`python -m torch.tpu.distributed`, which prints the launch environment",
        "the emulator's `torch.tpu` is no package on disk; `set_tpu_launch_env` sets it",
    ),
    (
        "Multi-slice launches, `topology_aware_mesh`'s torus layout, compilation caches",
        "one host; ranks are laid out in order",
    ),
)

# What no figure measured under the emulator tells you about a TPU.
NEVER_CLAIMED: tuple[str, ...] = (
    "speed: every operator runs on the CPU, one at a time, through Python",
    "memory capacity: `get_device_properties().total_memory` is this machine's RAM",
    "compile time, and XLA's fusion: the `tpu` backend runs its graphs op by op",
    "numerics beyond the matmul passes: everything else is the CPU's float32 arithmetic",
    "operator coverage: an operator the CPU has runs here even if TorchTPU lacks it",
)
