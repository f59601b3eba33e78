"""`scripts/verify.py` and `tpuready.pages.verification`: the records of where the notebooks ran,
and the page built from them.

Only one generated notebook is executed (a kernel start, a few seconds); every other test
works on records made here, so no real chapter runs.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import REPOSITORY, load_script
from pydantic import ValidationError

from tpuready.pages import verification

verify = load_script("verify")  # runs notebooks: a program, so loaded from its file
RECORDS = REPOSITORY / "verification"
NOTEBOOKS = verify.book_notebooks()
STEMS = [stem for stem, _ in NOTEBOOKS]


def result(seconds: float = 12.0, failure=None):  # type: ignore[no-untyped-def]
    return verification.NotebookResult(failure is None, seconds, 30, failure)


def record(kind: str = "cpu", date: str = "2026-12-05T07:45:12Z", **fields):  # type: ignore[no-untyped-def]
    values = {
        "device_name": "AMD EPYC 7B13",
        "driver_version": None,
        "torch": "2.13.0+cpu",
        "transformers": "4.57.1",
        "torch_tpu": None,
        "python": "3.11.7",
        "notebooks": {stem: result() for stem in STEMS},
        "source": f"{kind}-{date}.json",
    }
    values.update(fields)
    return verification.Record(date=date, kind=kind, **values)


def table(page: str) -> dict[str, list[str]]:
    """Notebook stem -> its CPU, CUDA and TPU cells, split at the pipes Markdown reads."""
    rows = {}
    for line in page.splitlines():
        found = re.match(r"\| \[.*\]\(\.\./notebooks/(\w+)\.ipynb\) \|", line)
        if found:
            cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
            rows[found.group(1)] = cells[1:]
    return rows


# ---------------------------------------------------------------------------------------------
# The page


def test_the_committed_page_is_the_one_the_committed_records_give() -> None:
    expected = verification.verification_page(verification.load_records(RECORDS), NOTEBOOKS)
    committed = (REPOSITORY / "book" / "verification.md").read_text(encoding="utf-8")
    assert committed == expected, (
        "book/verification.md is stale: run `python scripts/verify.py page`"
    )


def test_every_notebook_has_a_row_linked_to_its_page() -> None:
    rows = table(verification.verification_page([], NOTEBOOKS))
    assert list(rows) == STEMS
    assert len(STEMS) == len(list((REPOSITORY / "notebooks").glob("*.ipynb")))
    assert "[Hardware figures](../notebooks/reference_hardware.ipynb)" in (
        verification.verification_page([], NOTEBOOKS)
    )


def test_a_kind_without_a_record_is_not_yet_verified() -> None:
    page = verification.verification_page([record("cpu")], NOTEBOOKS)
    for stem, (cpu, cuda, tpu, emulated) in table(page).items():
        assert cpu == "ok; 2026-12-05; torch 2.13.0+cpu; 12.0 s", stem
        assert cuda == tpu == emulated == "not yet verified"
    assert 'No CUDA or TPU machine has a record yet: their columns say "not yet verified"' in page
    assert "`make verify`" in page


def test_an_emulated_run_fills_its_own_column_and_no_machine_s() -> None:
    emulated = record("emulated-tpu", device_name="Emulated TPU on AMD EPYC")
    page = verification.verification_page([emulated], NOTEBOOKS)
    for stem, (cpu, cuda, tpu, on_emulator) in table(page).items():
        assert cpu == cuda == tpu == "not yet verified", stem
        assert on_emulator == "ok; 2026-12-05; torch 2.13.0+cpu; 12.0 s", stem
    assert "No CPU, CUDA or TPU machine has a record yet" in page
    assert "Emulated TPU, Emulated TPU on AMD EPYC" in page
    # A chapter's stamp names the emulated run and the real machines it has not run on.
    assert verification.stamp([emulated], "01_device_agnostic_basics") == (
        "Last verified: ran in full on the emulated TPU on 2026-12-05 with torch 2.13.0+cpu; "
        "not yet on a CPU or a CUDA GPU or a Cloud TPU."
    )


def test_without_any_record_no_cell_is_filled() -> None:
    page = verification.verification_page([], NOTEBOOKS)
    assert {cell for cells in table(page).values() for cell in cells} == {"not yet verified"}
    assert "No CPU, CUDA or TPU machine has a record yet" in page


def test_a_failure_names_its_cell_and_error() -> None:
    failure = verification.Failure(38, "RuntimeError", "shapes [2|3] and *4* differ")
    notebooks = {stem: result() for stem in STEMS}
    notebooks["08_meshes_and_dtensor"] = result(seconds=17.5, failure=failure)
    page = verification.verification_page([record("tpu", notebooks=notebooks)], NOTEBOOKS)
    cpu, cuda, tpu, _ = table(page)["08_meshes_and_dtensor"]  # the pipe did not split the cell
    assert tpu == (
        r"**failed**, cell 38: RuntimeError: shapes \[2\|3\] and \*4\* differ; 2026-12-05; "
        "torch 2.13.0+cpu; 17.5 s"
    )
    assert cpu == cuda == "not yet verified"
    assert table(page)["01_device_agnostic_basics"][2].startswith("ok;")


def test_the_newest_record_of_a_kind_fills_the_notebooks_it_ran() -> None:
    older = record("cuda", "2026-11-01T10:00:00Z", torch="2.12.0")
    newer = record(
        "cuda",
        "2026-12-01T10:00:00Z",
        torch="2.13.0",
        notebooks={"reference_hardware": result(seconds=3.5)},
    )
    rows = table(verification.verification_page([newer, older], NOTEBOOKS))
    assert rows["reference_hardware"][1] == "ok; 2026-12-01; torch 2.13.0; 3.5 s"
    assert rows["01_device_agnostic_basics"][1] == "ok; 2026-11-01; torch 2.12.0; 12.0 s"


def test_a_chapter_stamp_names_each_kind_with_its_newest_run() -> None:
    stem = "01_device_agnostic_basics"
    cpu = record("cpu", "2026-12-03T10:00:00Z")
    failure = verification.Failure(cell=4, error="RuntimeError", message="boom")
    gpu = record("cuda", "2026-12-04T10:00:00Z", notebooks={stem: result(failure=failure)})
    newer_cpu = record("cpu", "2026-12-05T10:00:00Z", torch="2.13.1+cpu")
    assert verification.stamp([cpu, gpu, newer_cpu], stem) == (
        "Last verified: ran in full on a CPU on 2026-12-05 with torch 2.13.1+cpu; "
        "failed on a CUDA GPU on 2026-12-04 with torch 2.13.0+cpu; not yet on a Cloud TPU."
    )
    assert verification.stamp([], stem) == "Not yet run in full outside CI."
    assert verification.stamp([cpu], "not_a_notebook") == "Not yet run in full outside CI."


def test_the_records_section_lists_each_machine() -> None:
    gpu = record("cuda", device_name="NVIDIA H200", driver_version="570.86.15")
    page = verification.verification_page([gpu], NOTEBOOKS)
    assert "- `cuda-2026-12-05T07:45:12Z.json`: CUDA, NVIDIA H200, driver 570.86.15" in page


# ---------------------------------------------------------------------------------------------
# Records


def test_a_record_reads_back_as_it_was_written() -> None:
    failure = verification.Failure(7, "AssertionError", "loss went up")
    written = record(notebooks={"01_device_agnostic_basics": result(failure=failure)})
    data = json.loads(json.dumps(verification.record_to_json(written)))
    assert verification.parse_record(data, written.source) == written


REQUIRED = [
    "date",
    "kind",
    "device_name",
    "driver_version",
    "torch",
    "transformers",
    "torch_tpu",
    "python",
    "notebooks",
]


@pytest.mark.parametrize("field", REQUIRED)
def test_a_record_missing_a_field_is_refused_by_name(field: str) -> None:
    data = verification.record_to_json(record())
    del data[field]
    with pytest.raises(
        verification.RecordError, match=f"^cpu-record.json: missing field '{field}'$"
    ):
        verification.parse_record(data, "cpu-record.json")


@pytest.mark.parametrize("field", ["ok", "seconds", "code_cells", "failure"])
def test_a_notebook_entry_missing_a_field_is_refused_by_name(field: str) -> None:
    data = verification.record_to_json(record())
    del data["notebooks"]["09_fsdp2"][field]
    with pytest.raises(
        verification.RecordError, match=f"notebook '09_fsdp2': missing field '{field}'"
    ):
        verification.parse_record(data, "r.json")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(kind="rocm"), "'kind' must be one of"),
        (lambda d: d.update(date="2026-12-05"), "'date' must be a UTC time"),
        (lambda d: d.update(torch=2.13), "'torch' must be str, got 2.13"),
        (lambda d: d.update(notebooks={}), "holds no notebook"),
        (lambda d: d["notebooks"]["09_fsdp2"].update(seconds="12"), "'seconds' must be int"),
        (lambda d: d["notebooks"]["09_fsdp2"].update(code_cells=True), "'code_cells' must be"),
        (lambda d: d["notebooks"]["09_fsdp2"].update(ok=False), "'ok' is False but 'failure'"),
    ],
)
def test_a_record_with_a_wrong_value_is_refused(change, message: str) -> None:
    data = verification.record_to_json(record())
    change(data)
    with pytest.raises(verification.RecordError, match=re.escape(message)):
        verification.parse_record(data, "r.json")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda d: d.update(driver_version=570),
            "r.json: field 'driver_version' must be str or null, got 570",
        ),
        (lambda d: d.update(notebooks=[]), "r.json: field 'notebooks' must be an object, got []"),
        (
            lambda d: d["notebooks"].update({"09_fsdp2": [True, 12.0, 30, None]}),
            "r.json, notebook '09_fsdp2': expected an object, got list",
        ),
        (
            lambda d: d["notebooks"]["09_fsdp2"].update(
                ok=False, failure={"cell": "38", "error": "RuntimeError", "message": "boom"}
            ),
            "r.json, notebook '09_fsdp2': field 'cell' must be int or null, got '38'",
        ),
        (
            lambda d: d["notebooks"]["09_fsdp2"].update(ok=False, failure={"cell": 38}),
            "r.json, notebook '09_fsdp2': missing field 'error'\n"
            "r.json, notebook '09_fsdp2': missing field 'message'",
        ),
    ],
)
def test_every_problem_of_a_record_is_named_with_its_place(change, message: str) -> None:
    data = verification.record_to_json(record())
    change(data)
    with pytest.raises(verification.RecordError) as refused:
        verification.parse_record(data, "r.json")
    assert str(refused.value) == message


def test_a_record_that_is_not_an_object_is_refused_by_name() -> None:
    with pytest.raises(verification.RecordError, match=r"^r\.json: expected an object, got list$"):
        verification.parse_record([], "r.json")


def test_a_result_whose_ok_contradicts_its_failure_cannot_be_built() -> None:
    with pytest.raises(ValidationError, match="'ok' is False but 'failure' is None"):
        verification.NotebookResult(False, 12.0, 30, None)


def test_every_committed_record_loads_and_reads_back_as_its_file() -> None:
    paths = sorted(RECORDS.glob("*.json"))
    records = verification.load_records(RECORDS)
    assert [r.source for r in records] == [path.name for path in paths] != []
    for path, loaded in zip(paths, records, strict=True):
        written = json.dumps(verification.record_to_json(loaded), indent=2) + "\n"
        assert written == path.read_text(encoding="utf-8"), path.name
        assert verification.record_file_name(loaded) == path.name


def test_the_site_can_import_the_records_without_the_notebook_runner() -> None:
    """book/_ext/verified_stamp.py imports the module while the site builds."""
    imported = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, tpuready.pages.verification; "
            "print(sorted({'nbclient', 'nbformat'} & set(sys.modules)))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPOSITORY,
    )
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == "[]"


def test_a_file_that_is_not_json_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "cpu-broken.json").write_text("{not json")
    with pytest.raises(verification.RecordError, match=r"cpu-broken\.json: not JSON"):
        verification.load_records(tmp_path)


def test_a_record_file_name_holds_kind_device_and_time_but_no_hostname() -> None:
    name = verification.record_file_name(record(device_name="Intel(R) Xeon(R) CPU @ 2.20GHz"))
    assert name == "cpu-intel-r-xeon-r-cpu-2-20ghz-20261205T074512Z.json"
    assert socket.gethostname().lower() not in name


def test_an_emulated_record_names_the_emulated_tpu_once() -> None:
    emulated = record(kind="emulated-tpu", device_name="Emulated TPU on AMD EPYC")
    assert (
        verification.record_file_name(emulated) == "emulated-tpu-on-amd-epyc-20261205T074512Z.json"
    )


# ---------------------------------------------------------------------------------------------
# Running


def test_summary_lines() -> None:
    assert (
        verify.summary_line("01_device_agnostic_basics", result(23.44))
        == "ok   01_device_agnostic_basics  23.4 s"
    )
    failure = verification.Failure(38, "RuntimeError", "shapes differ")
    assert (
        verify.summary_line("08_meshes_and_dtensor", result(failure=failure), width=26)
        == "FAIL 08_meshes_and_dtensor       cell 38: RuntimeError: shapes differ"
    )
    died = verification.Failure(None, "DeadKernelError", "Kernel died")
    assert verify.summary_line("09_fsdp2", result(failure=died)).endswith(
        "before the first cell: DeadKernelError: Kernel died"
    )


def test_cells_expected_to_raise_are_the_ones_nbval_lets_raise() -> None:
    tagged = nbformat.v4.new_code_cell("raise NotImplementedError")
    tagged.metadata["tags"] = ["your-turn", "raises-exception", "remove-output"]
    marked = nbformat.v4.new_code_cell("# NBVAL_RAISES_EXCEPTION\nraise KeyError(1)")
    quoted = nbformat.v4.new_code_cell('print("# NBVAL_RAISES_EXCEPTION")')
    for_nbval_alone = nbformat.v4.new_code_cell("raise NotImplementedError")
    for_nbval_alone.metadata["tags"] = ["your-turn", "nbval-raises-exception"]
    assert verify.expected_to_raise(tagged) and verify.expected_to_raise(marked)
    assert verify.expected_to_raise(for_nbval_alone)
    assert not verify.expected_to_raise(quoted)


def test_the_first_unexpected_error_is_the_failing_cell(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    tagged = nbformat.v4.new_code_cell('raise ValueError("an exercise before its answer")')
    tagged.metadata["tags"] = ["raises-exception"]
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# A tiny notebook"),
        nbformat.v4.new_code_cell("import os\nx = 1"),
        tagged,
        nbformat.v4.new_code_cell("# NBVAL_RAISES_EXCEPTION\nraise KeyError('expected too')"),
        nbformat.v4.new_code_cell('assert x == 2, f"x is {x} in {os.getcwd()}"'),
        nbformat.v4.new_code_cell("raise RuntimeError('never reached')"),
    ]
    path = tmp_path / "tiny.ipynb"
    nbformat.write(notebook, path)
    before = path.read_text()
    ran = verify.execute_notebook(path)
    # The fourth code cell: nbval's "Cell 3", counting code cells from 0.
    assert ran.failure == verification.Failure(3, "AssertionError", "x is 1 in notebooks")
    assert (ran.ok, ran.code_cells) == (False, 5)
    assert path.read_text() == before  # executed in memory: the file is not written


def test_the_probe_reports_this_machine() -> None:
    import torch

    facts = verify.probe_machine()
    assert facts["kind"] in verification.KINDS
    assert facts["torch"] == torch.__version__
    assert facts["device_name"]
    assert set(facts) == set(REQUIRED) - {"date", "notebooks"}


def test_run_refuses_a_notebook_outside_notebooks(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_status:
        verify.main(["run", str(REPOSITORY / "README.md")])
    assert exit_status.value.code == 2
    assert "not a notebook in notebooks/" in capsys.readouterr().err


def make_dry_run(*target: str) -> str:
    """What `make -n TARGET... NB=<the hardware notebook>` would run."""
    return subprocess.run(
        ["make", "-n", *target, "NB=notebooks/reference_hardware.ipynb"],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout


def test_make_verify_runs_under_the_notebook_conditions_then_writes_the_page() -> None:
    dry_run = make_dry_run("verify")
    run_at, page_at = dry_run.index("verify.py run"), dry_run.index("verify.py page")
    assert run_at < page_at
    for condition in ("TPUREADY_OFFLINE=1", "OMP_NUM_THREADS=1", "scripts/no_network"):
        assert condition in dry_run[:run_at]
    assert "notebooks/reference_hardware.ipynb" in dry_run


def test_a_cell_may_fail_on_the_emulated_tpu_only_when_marked_and_emulated(
    tmp_path: Path,
) -> None:
    notebook = nbformat.v4.new_notebook()
    marked = nbformat.v4.new_code_cell("raise NotImplementedError('an upstream gap')")
    marked.metadata[verify.EMULATED_MAY_FAIL_KEY] = "the CPU has no kernel for it (upstream)"
    notebook.cells = [marked, nbformat.v4.new_code_cell("x = 1")]
    path = tmp_path / "gap.ipynb"
    nbformat.write(notebook, path)
    on_cpu = verify.execute_notebook(path)
    assert on_cpu.failure is not None and on_cpu.failure.cell == 0  # the CPU must run it
    assert verify.execute_notebook(path, emulated=True).ok


def test_check_runs_only_on_the_emulated_tpu(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(verify.EMULATE_VARIABLE, raising=False)
    with pytest.raises(SystemExit) as exit_status:
        verify.main(["check", str(REPOSITORY / "notebooks" / "reference_hardware.ipynb")])
    assert exit_status.value.code == 2
    assert "set TPUREADY_EMULATE_TPU" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("target", "host"),
    [
        (["emulated"], "TPUREADY_EMULATE_TPU=1 "),
        (["emulated", "EMULATE=multi-device"], "TPUREADY_EMULATE_TPU=multi-device "),
        (["verify", "EMULATED=1"], "TPUREADY_EMULATE_TPU=1 "),
    ],
)
def test_make_runs_notebooks_on_the_emulated_tpu_under_the_notebook_conditions(
    target: list[str], host: str
) -> None:
    dry_run = make_dry_run(*target)
    command = dry_run[: dry_run.index("scripts/verify.py")]
    for condition in (host, "TPUREADY_EMULATE_TPU_REPORT=off", "OMP_NUM_THREADS=1"):
        assert condition in command, condition
    assert "scripts/no_network" in command


def test_make_verify_alone_records_the_machine_not_the_emulator() -> None:
    dry_run = make_dry_run("verify")
    assert "TPUREADY_EMULATE_TPU" not in dry_run
