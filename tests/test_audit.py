"""Tests of the source audit (`tpuready.audit`, `python -m tpuready audit-source`).

Each fixture in tests/fixtures/audit/ marks the lines the audit must flag with a trailing
`# expect: RULE` comment, so the expected findings live next to the code that causes them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from conftest import NOTEBOOK_DIR, REPOSITORY
from hypothesis import given, settings
from hypothesis import strategies as st

from tpuready import audit
from tpuready.accelerator_api import equivalent_for

FIXTURES = REPOSITORY / "tests" / "fixtures" / "audit"
EXAMPLES = REPOSITORY / "notebooks" / "examples"
EXPECT_MARKER = re.compile(r"#\s*expect:\s*(?P<rules>[\w\-, ]+)$")

# One fixture per rule, and a piece of text every suggestion of that rule must contain.
RULE_FIXTURES = {
    "cuda-method": ("cuda_method.py", ".to(device)"),
    "torch-cuda-call": ("torch_cuda_call.py", "torch.accelerator"),
    "cuda-device-string": ("cuda_device_string.py", "torch.accelerator.current_accelerator("),
    "cuda-amp": ("cuda_amp.py", "torch.amp."),
    "cudnn-setting": ("cudnn_setting.py", ""),
    "cuda-backend-setting": ("cuda_backend_setting.py", "torch.set_float32_matmul_precision"),
    "pin-memory": ("pin_memory.py", "pin_memory=torch.accelerator.is_available()"),
    "to-int-device": ("to_int_device.py", ".to(device)"),
    "set-device-index": ("set_device_index.py", "index = local_rank if"),
    "nccl-backend": ("nccl_backend.py", "dist.init_process_group() with no backend"),
    "float64": ("float64.py", "float"),
    "inference-mode": ("inference_mode.py", "torch.no_grad()"),
    "ddp-device-ids": ("issue9/ties_ddp_device_ids.py", "leave device_ids"),
    "cuda-profiler-activity": ("issue9/ties_pin_profiler.py", ""),
    "cuda-tensor-type": ("issue9/ties_tensor_types.py", "device"),
    "cuda-env-var": ("issue9/ties_environment.py", "per process"),
    "cuda-test-fallback": ("issue9/guards_by_other_branch.py", 'device.type != "cpu"'),
    "compile-mode": ("issue9/real_world_ties.py", 'if device.type == "cuda" else None'),
    "device-module-call": ("issue9/real_world_ties.py", "torch.accelerator."),
    "cuda-only-package": ("issue15/fresh_corpus_shapes.py", "device.type"),
    "cuda-named-helper": ("issue15/fresh_corpus_shapes.py", "device-neutral version"),
    "grad-scaler-default": ("issue15/fresh_corpus_shapes.py", 'enabled=device.type == "cuda"'),
}


def expected_markers(path: Path) -> set[tuple[int | None, int, str]]:
    """(cell, line, rule) for every `# expect: rule` comment; cells count code cells from 1."""
    if path.suffix == ".ipynb":
        code_cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
        sources = [(number, cell.source) for number, cell in enumerate(code_cells, start=1)]
    else:
        sources = [(None, path.read_text())]
    expected = set()
    for cell, source in sources:
        for line_number, line in enumerate(source.splitlines(), start=1):
            marker = EXPECT_MARKER.search(line)
            if marker:
                for rule in marker.group("rules").split(","):
                    expected.add((cell, line_number, rule.strip()))
    return expected


def found(findings: list[audit.Finding]) -> set[tuple[int | None, int, str]]:
    return {(finding.cell, finding.line, finding.rule) for finding in findings}


def run_cli(*arguments: str, cwd: Path = REPOSITORY) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tpuready", *arguments],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


# --------------------------------------------------------------------------------------------
# One fixture per rule


def test_every_rule_has_a_fixture_and_a_description() -> None:
    assert set(RULE_FIXTURES) | {"syntax-error", "skipped-file"} == set(audit.RULES)
    # RULES and the module docstring are generated from the rule table.
    assert list(audit.RULES) == [rule.id for rule in audit.RULE_TABLE]
    for rule in audit.RULE_TABLE:
        assert f"- `{rule.id}` ({rule.severity}): {rule.description}." in audit.__doc__


@pytest.mark.parametrize("rule", sorted(RULE_FIXTURES))
def test_fixture_findings_are_exactly_the_marked_lines(rule: str) -> None:
    file_name, suggestion_part = RULE_FIXTURES[rule]
    path = FIXTURES / file_name
    expected = expected_markers(path)
    assert expected, f"{file_name} marks no line with '# expect: {rule}'"
    findings = [f for f in audit.audit_file(path) if f.rule == rule]
    expected = {marker for marker in expected if marker[2] == rule}
    assert found(findings) == expected
    for finding in findings:
        assert finding.path == path.as_posix()
        assert suggestion_part in finding.suggestion
        assert finding.message and finding.column >= 1


def test_torch_cuda_suggestions_come_from_the_accelerator_table() -> None:
    by_line = {f.line: f for f in audit.audit_file(FIXTURES / "torch_cuda_call.py")}
    source_lines = (FIXTURES / "torch_cuda_call.py").read_text().splitlines()
    checked = 0
    for line, finding in by_line.items():
        if finding.suggestion.startswith("keep it"):  # a CUDA probe guarding CUDA-only code
            assert finding.severity == "guarded"
            continue
        name = re.search(r"`torch\.cuda\.([\w.]+)`", finding.message).group(1)
        entry = equivalent_for(name)
        if entry is None:
            assert "no entry in tpuready.accelerator_api" in finding.suggestion
        else:
            assert finding.suggestion.startswith(entry.replacement), source_lines[line - 1]
            checked += 1
    assert checked >= 4  # synchronize (twice), empty_cache, memory_allocated
    unknown = [f for f in by_line.values() if "get_device_name" in f.message]
    assert len(unknown) == 1 and "no entry" in unknown[0].suggestion


def test_device_type_positions_suggest_device_type() -> None:
    findings = audit.audit_code('import torch\nwith torch.autocast("cuda"):\n    pass\n')
    assert [(f.line, f.rule) for f in findings] == [(2, "cuda-device-string")]
    assert findings[0].suggestion.startswith("device.type")
    plain = audit.audit_code('import torch\nx = torch.device("cuda")\n')
    assert plain[0].suggestion.startswith("device,")


@pytest.mark.parametrize(
    ("use", "as_type"),
    [
        ("with torch.autocast(device_type=KIND):\n    pass", True),
        ("with torch.autocast(KIND):\n    pass", True),
        ("log(my_device_type=KIND)", False),  # a keyword counts only where it starts a word
    ],
)
def test_a_name_passed_as_a_device_type_is_advised_as_one(use: str, as_type: bool) -> None:
    (finding,) = audit.audit_code(f'import torch\nKIND = "cuda"\n{use}\n')
    assert finding.line == 2
    assert finding.suggestion.startswith("device.type, " if as_type else "device, ")


@pytest.mark.parametrize(
    ("use", "flagged"),
    [
        ("dist.init_process_group(backend=BACKEND)", True),
        ("dist.init_process_group(BACKEND)", True),
        ("report(my_backend=BACKEND)", False),
    ],
)
def test_a_name_passed_as_a_backend_carries_nccl_to_where_it_is_set(
    use: str, flagged: bool
) -> None:
    source = f'import torch.distributed as dist\nBACKEND = "nccl"\n{use}\n'
    found = [(finding.line, finding.rule) for finding in audit.audit_code(source)]
    assert found == ([(2, "nccl-backend")] if flagged else [])


@pytest.mark.parametrize(
    ("line", "rule", "fields"),
    [
        ("model.cuda(args.gpu)", "cuda-method", {"per_rank": True}),
        ('x = torch.device(f"cuda:{rank}")', "cuda-device-string", {"per_rank": True}),
        ("torch.cuda.set_device(local_rank)", "set-device-index", {"per_rank": True}),
        ("x = y.cuda()", "cuda-method", {"per_rank": False, "cuda_name": None}),
        ("torch.cuda.synchronize()", "torch-cuda-call", {"cuda_name": "synchronize"}),
        (
            'if torch.cuda.is_available():\n    device = "cuda"\nelse:\n    device = "cpu"',
            "torch-cuda-call",
            {"cuda_name": "is_available", "off_cuda": "falls back to the CPU"},
        ),
        (
            "if not torch.cuda.is_available():\n    sys.exit(1)",
            "torch-cuda-call",
            {"off_cuda": "stops the program"},
        ),
        ("torch.cuda.empty_cache()", "torch-cuda-call", {"off_cuda": None}),
    ],
)
def test_findings_carry_what_their_message_says_as_fields(
    line: str, rule: str, fields: dict
) -> None:
    source = f"import sys\nimport torch\n{line}\n"
    (finding,) = [f for f in audit.audit_code(source) if f.rule == rule]
    assert {name: getattr(finding, name) for name in fields} == fields


def test_device_index_strings_mention_one_device_per_process() -> None:
    by_text = {
        source: audit.audit_code(source)
        for source in ('x.to("cuda:1")', 'x.to("cuda")', 'x.to(f"cuda:{rank}")')
    }
    assert "index 0" in by_text['x.to("cuda:1")'][0].message
    assert "index 0" in by_text['x.to(f"cuda:{rank}")'][0].message
    assert "index 0" not in by_text['x.to("cuda")'][0].message


def test_set_device_with_an_index_gives_one_finding_not_two() -> None:
    findings = audit.audit_code("import torch\ntorch.cuda.set_device(local_rank)\n")
    assert [f.rule for f in findings] == ["set-device-index"]
    at_zero = audit.audit_code("import torch\ntorch.cuda.set_device(0)\n")
    assert [f.rule for f in at_zero] == ["torch-cuda-call"]


def test_clean_portable_code_has_no_findings() -> None:
    path = FIXTURES / "clean_portable.py"
    text = path.read_text()
    # The fixture looks like CUDA code on purpose; without these the test could not fail.
    for lookalike in ('"cuda"', "torch.cuda.synchronize()", ".cuda()", "pin_memory=", "float64"):
        assert lookalike in text
    assert audit.audit_file(path) == []


def test_ignore_comments_silence_one_line_and_only_the_named_rules() -> None:
    source = (
        "import torch\n"
        "a = x.cuda()  # tpuready: ignore\n"
        "b = x.cuda()  # tpuready: ignore[float64]\n"
        "c = x.double().cuda()  # tpuready: ignore[cuda-method, pin-memory]\n"
        "d = x.cuda()\n"
    )
    assert {(f.line, f.rule) for f in audit.audit_code(source)} == {
        (3, "cuda-method"),
        (4, "float64"),
        (5, "cuda-method"),
    }


def test_method_chains_report_the_line_of_the_attribute() -> None:
    findings = audit.audit_code("model = (\n    build()\n    .cuda()\n)\n")
    assert [(f.line, f.column) for f in findings] == [(3, 6)]


# --------------------------------------------------------------------------------------------
# Notebooks


def test_notebook_cells_are_scanned_one_by_one_with_cell_numbers() -> None:
    path = FIXTURES / "notebook.ipynb"
    findings = audit.audit_notebook(path)
    assert found(findings) == expected_markers(path)
    assert all(f.cell is not None for f in findings)
    first = findings[0]
    assert first.location == f"{path.as_posix()}:cell 4:line 2"
    assert str(first).startswith(f"{path.as_posix()}:cell 4:line 2  cuda-method: ")


def test_cells_tagged_cuda_on_purpose_are_exempt(tmp_path: Path) -> None:
    notebook = nbformat.read(FIXTURES / "notebook.ipynb", as_version=4)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    on_purpose = code_cells[2]
    assert audit.CUDA_ON_PURPOSE_TAG in on_purpose.metadata["tags"]
    assert ".cuda()" in on_purpose.source and "torch.cuda." in on_purpose.source
    assert not [f for f in audit.audit_notebook(FIXTURES / "notebook.ipynb") if f.cell == 3]
    on_purpose.metadata["tags"] = []
    untagged = tmp_path / "untagged.ipynb"
    nbformat.write(notebook, untagged)
    in_cell_3 = {(f.line, f.rule) for f in audit.audit_notebook(untagged) if f.cell == 3}
    assert in_cell_3 == {(1, "cuda-method"), (2, "torch-cuda-call")}


def test_names_imported_in_one_cell_resolve_in_later_cells(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("import torch\nfrom torch.cuda import amp as mixed"),
            nbformat.v4.new_code_cell("scaler = mixed.GradScaler()"),
        ]
    )
    path = tmp_path / "aliases.ipynb"
    nbformat.write(notebook, path)
    findings = audit.audit_notebook(path)
    assert [(f.cell, f.line, f.rule) for f in findings] == [(2, 1, "cuda-amp")]
    assert "torch.cuda.amp.GradScaler" in findings[0].message


def test_magics_and_shell_lines_do_not_break_parsing() -> None:
    findings = audit.audit_notebook(FIXTURES / "notebook.ipynb")
    assert "syntax-error" not in {f.rule for f in findings}
    # The %%bash cell (6) holds torch.cuda text but is shell, not Python.
    assert not [f for f in findings if f.cell == 6]


def test_a_broken_cell_is_reported_and_later_cells_are_still_scanned(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook(
        cells=[
            nbformat.v4.new_code_cell("import torch\nx = torch.ones(2"),
            nbformat.v4.new_markdown_cell("prose"),
            nbformat.v4.new_code_cell("y = torch.zeros(2).cuda()"),
        ]
    )
    path = tmp_path / "broken.ipynb"
    nbformat.write(notebook, path)
    assert [(f.cell, f.rule) for f in audit.audit_notebook(path)] == [
        (1, "syntax-error"),
        (2, "cuda-method"),
    ]


# --------------------------------------------------------------------------------------------
# Files, folders, syntax errors


def test_a_syntax_error_in_one_file_does_not_stop_the_scan(tmp_path: Path) -> None:
    (tmp_path / "a_broken.py").write_text("import torch\ndef broken(:\n    x.cuda()\n")
    (tmp_path / "b_working.py").write_text("import torch\nx = torch.ones(2).cuda()\n")
    findings = audit.audit_source(tmp_path)
    assert [(Path(f.path).name, f.line, f.rule) for f in findings] == [
        ("a_broken.py", 2, "syntax-error"),
        ("b_working.py", 2, "cuda-method"),
    ]
    assert findings[0].message.startswith("could not parse")
    result = run_cli("audit-source", str(tmp_path))
    assert result.returncode == 1
    assert "a_broken.py:2  syntax-error: could not parse" in result.stdout
    assert "b_working.py:2  cuda-method" in result.stdout


def test_a_file_that_does_not_parse_is_reported_even_with_no_cuda_word(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("def total(values:\n    return sum(values)\n")
    (finding,) = audit.audit_source(tmp_path)
    assert (finding.rule, finding.line, finding.severity) == ("syntax-error", 1, "must-change")
    assert run_cli("audit-source", str(tmp_path)).returncode == 1


# --------------------------------------------------------------------------------------------
# Command line: formats and exit status


def test_text_report_is_sorted_and_ends_with_a_summary() -> None:
    result = run_cli(
        "audit-source",
        "tests/fixtures/audit/notebook.ipynb",
        "tests/fixtures/audit/cuda_method.py",
        "tests/fixtures/audit/clean_portable.py",
    )
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stdout.splitlines() if not line.endswith("):")]
    assert result.stdout.startswith("must change (6):\n")
    assert lines[-1] == "6 findings in 2 files (3 files scanned)"
    assert [line.split("  ")[0] for line in lines[:-1]] == [
        "tests/fixtures/audit/cuda_method.py:8",
        "tests/fixtures/audit/cuda_method.py:9",
        "tests/fixtures/audit/cuda_method.py:18",
        "tests/fixtures/audit/notebook.ipynb:cell 4:line 2",
        "tests/fixtures/audit/notebook.ipynb:cell 5:line 3",
        "tests/fixtures/audit/notebook.ipynb:cell 7:line 1",
    ]
    assert "  ->  .to(device)" in lines[0]


def test_json_format_is_a_list_of_finding_objects() -> None:
    result = run_cli("audit-source", "--format", "json", "tests/fixtures/audit")
    assert result.returncode == 1, result.stderr
    objects = json.loads(result.stdout)
    expected = audit.audit_source(FIXTURES)
    with_absolute_paths = [{**o, "path": (REPOSITORY / o["path"]).as_posix()} for o in objects]
    assert with_absolute_paths == [json.loads(json.dumps(f.to_dict())) for f in expected]
    assert len(objects) == len(expected) > 20
    assert list(objects[0]) == [
        "path",
        "cell",
        "line",
        "column",
        "rule",
        "severity",
        "message",
        "suggestion",
        "per_rank",
        "off_cuda",
        "cuda_name",
    ]
    assert {o["severity"] for o in objects} == {"must-change", "guarded", "note"}
    notebook_objects = [o for o in objects if o["path"].endswith("notebook.ipynb")]
    assert {(o["cell"], o["line"]) for o in notebook_objects} == {(4, 2), (5, 3), (7, 1)}
    assert all(o["cell"] is None for o in objects if o["path"].endswith(".py"))


def test_exit_status_zero_when_clean() -> None:
    result = run_cli("audit-source", "tests/fixtures/audit/clean_portable.py")
    assert (result.returncode, result.stdout) == (0, "0 findings (1 file scanned)\n")


def test_exit_status_one_with_findings() -> None:
    result = run_cli("audit-source", "tests/fixtures/audit/cuda_method.py")
    assert result.returncode == 1
    assert result.stdout.splitlines()[-1] == "3 findings in 1 file (1 file scanned)"


@pytest.mark.parametrize(
    ("arguments", "error_part"),
    [
        ((), "the following arguments are required: SUBCOMMAND"),
        (("lint",), "invalid choice: 'lint'"),
        (("audit-source",), "the following arguments are required: PATH"),
        (("audit-source", "--format", "xml", "tpuready"), "invalid choice: 'xml'"),
        (("audit-source", "missing_folder/"), "missing_folder: no such file or folder"),
        (("audit-source", "pyproject.toml"), "pyproject.toml is neither a .py file"),
    ],
)
def test_exit_status_two_on_bad_arguments(arguments: tuple[str, ...], error_part: str) -> None:
    result = run_cli(*arguments)
    assert result.returncode == 2
    assert error_part in result.stderr
    if not arguments:
        assert result.stderr.startswith("usage: python -m tpuready")


def test_unreadable_file_exits_two_but_the_other_files_are_reported(tmp_path: Path) -> None:
    (tmp_path / "bad.ipynb").write_text("[]")
    (tmp_path / "good.py").write_text("x = y.cuda()\n")
    result = run_cli("audit-source", str(tmp_path))
    assert result.returncode == 2
    assert "bad.ipynb is not an nbformat 4 notebook" in result.stderr
    assert "good.py:1  cuda-method" in result.stdout
    assert result.stdout.splitlines()[-1] == "1 finding in 1 file (1 file scanned)"


def test_help_exits_zero() -> None:
    result = run_cli("audit-source", "--help")
    assert result.returncode == 0 and "Exit status" in result.stdout


# --------------------------------------------------------------------------------------------
# The book passes its own audit


def test_the_tpuready_package_passes_its_own_audit() -> None:
    accelerator_api = (REPOSITORY / "tpuready" / "accelerator_api.py").read_text()
    assert "torch.cuda." in accelerator_api  # only inside strings: it must not be flagged
    findings = audit.audit_source(REPOSITORY / "tpuready")
    assert findings == [], "\n" + audit.format_text(findings)


@pytest.mark.parametrize("path", sorted(NOTEBOOK_DIR.glob("*.ipynb")), ids=lambda path: path.name)
def test_every_book_notebook_passes_the_audit(path: Path) -> None:
    findings = audit.audit_notebook(path)
    assert findings == [], (
        "\n" + audit.format_text(findings) + "Port these lines, tag a cell shown on purpose "
        f"'{audit.CUDA_ON_PURPOSE_TAG}', or end a line with '# tpuready: ignore[RULE]'."
    )


# --------------------------------------------------------------------------------------------
# The two example scripts


def test_the_cuda_only_example_is_flagged_rule_by_rule() -> None:
    findings = audit.audit_file(EXAMPLES / "train_cuda_only.py")
    assert {f.rule for f in findings} == {
        "torch-cuda-call",
        "cudnn-setting",
        "pin-memory",
        "cuda-method",
        "cuda-amp",
        "cuda-device-string",
    }
    names = {m.group(1) for f in findings if (m := re.search(r"`(torch\.[\w.]+)`", f.message))}
    assert {
        "torch.cuda.is_available",
        "torch.cuda.synchronize",
        "torch.cuda.amp.autocast",
        "torch.cuda.amp.GradScaler",
        "torch.backends.cudnn.benchmark",
    } <= names


def test_the_portable_example_passes_the_audit() -> None:
    assert audit.audit_file(EXAMPLES / "train_portable.py") == []


def test_the_portable_example_trains_on_the_cpu() -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_portable.py")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""},
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    lines = result.stdout.splitlines()
    assert lines[0] == "training on cpu"
    losses = [
        float(re.fullmatch(r"epoch \d: loss (\d+\.\d{4})", line).group(1)) for line in lines[1:]
    ]
    assert len(losses) == 5
    assert losses[-1] < losses[0] / 10


# --------------------------------------------------------------------------------------------
# Properties and speed

# One-line snippets and the rules each must raise, alone or among others.
SNIPPETS = [
    ("model = model.cuda()", ["cuda-method"]),
    ("torch.cuda.synchronize()", ["torch-cuda-call"]),
    ('batch = batch.to("cuda:0")', ["cuda-device-string"]),
    ("scaler = torch.cuda.amp.GradScaler()", ["cuda-amp"]),
    ("torch.backends.cudnn.benchmark = True", ["cudnn-setting"]),
    ("loader = DataLoader(data, pin_memory=True)", ["pin-memory"]),
    ("model.to(local_rank)", ["to-int-device"]),
    ("torch.cuda.set_device(rank)", ["set-device-index"]),
    ("torch.accelerator.set_device_index(rank)", ["set-device-index"]),
    ("torch.accelerator.set_device_index(index)", []),
    ("ddp = DistributedDataParallel(model, device_ids=[local_rank])", ["ddp-device-ids"]),
    ('os.environ["CUDA_VISIBLE_DEVICES"] = "0"', ["cuda-env-var"]),
    ('dist.init_process_group("nccl")', ["nccl-backend"]),
    ("wide = weights.double()", ["float64"]),
    (
        'device = "cuda" if torch.cuda.is_available() else "cpu"',
        ["cuda-device-string"],
    ),
    ("model = model.to(device)", []),
    ('print("cuda is", torch.accelerator.is_available())', []),
    ("loader = DataLoader(data, pin_memory=torch.accelerator.is_available())", []),
    ('if device.type == "cuda":\n    pass', []),
    ("reference = weights.cpu().double()", []),
]


@settings(max_examples=60)
@given(st.lists(st.sampled_from(range(len(SNIPPETS))), max_size=12))
def test_findings_follow_each_snippet_wherever_it_lands(indices: list[int]) -> None:
    lines = ["import torch", "import torch.distributed as dist"]
    expected = set()
    for index in indices:
        snippet, rules = SNIPPETS[index]
        expected |= {(len(lines) + 1, rule) for rule in rules}
        lines += snippet.split("\n")
    findings = audit.audit_code("\n".join(lines) + "\n")
    assert {(f.line, f.rule) for f in findings} == expected
    assert len(findings) == sum(len(SNIPPETS[index][1]) for index in indices)


def test_a_large_file_gets_every_finding() -> None:
    # How fast this runs is measured by `make bench` (book/execution-statistics.md), not here:
    # wall-clock assertions flake on a loaded 2-core machine.
    body = "\n".join(snippet for snippet, _ in SNIPPETS)
    source = "import torch\n" + "\n".join(
        f"def step_{n}(model, batch, data, weights, device, rank, local_rank):\n"
        + "\n".join("    " + line for line in body.split("\n"))
        for n in range(300)
    )
    findings = audit.audit_code(source)
    assert len(findings) == 300 * sum(len(rules) for _, rules in SNIPPETS) == 300 * 14


def test_a_dotted_capital_i_does_not_shift_the_lines_after_it() -> None:
    source = "# " + "\u0130" * 12 + "\nimport torch\ny = torch.zeros(1).cuda()\n"
    assert [(f.line, f.rule) for f in audit.audit_code(source)] == [(3, "cuda-method")]


def test_barrier_advice_names_the_process_group_device() -> None:
    source = "import torch.distributed as dist\ndist.barrier(device_ids=[local_rank])\n"
    (finding,) = audit.audit_code(source)
    assert finding.per_rank and "device_id=device" in finding.suggestion
