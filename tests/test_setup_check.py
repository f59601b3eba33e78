"""The learner's set-up check (tpuready.runtime.setup_check, notebooks/00_setup_check.ipynb, make
check)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from conftest import REPOSITORY

from tpuready.runtime import setup_check
from tpuready.runtime.setup_check import CheckResult

REQUIREMENTS = "# a comment\ntorch==2.13.0\nJinja2==3.1.6\n\nsome_pkg.name==1.0  # why\n"


@pytest.fixture
def requirements(tmp_path: Path) -> Path:
    path = tmp_path / "requirements.txt"
    path.write_text(REQUIREMENTS)
    return path


def test_pins_are_read_by_normalized_name(requirements: Path) -> None:
    assert setup_check.read_pins(requirements) == {
        "torch": "2.13.0",
        "jinja2": "3.1.6",
        "some-pkg-name": "1.0",
    }


def test_only_pins_that_apply_here_are_read_as_pip_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "requirements.txt"
    path.write_text(
        "--index-url https://example.invalid/simple\n"
        "-r other.txt\n"
        "numpy==2.3.1 --hash=sha256:0123\n"
        "rich==14.0\t# a tab before the comment\n"
        'torch==2.13.0 ; python_version < "3"\n'
        "click>=8\n"
        "idna==3.*\n"
    )
    assert setup_check.read_pins(path) == {"numpy": "2.3.1", "rich": "14.0", "idna": "3.*"}


@pytest.mark.parametrize(
    ("found", "pinned", "matches"),
    [
        ("2.13.0+cpu", "2.13.0", True),
        ("14.0.0", "14.0", True),
        ("3.10", "3.*", True),
        ("2.13.1", "2.13.0", False),
        ("2.13.0rc1", "2.13.0", False),
        ("not a version", "1.0", False),
    ],
)
def test_an_installed_version_matches_its_pin_as_pip_compares_them(
    tmp_path: Path, found: str, pinned: str, matches: bool
) -> None:
    path = tmp_path / "requirements.txt"
    path.write_text(f"package=={pinned}\n")
    assert setup_check.check_pins(path, {"package": found}.get).passed is matches


def test_a_missing_requirements_file_is_named_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"requirements\.txt.*--requirements"):
        setup_check.read_pins(tmp_path / "requirements.txt")


def test_the_pins_check_reports_a_missing_requirements_file(tmp_path: Path) -> None:
    result = setup_check.check_pins(tmp_path / "requirements.txt")
    assert not result.passed and "--requirements" in result.detail


def test_matching_pins_pass_and_a_build_label_counts_as_its_version(requirements: Path) -> None:
    installed = {"torch": "2.13.0+cpu", "jinja2": "3.1.6", "some-pkg-name": "1.0"}
    result = setup_check.check_pins(requirements, installed.get)
    assert result == CheckResult("pins", True, "every package pinned in requirements.txt matches")


def test_a_wrong_or_missing_package_is_named_with_both_versions(requirements: Path) -> None:
    installed = {"torch": "2.12.1", "jinja2": "3.1.6"}
    result = setup_check.check_pins(requirements, installed.get)
    assert not result.passed
    assert "2 of 3 differ" in result.detail
    assert "torch 2.12.1 (pinned 2.13.0)" in result.detail
    assert "some-pkg-name missing (pinned 1.0)" in result.detail
    assert "make venv" in result.detail


def test_a_long_list_of_wrong_pins_is_cut_to_five(tmp_path: Path) -> None:
    path = tmp_path / "requirements.txt"
    path.write_text("".join(f"package{index}==1.0\n" for index in range(8)))
    result = setup_check.check_pins(path, lambda name: "0.9")
    assert "8 of 8 differ" in result.detail and "and 3 more" in result.detail
    assert "package5" not in result.detail


@pytest.mark.parametrize(
    ("version", "passed"),
    [((3, 10, 14), False), ((3, 11, 4), False), ((3, 11, 5), True), ((3, 13, 1), True)],
)
def test_python_must_be_3_11_5_or_newer(version: tuple[int, int, int], passed: bool) -> None:
    result = setup_check.check_python(version)
    assert result.passed is passed
    assert f"Python {version[0]}.{version[1]}" in result.detail
    assert ("PYTHON_FOR_VENV" in result.detail) is not passed


def test_the_lab_check_fails_without_the_myst_extension(tmp_path: Path) -> None:
    result = setup_check.check_lab_myst(prefix=tmp_path)
    assert not result.passed and "raw text" in result.detail


def test_the_lab_check_passes_in_this_venv() -> None:
    assert setup_check.check_lab_myst().passed


def test_two_ranks_all_reduce_through_the_launcher() -> None:
    result = setup_check.check_ranks()
    assert result == CheckResult("ranks", True, "gloo on cpu, all_reduce gave 3")


def test_a_launch_failure_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise TimeoutError("rank 1 did not join\nmore detail")

    monkeypatch.setattr("tpuready.runtime.launch.run_workers", refuse)
    result = setup_check.check_ranks()
    assert not result.passed
    assert result.detail.startswith("TimeoutError: rank 1 did not join;")
    assert "127.0.0.1" in result.detail


def test_the_verdict_is_pass_only_when_every_check_passed() -> None:
    good = CheckResult("device", True, "cpu")
    bad = CheckResult("pins", False, "torch missing; run make venv")
    assert setup_check.verdict([good, good]).startswith("PASS: all 2 checks passed")
    failed = setup_check.verdict([good, bad])
    assert failed.startswith("NOT READY: 1 of 2 checks failed")
    assert "- pins: torch missing; run make venv" in failed
    assert "device" not in failed


def _notebook(tmp_path: Path, last_source: str) -> Path:
    path = tmp_path / "check.ipynb"
    cells = [nbformat.v4.new_code_cell("x = 1"), nbformat.v4.new_code_cell(last_source)]
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


def test_the_notebook_run_prints_its_verdict(tmp_path: Path, capsys) -> None:
    assert setup_check.run_notebook(_notebook(tmp_path, "print('PASS: fine')")) == 0
    assert capsys.readouterr().out.strip() == "PASS: fine"
    assert setup_check.run_notebook(_notebook(tmp_path, "print('NOT READY: x')")) == 1


def test_a_failing_cell_stops_the_run_with_its_error(tmp_path: Path, capsys) -> None:
    assert setup_check.run_notebook(_notebook(tmp_path, "raise ValueError('broken')")) == 1
    assert "NOT READY: check.ipynb stopped" in capsys.readouterr().err
    assert setup_check.run_notebook(tmp_path / "absent.ipynb") == 1


def test_the_setup_notebook_runs_every_check_in_order() -> None:
    """The notebook shows each check the module has, so the verdict covers them all."""
    source = "\n".join(
        cell.source
        for cell in nbformat.read(REPOSITORY / "notebooks/00_setup_check.ipynb", 4).cells
        if cell.cell_type == "code"
    )
    checks = ["check_python", "check_pins", "check_device", "check_ranks"]
    checks += ["check_transformers", "check_lab_myst"]
    positions = [source.index(f"setup_check.{name}(") for name in checks]
    assert positions == sorted(positions)
    assert source.rstrip().endswith("print(setup_check.verdict(results))")


@pytest.mark.parametrize(("allowed", "expected"), [((1, 4, 8), 1), ((2, 4, 8), 2), (None, 2)])
def test_the_ranks_check_starts_the_fewest_ranks_a_host_runs(
    monkeypatch: pytest.MonkeyPatch, allowed: tuple[int, ...] | None, expected: int
) -> None:
    """A v5e-1 or v6e-1 VM holds one chip: the check must start one rank there (two on v7,
    a chip of two devices), and two on a CPU or a GPU."""
    import tpuready.runtime.launch

    assert setup_check.rank_count() == 2  # this machine: no accelerator
    monkeypatch.setattr(tpuready.runtime.launch, "allowed_rank_counts", lambda: allowed)
    assert setup_check.rank_count() == expected
