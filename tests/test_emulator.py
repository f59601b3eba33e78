"""The emulated TPU (tpuready/emulator): one test per behaviour it emulates.

The emulator loads when `import torch` runs with TPUREADY_EMULATE_TPU set, and a renamed
PrivateUse1 cannot be undone in a process, so what needs it runs in fresh interpreters:
`tests/emulator_battery.py` once for the single-process behaviours (the tests below read its
JSON), and `run_workers` in a child for the collectives. The host parser, the report and the
launcher's rank rules are plain Python and run here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import tpuready.emulator
import tpuready.runtime.launch
from tpuready.accelerator_api import TORCH_TPU_REFUSED_CALLS
from tpuready.emulator.findings import SECTIONS, EmulationReport, place_in_user_code
from tpuready.emulator.host import MULTI_DEVICE, TORCHTPU, Host, parse_host

REPOSITORY = Path(__file__).resolve().parent.parent
LEGACY = TORCH_TPU_REFUSED_CALLS  # the book's list of the calls TorchTPU 0.2.0 refuses


def run_emulated(
    code: str, host: str = "1", extra: dict[str, str] | None = None, timeout: int = 240
) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with the emulated TPU loaded (host `host`)."""
    environment = {
        **os.environ,
        "TPUREADY_EMULATE_TPU": host,
        "TPUREADY_EMULATE_TPU_REPORT": "off",
        **(extra or {}),
    }
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPOSITORY,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def battery() -> dict[str, Any]:
    """What tests/emulator_battery.py saw, in one emulated interpreter."""
    completed = run_emulated(Path(REPOSITORY / "tests" / "emulator_battery.py").read_text())
    assert completed.returncode == 0, completed.stderr
    return json.loads(completed.stdout.strip().splitlines()[-1])


def seen(battery: dict[str, Any], name: str) -> Any:
    """One check's value; a check that raised fails here with its traceback."""
    value = battery[name]
    assert not (isinstance(value, dict) and "error" in value), battery.get(f"{name}.traceback")
    return value


# --- The reference page -------------------------------------------------------------------


def test_every_behaviour_on_the_reference_page_names_a_test_that_exists() -> None:
    from tpuready.emulator.behaviours import BEHAVIOURS
    from tpuready.pages.emulated_tpu import markdown

    here = sys.modules[__name__]
    for behaviour in BEHAVIOURS:
        assert callable(getattr(here, behaviour.test, None)), behaviour.test
        assert f"**{behaviour.name}.**" in markdown()
    page = (REPOSITORY / "book" / "reference" / "emulated-tpu.md").read_text()
    assert "tpuready.pages.emulated_tpu:markdown" in page


# --- Loading ---------------------------------------------------------------------------


def test_import_torch_alone_gives_an_emulated_tpu_accelerator(battery: dict[str, Any]) -> None:
    device = seen(battery, "device")
    assert device["accelerator"] == "tpu"
    assert device["count"] == 1  # TorchTPU: one device per process
    assert device["is_emulated"] is True
    assert device["name"] == "Emulated TPU (CPU)"
    assert device["tensor"] == "tpu:0"


def test_without_the_variable_nothing_is_loaded() -> None:
    assert not tpuready.emulator.is_emulated()  # this interpreter has no TPUREADY_EMULATE_TPU
    completed = run_emulated(
        "import torch, tpuready.emulator as e; "
        "print(torch.accelerator.current_accelerator(), e.is_emulated())",
        host="0",
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["None", "False"]


def with_a_stand_in_torch_tpu(folder: Path) -> str:
    """A PYTHONPATH on which a stand-in TorchTPU (a `torch.backends` entry point that names
    PrivateUse1 `tpu`) is installed, as TorchTPU is on a TPU VM."""
    (folder / "fake_torch_tpu.py").write_text(
        "def load():\n    import torch\n    torch.utils.rename_privateuse1_backend('tpu')\n"
    )
    info = folder / "fake_torch_tpu-0.2.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-torch-tpu\nVersion: 0.2.0\n")
    (info / "entry_points.txt").write_text("[torch.backends]\ntorch_tpu = fake_torch_tpu:load\n")
    return os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))


def test_it_backs_off_with_one_line_when_another_tpu_backend_is_installed(
    tmp_path: Path,
) -> None:
    """A real TorchTPU (here a stand-in with its entry point) owns the device: the emulator
    says so in one line and leaves PrivateUse1 alone."""
    path = with_a_stand_in_torch_tpu(tmp_path)
    completed = run_emulated(
        "import torch, tpuready.emulator as e; print(e.is_emulated())",
        extra={"PYTHONPATH": path},
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["False"]
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and "TPUREADY_EMULATE_TPU=1 is ignored" in lines[0], lines
    # `python -m tpuready.emulator` rehearses there anyway: it loads no other backend.
    # The script's own workers load backends as usual (on a TPU VM, TorchTPU): the command's
    # autoload switch is for its own process only.
    script = tmp_path / "rehearse.py"
    script.write_text(
        "import os, subprocess, sys, torch, tpuready.emulator as e\n"
        "print(e.is_emulated(), torch.ones(1, device='tpu').device)\n"
        'child = \'import os, torch; print(os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD"), '
        "torch._C._get_privateuse1_backend_name())'\n"
        "worker = subprocess.run([sys.executable, '-c', child], capture_output=True, text=True)\n"
        "print(worker.stdout.strip())\n"
    )
    completed = subprocess.run(
        [sys.executable, "-m", "tpuready.emulator", str(script)],
        cwd=REPOSITORY,
        env={**os.environ, "PYTHONPATH": path, "TPUREADY_EMULATE_TPU_REPORT": "off"},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == ["True", "tpu:0", "None", "tpu"]
    assert completed.stderr == ""


def test_the_notebook_check_refuses_to_run_where_the_emulator_stepped_aside(
    tmp_path: Path,
) -> None:
    """On a TPU VM TorchTPU owns `tpu`: `make emulated` must not report notebooks as run on
    the emulated TPU when they ran on another backend."""
    completed = subprocess.run(
        [sys.executable, "scripts/verify.py", "check", "notebooks/reference_hardware.ipynb"],
        cwd=REPOSITORY,
        env={
            **os.environ,
            "PYTHONPATH": with_a_stand_in_torch_tpu(tmp_path),
            "TPUREADY_EMULATE_TPU": "1",
            "TPUREADY_EMULATE_TPU_REPORT": "off",
        },
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 2, completed.stderr
    assert "the emulated TPU stepped aside" in completed.stderr


def test_the_command_refuses_a_report_path_that_would_write_nothing(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('ran')\n")
    completed = subprocess.run(
        [sys.executable, "-m", "tpuready.emulator", "--report", "r.txt", str(script)],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 2 and "ran" not in completed.stdout
    assert "--report 'r.txt': name a .json file" in completed.stderr


def test_a_bad_host_fails_loudly_naming_the_value() -> None:
    completed = run_emulated("import torch", host="v6e-banana")
    assert completed.returncode != 0
    assert "TPUREADY_EMULATE_TPU='v6e-banana'" in completed.stderr


# --- What TorchTPU refuses ---------------------------------------------------------------


def test_every_legacy_device_call_raises_naming_its_replacement(battery: dict[str, Any]) -> None:
    from tpuready.emulator.device_module import LEGACY_CALLS

    legacy = seen(battery, "legacy")
    assert len(LEGACY) == 10 and set(legacy) == set(LEGACY)
    for name, error in legacy.items():
        assert error is not None, f"torch.tpu.{name}() did not raise"
        assert error.startswith("RuntimeError: "), error
        assert LEGACY_CALLS[name] in error, (name, error)
        assert "TORCH_TPU_ALLOW_LEGACY_DEVICE_APIS=1" in error
    assert "torch.accelerator.synchronize()" in legacy["synchronize"]
    assert "torch.Generator()" in legacy["get_rng_state"]  # not the device module's own call


def test_the_legacy_switch_turns_the_error_into_one_warning(battery: dict[str, Any]) -> None:
    allowed = seen(battery, "legacy_allowed")
    assert allowed["counts"] == [1, 1]
    assert len(allowed["warnings"]) == 1 and "device_count" in allowed["warnings"][0]


def test_one_device_per_process(battery: dict[str, Any]) -> None:
    calls = seen(battery, "portable_calls")
    assert (calls["count"], calls["index"], calls["set_0"]) == (1, 0, None)
    assert calls["set_1"] is not None and "set_device(1) is refused" in calls["set_1"]
    assert calls["to_int"] == calls["to_tpu_3"] == "tpu:0"  # upstream issue #4164


def test_compile_refuses_what_torchtpu_refuses(battery: dict[str, Any]) -> None:
    compiled = seen(battery, "compile")
    assert "NotImplementedError" in compiled["dynamic_true"]
    assert "TypeError" in compiled["mode"] and "takes no mode='reduce-overhead'" in compiled["mode"]
    assert (
        "TypeError" in compiled["inductor_option"] and "max_autotune" in compiled["inductor_option"]
    )
    assert compiled["own_option"] is None  # TorchTPU's own options are taken
    assert "backend='inductor'" in compiled["inductor"] and "#4300" in compiled["inductor"]
    assert "torch.no_grad()" in compiled["inference_mode"]
    assert compiled["aot_eager"] is None  # another backend is the user's choice


def test_compile_defaults_to_static_shapes_on_the_tpu(battery: dict[str, Any]) -> None:
    """Lengths 3, 4, 5, 4: dynamic=False compiles one graph per new length (TorchTPU's
    default), where torch's automatic dynamic shapes would have made two."""
    compiled = seen(battery, "compile")
    assert (compiled["graphs"], compiled["recompiles"]) == (3, 2)


def test_operations_on_two_devices_raise_as_on_cuda(battery: dict[str, Any]) -> None:
    mixed = seen(battery, "mixed_device")
    for name in ("tensor", "matmul"):
        assert mixed[name].startswith("RuntimeError: Expected all tensors to be on the same")
        assert "tpu:0 and cpu" in mixed[name]
    assert mixed["scalar"] is None  # a CPU scalar is allowed, as on CUDA
    assert mixed["cpu_index"] is None  # and CPU indices


def test_an_operator_the_cpu_cannot_run_raises_naming_it(battery: dict[str, Any]) -> None:
    error = seen(battery, "not_emulated")
    assert error.startswith("NotImplementedError: aten::batch_norm_stats is not emulated")


# --- What TorchTPU does differently --------------------------------------------------------


def test_float32_matmuls_run_as_1_3_or_6_bf16_passes(battery: dict[str, Any]) -> None:
    """Each pass count gives exactly tpuready.inspection.check's CPU model of the passes, and errors
    that shrink as bf16 rounding predicts (u = 2**-8 per piece)."""
    passes = seen(battery, "matmul_passes")
    for count in ("1", "3", "6"):
        assert passes[count]["equals_model"], count
    assert 1e-4 < passes["1"]["error"] < 2**-8
    assert 1e-7 < passes["3"]["error"] < 2**-15
    assert passes["6"]["error"] < 2e-7  # float32's own rounding of the sum remains
    assert passes["precision_block_equals_1_pass"]  # torch.tpu.precision overrides locally
    assert passes["linear_equals_1_pass"]
    assert passes["bf16_inputs_unchanged"]


def test_convolutions_run_forward_and_backward_in_passes(battery: dict[str, Any]) -> None:
    convolution = seen(battery, "convolution")
    assert convolution == {
        "equals_one_pass_model": True,
        "weight_grad_shape": [4, 3, 3, 3],
        "bf16": "torch.bfloat16",
    }


def test_autocast_on_the_tpu_is_bfloat16(battery: dict[str, Any]) -> None:
    autocast = seen(battery, "autocast")
    assert autocast == {
        "default_dtype": "torch.bfloat16",
        "matmul": "torch.bfloat16",
        "softmax": "torch.float32",
    }


# --- Memory, modules, serialization --------------------------------------------------------


def test_save_and_load_round_trip_bit_exact(battery: dict[str, Any]) -> None:
    saved = seen(battery, "save_load")
    assert saved == {"host_bits_equal": True, "device": "tpu:0", "device_bits_equal": True}


def test_tied_weights_stay_tied_and_deepcopy_copies(battery: dict[str, Any]) -> None:
    modules = seen(battery, "modules")
    assert modules["tied"] and modules["same_parameter_object"] and modules["deepcopy_tied"]
    assert modules["device"] == modules["deepcopy_device"] == "tpu:0"
    assert modules["deepcopy_independent"]


def test_a_model_trains_on_the_emulated_tpu(battery: dict[str, Any]) -> None:
    losses = seen(battery, "training")
    assert len(losses) == 5 and losses[-1] < losses[0] * 0.8, losses


def test_a_storage_resizes_keeping_its_bytes_and_freeing_them(battery: dict[str, Any]) -> None:
    resized = seen(battery, "resize")
    assert resized == {"kept": [0.0, 1.0, 2.0, 3.0], "freed": 16, "refilled": 16}


def test_device_storages_and_pinned_memory_do_not_crash(battery: dict[str, Any]) -> None:
    storage = seen(battery, "storage_and_pinning")
    assert storage == {"storage_device": "tpu:0", "pinned": [0.0, 1.0, 2.0, 3.0]}


def test_the_pitfalls_of_a_python_backend_are_avoided(battery: dict[str, Any]) -> None:
    pitfalls = seen(battery, "pitfalls")
    # The profiler shows the device operators the program ran, not the CPU ones serving them.
    assert pitfalls["profiler_events"] == ["aten::add", "aten::matmul", "aten::mm"]
    # The CPU has no integer histc (transformers' MoE calls it off the CPU).
    assert pitfalls["integer_histc"] == ["torch.int64", [1, 2, 0, 1]]
    # Dynamo does not trace into the emulator's kernels: one graph, no break.
    assert (pitfalls["graphs"], pitfalls["graph_breaks"]) == (1, 0)
    # One backend for every torch.compile call: a second module of the same code reuses it.
    assert pitfalls["two_compiled_blocks_graphs"] == 1
    assert pitfalls["wrapped_number"] == [3.5, 3.5]
    assert pitfalls["numbers_for_tensors"] == {
        "remainder": [0, 1, 0, 1],
        "dtype": "torch.int32",
        "bitwise_and": [0, 1, 0, 1],
        "fmod": [0.0, 1.0, 2.0, 0.0],
    }
    # Only the user's own break: none inside the emulator's code run after it.
    reasons = pitfalls["break_reasons_after_tolist"]
    assert len(reasons) == 1 and "tolist" in reasons[0], reasons


# --- The report ---------------------------------------------------------------------------


def test_the_report_names_syncs_float64_and_known_gaps(battery: dict[str, Any]) -> None:
    found = seen(battery, "report")
    syncs = found["host_syncs"]
    assert any(".item()" in what for what in syncs)
    assert any(what.startswith("nonzero") for what in syncs)
    assert syncs.count("repeat_interleave (output shape depends on the data)") == 1
    assert syncs.count("print(tensor) or repr (reads values on the host)") == 1
    assert found["float64"] == ["a torch.float64 tensor on the device"]
    assert found["known_gaps"] == ["linalg_cholesky_ex"]


def test_a_forked_child_may_not_use_the_device(battery: dict[str, Any]) -> None:
    forked = seen(battery, "fork")
    assert "needs its workers spawned" in forked["child"], forked
    assert forked["parent_still_works"] == [2.0, 2.0]


def test_the_json_report_of_each_rank_has_a_path_of_its_own() -> None:
    from tpuready.emulator.findings import report_path

    assert report_path("", {}) is None and report_path("off", {}) is None
    assert report_path("print", {}) is None
    assert report_path("out/r.json", {}) == Path("out/r.json")
    assert report_path("r.json", {"RANK": "3", "WORLD_SIZE": "1"}) == Path("r.json")
    assert report_path("r.json", {"RANK": "3", "WORLD_SIZE": "4"}) == Path("r.rank3.json")
    # Only a .json path writes a file (a stray "1" or "on" must not), and a WORLD_SIZE that is
    # not a number does not stop the report at exit.
    assert report_path("1", {}) is None and report_path("r.txt", {}) is None
    assert report_path("r.json", {"RANK": "0", "WORLD_SIZE": "many"}) == Path("r.json")


def test_each_print_is_one_sync_and_keeps_no_tensor_alive(battery: dict[str, Any]) -> None:
    # A print reads a tensor many times to format it; a tensor of 1,024 float32 is 4,096 bytes.
    assert seen(battery, "prints") == {"once": 1, "twice": 2, "freed": 4096}


def test_the_report_is_printed_at_exit_and_written_as_json(tmp_path: Path) -> None:
    target = tmp_path / "report.json"
    completed = run_emulated(
        "import torch; torch.ones(3, device='tpu').sum().item()",
        extra={"TPUREADY_EMULATE_TPU_REPORT": str(target)},
    )
    assert completed.returncode == 0, completed.stderr
    assert "Emulated TPU report (TorchTPU host v6e-8 (8 devices))" in completed.stderr
    written = json.loads(target.read_text())
    assert [(e["what"], e["count"]) for e in written["host_syncs"]] == [
        (".item() (a value read by the host)", 1)
    ]
    assert written["host_syncs"][0]["where"] == "<string>:1"
    quiet = run_emulated("import torch; torch.ones(3, device='tpu').sum().item()")
    assert quiet.stderr == ""


def test_report_counts_sections_and_refuses_unknown_ones() -> None:
    report = EmulationReport(host="test host")
    report.record("host_syncs", "item", "train.py:3")
    report.record("host_syncs", "item", "train.py:3")
    report.record("float64", "double")  # the place defaults to this test's line
    assert report.total("host_syncs") == 2 and report.total("host_syncs", "other") == 0
    data = report.as_dict()
    assert data["host_syncs"] == [{"what": "item", "where": "train.py:3", "count": 2}]
    assert data["float64"][0]["where"].startswith("test_emulator.py:")
    text = report.text()
    assert "- host syncs: 2" in text and "2 x item at train.py:3" in text
    assert "none:" in text and "recompiles" in text
    with pytest.raises(ValueError, match="section must be one of"):
        report.record("speed", "fast")
    report.clear()
    assert all(report.total(section) == 0 for section in SECTIONS)


def test_place_in_user_code_names_this_file() -> None:
    assert place_in_user_code().startswith("test_emulator.py:")


# --- Hosts ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("1", Host(TORCHTPU, "v6e", 8, 8)),
        ("torchtpu", Host(TORCHTPU, "v6e", 8, 8)),
        ("v6e-1", Host(TORCHTPU, "v6e", 1, 1)),
        ("torchtpu:v5p-4", Host(TORCHTPU, "v5p", 4, 4)),
        ("v7-4", Host(TORCHTPU, "v7", 4, 8)),  # a v7 chip is two devices
        ("multi-device", Host(MULTI_DEVICE, None, 4, 4)),
        ("multi-device:8", Host(MULTI_DEVICE, None, 8, 8)),
        (" 0 ", None),
        ("", None),
    ],
)
def test_parse_host(value: str, expected: Host | None) -> None:
    assert parse_host(value) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("banana", "is not a host the emulated TPU knows"),
        ("v9-1", "unknown TPU generation 'v9'"),
        ("v6e-16", "a v6e host has 1, 4, 8 chips"),
        ("v6e-3", "a v6e host has 1, 4, 8 chips"),
        ("v7-8", "a v7 host has 1, 2, 4 chips"),
        ("v6e-0", "got 0"),
        ("multi-device:0", "1 to 64 devices, got 0"),
    ],
)
def test_parse_host_refuses_what_it_does_not_know(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_host(value)


def test_a_host_describes_itself() -> None:
    assert parse_host("1").describe() == "TorchTPU host v6e-8 (8 devices)"
    assert parse_host("v6e-1").describe() == "TorchTPU host v6e-1 (1 device)"
    assert parse_host("multi-device:2").describe() == "multi-device host (2 devices)"


# --- The launcher's rules on a TPU host ----------------------------------------------------


def test_set_tpu_launch_env_keeps_the_rank_counts_of_torchtpu(battery: dict[str, Any]) -> None:
    rules = seen(battery, "launch_rules")
    assert "No TPU topology found for count: 2" in rules["2"]
    assert "No TPU topology found for count: 16" in rules["16"]
    assert rules["4"] is None
    assert rules["default_backend"] == "tpu_dist"
    assert "Check failed: client != nullptr" in rules["set_in_the_rank"]


def test_a_group_joined_with_no_backend_gets_tpu_dist_and_works(battery: dict[str, Any]) -> None:
    assert seen(battery, "default_group") == {"config": "tpu:tpu_dist", "all_reduce": [3.0, 3.0]}


@pytest.mark.parametrize(
    ("allowed", "at_least", "expected"),
    [(None, 2, 2), ((1, 4, 8), 1, 1), ((1, 4, 8), 2, 4), ((2, 4, 8), 1, 2), ((1, 2, 4, 8), 2, 2)],
)
def test_smallest_world_size_follows_the_host(
    monkeypatch: pytest.MonkeyPatch,
    allowed: tuple[int, ...] | None,
    at_least: int,
    expected: int,
) -> None:
    monkeypatch.setattr(tpuready.runtime.launch, "allowed_rank_counts", lambda: allowed)
    assert tpuready.runtime.launch.smallest_world_size(at_least) == expected


def test_smallest_world_size_refuses_more_than_a_host_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tpuready.runtime.launch, "allowed_rank_counts", lambda: (1, 4, 8))
    with pytest.raises(ValueError, match="at most 8 ranks, fewer than 16"):
        tpuready.runtime.launch.smallest_world_size(16)
    with pytest.raises(ValueError, match="at_least must be at least 1"):
        tpuready.runtime.launch.smallest_world_size(0)


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        (Host(TORCHTPU, "v6e", 8, 8), (1, 4, 8)),
        (Host(TORCHTPU, "v7", 4, 8), (2, 4, 8)),
        (Host(MULTI_DEVICE, None, 4, 4), None),
    ],
)
def test_allowed_rank_counts_of_an_emulated_host(
    monkeypatch: pytest.MonkeyPatch, host: Host, expected: tuple[int, ...] | None
) -> None:
    import torch

    monkeypatch.setattr(tpuready.emulator, "_LOADED", host)
    tpu = SimpleNamespace(type="tpu")
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda **kwargs: tpu)
    assert tpuready.runtime.launch.allowed_rank_counts() == expected


# --- Collectives and sharding between real processes --------------------------------------

RUN_WORKERS = """
import json
from tpuready.runtime.launch import run_workers
from tests.emulator_workers import {worker}
print(json.dumps(run_workers({worker}, {ranks}, timeout_seconds=180)))
"""


def workers_emulated(worker: str, ranks: int, host: str) -> subprocess.CompletedProcess[str]:
    return run_emulated(RUN_WORKERS.format(worker=worker, ranks=ranks), host=host, timeout=400)


def on_a_v5p_host_and_on_the_cpu(worker: str) -> tuple[list[Any], list[Any]]:
    """What `worker` of tests/emulator_workers.py returns from each of 2 ranks on an emulated
    v5p host, then from 2 ranks on the CPU (gloo)."""
    from tests import emulator_workers
    from tpuready.runtime.launch import run_workers

    emulated = workers_emulated(worker, 2, host="v5p-2")
    assert emulated.returncode == 0, emulated.stderr
    on_tpu = json.loads(emulated.stdout.strip().splitlines()[-1])
    return on_tpu, run_workers(getattr(emulator_workers, worker), 2, timeout_seconds=180)


@pytest.mark.timeout(600)
def test_collectives_on_the_emulated_tpu_equal_gloo_on_the_cpu() -> None:
    """A v5p host runs 2 ranks: tpu_dist on tpu:0 in each, the same numbers as gloo."""
    on_tpu, on_cpu = on_a_v5p_host_and_on_the_cpu("collectives")
    for rank in range(2):
        assert (on_tpu[rank]["device"], on_tpu[rank]["backend"]) == ("tpu:0", "tpu_dist")
        assert (on_cpu[rank]["device"], on_cpu[rank]["backend"]) == ("cpu", "gloo")
        for name in on_cpu[rank]:
            if name not in ("device", "backend"):
                assert on_tpu[rank][name] == on_cpu[rank][name], (rank, name)
    assert on_cpu[0]["all_reduce"] == [10.0, 12.0, 14.0, 16.0]  # the worker's own arithmetic


@pytest.mark.timeout(600)
def test_dtensor_and_fsdp2_on_the_emulated_tpu_and_reshard_frees_memory() -> None:
    import torch

    from tpuready.inspection.check import relative_error

    on_tpu, on_cpu = on_a_v5p_host_and_on_the_cpu("sharded_training")
    for rank in range(2):
        # One bf16 pass per float32 matmul on the TPU: a relative error of a few 2**-8.
        matmul_error = relative_error(
            torch.tensor(on_tpu[rank]["dtensor_matmul"]),
            torch.tensor(on_cpu[rank]["dtensor_matmul"]),
        )
        assert 0 < matmul_error < 2**-6, matmul_error
        assert on_tpu[rank]["losses"] == pytest.approx(on_cpu[rank]["losses"], rel=2**-5)
        memory = on_tpu[rank]["memory"]
        # FSDP2 frees a layer's gathered parameters after its forward (reshard_after_forward):
        # the emulator's memory count drops with them (a 64 x 64 layer is 16 KiB gathered).
        assert memory["during"] - memory["after"] > 4096, memory


@pytest.mark.timeout(600)
def test_a_multi_device_host_refuses_two_ranks_on_one_index() -> None:
    completed = workers_emulated("bind_every_rank_to_index_0", 2, host="multi-device:2")
    assert completed.returncode != 0
    assert "ranks 0 and 1 of one job both use tpu:0" in completed.stderr
    assert "set_device_index(local_rank)" in completed.stderr


@pytest.mark.timeout(600)
def test_a_multi_device_host_gives_each_rank_its_own_index() -> None:
    completed = workers_emulated("collectives", 2, host="multi-device:2")
    assert completed.returncode == 0, completed.stderr
    results = json.loads(completed.stdout.strip().splitlines()[-1])
    assert [r["backend"] for r in results] == ["tpu_dist", "tpu_dist"]
    assert results[0]["all_reduce"] == [10.0, 12.0, 14.0, 16.0]


def test_claims_of_jobs_that_ended_long_ago_are_removed(tmp_path: Path) -> None:
    from tpuready.emulator.state import CLAIMS_PREFIX, STALE_CLAIMS_SECONDS, remove_stale_claims

    old, fresh, other = (
        tmp_path / f"{CLAIMS_PREFIX}old",
        tmp_path / f"{CLAIMS_PREFIX}new",
        tmp_path / "x",
    )
    for folder in (old, fresh, other):
        folder.mkdir()
        (folder / "tpu0").write_text("0 1")
    long_ago = old.stat().st_mtime - STALE_CLAIMS_SECONDS - 60
    os.utime(old, (long_ago, long_ago))
    os.utime(other, (long_ago, long_ago))
    remove_stale_claims(tmp_path)
    assert not old.exists() and fresh.exists() and other.exists()


def _torchrun_chapter_8(extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Chapter 8's worker file under torchrun, 4 ranks, on the emulated TPU."""
    script = REPOSITORY / "notebooks" / "workers" / "ch08_sharded_matmul.py"
    environment = {
        **os.environ,
        "TPUREADY_EMULATE_TPU": "1",
        "TPUREADY_EMULATE_TPU_REPORT": "off",
        "OMP_NUM_THREADS": "1",
        **extra,
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return subprocess.run(
        [*command, "--nproc-per-node=4", str(script)],
        cwd=REPOSITORY,
        env=environment,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )


@pytest.mark.timeout(900)
def test_torchrun_on_the_emulated_tpu_needs_the_launch_environment() -> None:
    """TorchTPU's ranks need launch variables from their parent: torchrun alone fails with
    its message, and with them (what `python -m torch.tpu.distributed` prints on a TPU VM;
    here the emulator's own variable) chapter 8's file runs on tpu_dist and gives the product."""
    import torch

    from tpuready.emulator.distributed import LAUNCH_VARIABLE

    sys.path.insert(0, str(REPOSITORY / "notebooks"))
    try:
        from workers.ch08_sharded_matmul import make_operands
    finally:
        sys.path.remove(str(REPOSITORY / "notebooks"))
    without = _torchrun_chapter_8({})
    assert without.returncode != 0
    assert "Check failed: client != nullptr" in without.stderr
    launched = _torchrun_chapter_8({LAUNCH_VARIABLE: "1,4"})
    assert launched.returncode == 0, launched.stderr[-3000:]
    line = next(x for x in launched.stdout.splitlines() if x.startswith(("[", "{")))
    results = json.loads(line)
    left, right = make_operands()
    for result in results:
        assert result["counts"] == {"reduce-scatter": 1}
        # Small whole numbers are exact in bf16: one pass gives the exact product.
        assert torch.equal(torch.tensor(result["full"]), left @ right)
