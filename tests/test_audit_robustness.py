"""The source audit on odd input: every input gives findings or a one-line error naming the
file, never a traceback or a hang; and the command line's formats, filters and configuration."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import hypothesmith
import pytest
from conftest import REPOSITORY, refuse_to_list
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuready import __main__ as cli
from tpuready import audit
from tpuready.audit import sources

CUDA_LINE = "import torch\nx = torch.ones(1).cuda()\n"


def run_cli(
    *arguments: str, cwd: Path = REPOSITORY, timeout: int = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuready", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY)},
    )


def write_notebook(path: Path, cells: list[dict]) -> Path:
    path.write_text(
        json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": cells})
    )
    return path


def code_cell(source: object, metadata: object = None) -> dict:
    return {"cell_type": "code", "source": source, "metadata": metadata or {}, "outputs": []}


# --------------------------------------------------------------------------------------------
# Notebooks


def test_cell_metadata_that_is_a_list_is_read_as_no_tags(tmp_path: Path) -> None:
    path = write_notebook(tmp_path / "odd.ipynb", [code_cell("x = y.cuda()", metadata=["tags"])])
    assert [(f.cell, f.rule) for f in audit.audit_notebook(path)] == [(1, "cuda-method")]


def test_a_cell_source_that_is_not_text_is_one_error_naming_the_file(tmp_path: Path) -> None:
    path = write_notebook(tmp_path / "odd.ipynb", [code_cell(["x = 1\n", 7])])
    with pytest.raises(audit.AuditInputError, match=r"odd\.ipynb: code cell 1 has a 'source'"):
        audit.audit_notebook(path)
    result = run_cli("audit-source", str(path))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


def test_tags_match_exactly(tmp_path: Path) -> None:
    cells = [
        code_cell("a = x.cuda()", {"tags": ["cuda-on-purpose-not"]}),
        code_cell("b = x.cuda()", {"tags": "cuda-on-purpose"}),  # a string, not a list
        code_cell("c = x.cuda()", {"tags": ["cuda-on-purpose"]}),
    ]
    path = write_notebook(tmp_path / "tags.ipynb", cells)
    assert [f.cell for f in audit.audit_notebook(path)] == [1, 2]


def test_magics_go_through_ipython_and_keep_line_numbers(tmp_path: Path) -> None:
    source = "%matplotlib inline\n!nvidia-smi\nfiles = !ls\nobj?\ny = x.cuda()"
    path = write_notebook(tmp_path / "magics.ipynb", [code_cell(source)])
    assert [(f.line, f.rule) for f in audit.audit_notebook(path)] == [(5, "cuda-method")]


notebook_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["cells", "cell_type", "source", "metadata", "tags", "x"]),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)
cell_like = st.fixed_dictionaries(
    {
        "cell_type": st.sampled_from(["code", "markdown", 3]),
        "source": st.one_of(
            st.text(alphabet="x.cuda()%!?\n =[]\"'#", max_size=40),
            st.lists(st.one_of(st.text(max_size=10), st.integers()), max_size=3),
            notebook_json,
        ),
        "metadata": st.one_of(notebook_json, st.just({"tags": ["cuda-on-purpose"]})),
    }
)


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(notebook_json, st.fixed_dictionaries({"cells": st.lists(cell_like, max_size=4)})))
def test_generated_notebook_json_never_raises_anything_else(
    tmp_path: Path, document: object
) -> None:
    path = tmp_path / "generated.ipynb"
    path.write_text(json.dumps(document))
    try:
        findings = audit.audit_notebook(path)
    except audit.AuditInputError as error:
        assert "generated.ipynb" in str(error) and "\n" not in str(error)
    else:
        assert all(isinstance(finding, audit.Finding) for finding in findings)


# hypothesmith compiles what it generates, and CPython warns about `"a"()` while doing so.
@pytest.mark.filterwarnings("ignore::SyntaxWarning")
@settings(max_examples=100, suppress_health_check=list(HealthCheck))
@given(hypothesmith.from_grammar())
def test_generated_python_never_raises(source: str) -> None:
    # The comment gets the text past the trigger-word pre-filter, so every rule walks it.
    findings = audit.audit_code(source + "\n# cuda .to( double\n")
    assert all(f.line >= 1 and f.column >= 1 for f in findings)


# --------------------------------------------------------------------------------------------
# Files and folders


def test_a_symlink_loop_in_a_folder_is_an_error_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(CUDA_LINE)
    os.symlink("loop.py", tmp_path / "loop.py")
    os.symlink(".", tmp_path / "again")  # a folder loop: symlinked folders are not followed
    assert [p.name for p in audit.find_source_files(tmp_path)] == ["good.py"]
    result = run_cli("audit-source", str(tmp_path))
    assert result.returncode == 1 and "good.py:2  cuda-method" in result.stdout
    named = run_cli("audit-source", str(tmp_path / "loop.py"))
    assert named.returncode == 2 and "loop.py is not a regular file" in named.stderr


def test_a_fifo_named_like_python_is_skipped_not_waited_on(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text(CUDA_LINE)
    os.mkfifo(tmp_path / "pipe.py")
    result = run_cli("audit-source", str(tmp_path), timeout=30)
    assert result.returncode == 1 and "1 file scanned" in result.stdout
    named = run_cli("audit-source", str(tmp_path / "pipe.py"), timeout=30)
    assert named.returncode == 2 and "pipe.py is not a regular file" in named.stderr


def test_files_over_the_size_limit_are_skipped_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sources, "MAX_FILE_BYTES", 100)
    big = tmp_path / "big.py"
    big.write_text(CUDA_LINE * 10)
    (finding,) = audit.audit_file(big)
    assert (finding.rule, finding.severity) == ("skipped-file", "note")
    assert "skipped" in finding.message


# --------------------------------------------------------------------------------------------
# Syntax, pragmas, columns


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="the running Python parses 3.12 syntax")
@pytest.mark.parametrize(
    "source",
    [
        "type Vector = list[float]\nx.cuda()\n",
        "def first[T](items: list[T]) -> T:\n    return items[0].cuda()\n",
        'names = {"a": 1}\nprint(f"{names["a"]}")\nx.cuda()\n',
    ],
)
def test_newer_syntax_is_reported_as_needing_a_newer_python(source: str) -> None:
    (finding,) = audit.audit_code(source)
    assert finding.rule == "syntax-error"
    assert finding.message.startswith("needs Python 3.12 to parse")
    assert "could not parse" not in finding.message


def test_a_pragma_inside_a_string_does_not_silence_its_line() -> None:
    source = 'import torch\nlabel = "# tpuready: ignore"; y = x.cuda()\n'
    assert [f.rule for f in audit.audit_code(source)] == ["cuda-method"]


def test_a_form_feed_keeps_pragmas_on_their_lines() -> None:
    source = "import torch\n\x0c\ny = x.cuda()  # tpuready: ignore\nz = x.cuda()\n"
    assert [(f.line, f.rule) for f in audit.audit_code(source)] == [(4, "cuda-method")]


@pytest.mark.parametrize(
    "source",
    [
        "return 1\n",  # the compiler refuses these; the parser accepts them
        "x = 1\nnonlocal y\n",
        "break\n",
        "await thing()\n",
    ],
)
def test_text_with_no_trigger_word_is_reported_only_when_the_parser_refuses_it(
    source: str,
) -> None:
    assert audit.audit_code(source) == []


@pytest.mark.parametrize("source", ["def f(:\n", "x = (1,\n", "a = 1\x00\n", "x = 'a' is 1 +\n"])
def test_text_with_no_trigger_word_that_does_not_parse_is_still_reported(source: str) -> None:
    (finding,) = audit.audit_code(source)
    assert finding.rule == "syntax-error"
    with pytest.raises(SyntaxError) as parser_error:
        sources.parse_python(source)
    expected = audit.syntax_error_finding(parser_error.value, source, "", None)
    assert finding.message == expected.message


def test_text_with_no_trigger_word_prints_no_compiler_warning(
    recwarn: pytest.WarningsRecorder,
) -> None:
    assert audit.audit_code('x = "a" is 1\ny = "\\d"\n') == []
    assert len(recwarn) == 0


@pytest.mark.parametrize("line_end", ["\n", "\r\n", "\r"])
def test_trigger_lines_count_lines_as_the_parser_does(line_end: str) -> None:
    source = line_end.join(["import torch", "\x0cx = 1", "y = x.cuda()", "z = 2", "w = tc.x"])
    assert audit.trigger_lines(source, {"tc": "torch.cuda"}) == [3, 5]
    assert [f.line for f in audit.audit_code(source)] == [3]


def test_a_statement_with_a_trigger_word_only_on_its_last_line_is_checked() -> None:
    source = "import torch\nif flag:\n    y = 1\n    y = x.cuda()\n"
    assert [f.line for f in audit.audit_code(source)] == [4]


def test_columns_count_characters_not_bytes() -> None:
    source = 'import torch\nnom = "été"; y = x.cuda()\n'
    (finding,) = audit.audit_code(source)
    assert finding.column == source.splitlines()[1].index("cuda") + 1


# --------------------------------------------------------------------------------------------
# Exit status, formats, filters, configuration


def test_an_internal_error_exits_three_with_one_line_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "boom.py").write_text(CUDA_LINE)

    def broken(path: object) -> list[audit.Finding]:
        raise RuntimeError("a bug in a rule")

    monkeypatch.setattr(audit, "audit_file", broken)
    assert cli.main(["audit-source", str(tmp_path)]) == 3
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "boom.py: internal error: RuntimeError" in error


def test_github_format_writes_workflow_annotations() -> None:
    result = run_cli("audit-source", "--format", "github", "tests/fixtures/audit/cuda_method.py")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("::warning file=tests/fixtures/audit/cuda_method.py,line=8,col=")
    assert ",title=tpuready cuda-method (must-change)::" in lines[0]
    assert "-> .to(device)" in lines[0]


def test_github_format_escapes_newlines_and_marks_notes() -> None:
    finding = audit.Finding(
        path="a,b.py",
        line=1,
        column=1,
        rule="float64",
        severity="note",
        message="x\ny",
        suggestion="z",
    )
    assert audit.format_github([finding]) == (
        "::notice file=a%2Cb.py,line=1,col=1,title=tpuready float64 (note)::x%0Ay -> z\n"
    )


def test_severity_filters_the_report() -> None:
    path = "tests/fixtures/audit/issue9/guarded.py"
    everything = run_cli("audit-source", path)
    must_change = run_cli("audit-source", "--severity", "must-change", path)
    assert everything.stdout.splitlines()[-1].startswith("8 findings")
    assert must_change.stdout.splitlines()[-1].startswith("1 finding ")
    assert "guarded: review" in everything.stdout
    assert "guarded: review" not in must_change.stdout


def test_pyproject_skips_rules_and_excludes_paths(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.tpuready]\nskip = ["float64"]\nexclude = ["legacy", "gen_*.py"]\n'
    )
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "main.py").write_text(CUDA_LINE + "y = x.double()\n")
    (tmp_path / "legacy").mkdir()
    (tmp_path / "legacy" / "old.py").write_text(CUDA_LINE)
    (tmp_path / "src" / "gen_code.py").write_text(CUDA_LINE)
    findings = audit.audit_source(tmp_path)
    assert [(Path(f.path).name, f.rule) for f in findings] == [("main.py", "cuda-method")]
    result = run_cli("audit-source", ".", cwd=tmp_path)
    assert result.stdout.splitlines()[-1] == "1 finding in 1 file (1 file scanned)"
    unconfigured = run_cli("audit-source", "--no-config", ".", cwd=tmp_path)
    assert unconfigured.stdout.splitlines()[-1].startswith("4 findings in 3 files")


@pytest.mark.parametrize(
    ("patterns", "scanned"),
    [
        (["vendor/"], ["app.py", "src/vendor.py"]),  # a trailing slash names folders only
        (["/src/*.py"], ["app.py", "vendor/lib.py"]),  # a leading slash anchors at the root
        (["*.py", "!app.py"], ["app.py"]),  # `!` takes a path back; the last match wins
        (["**/lib.py"], ["app.py", "src/vendor.py"]),
    ],
)
def test_exclude_patterns_follow_gitignore_rules(
    patterns: list[str], scanned: list[str], tmp_path: Path
) -> None:
    (tmp_path / "pyproject.toml").write_text(f"[tool.tpuready]\nexclude = {json.dumps(patterns)}\n")
    for name in ("app.py", "src/vendor.py", "vendor/lib.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(CUDA_LINE)
    found = {Path(f.path).relative_to(tmp_path).as_posix() for f in audit.audit_source(tmp_path)}
    assert sorted(found) == scanned


def test_a_bad_pyproject_table_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.tpuready]\nskip = ["no-such-rule"]\n')
    (tmp_path / "a.py").write_text(CUDA_LINE)
    result = run_cli("audit-source", ".", cwd=tmp_path)
    assert result.returncode == 2 and "no-such-rule" in result.stderr


def test_the_cli_and_the_api_give_the_same_findings() -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    status = cli.run_audit_source(["tests/fixtures/audit"], "json", stdout, stderr)
    assert status == 1 and stderr.getvalue() == ""
    from_cli = json.loads(stdout.getvalue())
    from_api = [f.to_dict() for f in audit.audit_source("tests/fixtures/audit")]
    assert from_cli == from_api


@pytest.mark.parametrize("flag", ["--fix", "--diff"])
def test_fix_and_diff_call_the_fixer(flag: str, monkeypatch: pytest.MonkeyPatch) -> None:
    fix = pytest.importorskip("tpuready.audit.fix")
    calls = []

    def fake_run_fix(
        paths: list[str], *, write: bool, stdout: object, stderr: object, use_config: bool
    ) -> int:
        calls.append((list(paths), write, use_config))
        return 0

    monkeypatch.setattr(fix, "run_fix", fake_run_fix)
    assert cli.main(["audit-source", flag, "script.py"]) == 0
    assert cli.main(["audit-source", flag, "--no-config", "script.py"]) == 0
    assert calls == [
        (["script.py"], flag == "--fix", True),
        (["script.py"], flag == "--fix", False),
    ]


@pytest.mark.parametrize("option", [["--format", "json"], ["--severity", "must-change"]])
def test_fix_and_diff_refuse_the_report_options(
    option: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["audit-source", "--diff", *option, "x.py"]) == 2
    error = capsys.readouterr().err
    assert option[0] in error and "drop the option" in error


def test_fix_and_diff_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["audit-source", "--fix", "--diff", "x.py"]) == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_pre_commit_hook_runs_the_audit() -> None:
    yaml = pytest.importorskip("yaml")
    (hook,) = yaml.safe_load((REPOSITORY / ".pre-commit-hooks.yaml").read_text())
    assert hook["id"] == "tpuready-audit"
    assert hook["entry"] == "python -m tpuready audit-source"
    assert hook["language"] == "python"
    assert hook["types_or"] == ["python", "jupyter"]


def test_an_unreadable_folder_is_named_and_the_rest_still_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "train.py").write_text("import torch\nx = torch.ones(2).cuda()\n")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "hidden.py").write_text("import torch\ny = torch.ones(2).cuda()\n")
    refuse_to_list(monkeypatch, locked)
    stdout, stderr = io.StringIO(), io.StringIO()
    status = cli.run_audit_source([str(tmp_path)], "json", stdout, stderr)
    assert status == cli.EXIT_USAGE
    assert f"cannot read folder {locked}: Permission denied" in stderr.getvalue()
    findings = json.loads(stdout.getvalue())
    assert [(Path(f["path"]).name, f["rule"]) for f in findings] == [("train.py", "cuda-method")]
    with pytest.raises(audit.AuditInputError, match="cannot read folder"):
        audit.find_source_files(tmp_path)


def test_json_output_is_json_even_when_no_path_can_be_read(tmp_path: Path) -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    status = cli.run_audit_source([str(tmp_path / "missing.py")], "json", stdout, stderr)
    assert status == cli.EXIT_USAGE and "no such file or folder" in stderr.getvalue()
    assert json.loads(stdout.getvalue()) == []


def test_a_file_too_large_to_audit_is_counted_and_fails_the_exit_status(tmp_path: Path) -> None:
    line = "x = torch.ones(2).cuda()\n"
    big = tmp_path / "generated.py"
    big.write_text("import torch\n" + line * (audit.MAX_FILE_BYTES // len(line) + 1))
    (tmp_path / "clean.py").write_text("print('portable')\n")
    stdout, stderr = io.StringIO(), io.StringIO()
    status = cli.run_audit_source(
        [str(tmp_path)], "text", stdout, stderr, severity=audit.MUST_CHANGE
    )
    assert status == cli.EXIT_FINDINGS
    assert (
        stdout.getvalue().splitlines()[-1] == "0 findings (2 files scanned, 1 skipped: too large)"
    )
    assert audit.run_audit(tmp_path, use_config=False).files_skipped == 1


NBFORMAT_3 = {
    "nbformat": 3,
    "nbformat_minor": 0,
    "metadata": {},
    "worksheets": [
        {
            "metadata": {},
            "cells": [
                {"cell_type": "markdown", "source": "# Title", "metadata": {}},
                {
                    "cell_type": "code",
                    "input": "import torch\nx = torch.ones(1).cuda()",
                    "language": "python",
                    "outputs": [],
                    "metadata": {},
                },
            ],
        }
    ],
}


def test_an_nbformat_3_notebook_is_upgraded_and_audited(tmp_path: Path) -> None:
    path = tmp_path / "old.ipynb"
    path.write_text(json.dumps(NBFORMAT_3))
    assert [(f.cell, f.line, f.rule) for f in audit.audit_notebook(path)] == [(1, 2, "cuda-method")]


def test_a_notebook_of_another_version_names_the_conversion(tmp_path: Path) -> None:
    path = tmp_path / "odd.ipynb"
    path.write_text(json.dumps({"nbformat": 2, "worksheets": []}))
    with pytest.raises(audit.AuditInputError, match=r"\(nbformat 2\); convert it with `jupyter"):
        audit.audit_notebook(path)


@pytest.mark.parametrize("pattern", ["!", "\\"])
def test_an_invalid_exclude_pattern_is_a_usage_error_naming_it(
    pattern: str, tmp_path: Path
) -> None:
    (tmp_path / "pyproject.toml").write_text(
        f"[tool.tpuready]\nexclude = {json.dumps([pattern])}\n"
    )
    (tmp_path / "a.py").write_text(CUDA_LINE)
    with pytest.raises(audit.AuditInputError, match=r"not a valid \.gitignore pattern"):
        audit.audit_source(tmp_path)
    result = run_cli("audit-source", "--diff", ".", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "branches",
    [
        "1.5 if torch.cuda.is_available() else 2.5",
        "b'x' if kind == 'cpu' else ...",
        "1j if a else 2",
    ],
)
def test_a_conditional_expression_of_plain_values_is_walked(branches: str) -> None:
    """Its branches are constants of every kind: a float once crashed the walker (found while
    porting chapter 9's tolerances, `1e-05 if ranks_device_type == "cpu" else 0.01`)."""
    findings = audit.audit_code(f"import torch\nvalue = {branches}\n")
    assert all(finding.line == 2 for finding in findings)
