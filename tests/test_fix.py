"""Tests of the CUDA-to-portable rewriter (`tpuready.audit.fix`, `audit-source --fix`/`--diff`).

Each input in tests/fixtures/fix/ has its expected output next to it (`NAME.py.expected`), and
marks the lines the fixer must leave, and report, with a trailing `# left: RULE` comment.
"""

from __future__ import annotations

import ast
import io
import json
import operator
import os
import re
import subprocess
import sys
import tokenize
import warnings
from collections import Counter
from pathlib import Path

import hypothesmith
import nbformat
import pytest
import torch
from conftest import REPOSITORY, refuse_to_list
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tpuready import audit
from tpuready.accelerator_api import CUDA_TO_ACCELERATOR
from tpuready.audit import fix

FIXTURES = REPOSITORY / "tests" / "fixtures" / "fix"
EXAMPLES = REPOSITORY / "notebooks" / "examples"
FIXTURE_INPUTS = sorted(FIXTURES.glob("*.py"))
LEFT_MARKER = re.compile(r"#\s*left:\s*(?P<rules>[\w\-, ]+)$")
# The Makefile's NOTEBOOK_ENV: offline, one thread, fixed hashing.
OFFLINE_ENV = {
    "TPUREADY_OFFLINE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "PYTHONPATH": str(REPOSITORY / "scripts" / "offline_site"),
    "OMP_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
    "TOKENIZERS_PARALLELISM": "false",
    "CUDA_VISIBLE_DEVICES": "",
}
LOSS_LINE = re.compile(r"epoch \d+: loss \d+\.\d+")


def _comments(source: str) -> Counter[str]:
    """The comments of a Python text, as tokenize reads them (never text inside strings)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return Counter(token.string for token in tokens if token.type == tokenize.COMMENT)


def _left_markers(source: str) -> set[tuple[int, str]]:
    expected = set()
    for number, line in enumerate(source.splitlines(), start=1):
        marker = LEFT_MARKER.search(line)
        if marker:
            expected |= {(number, rule.strip()) for rule in marker.group("rules").split(",")}
    return expected


def _covered_rules() -> set[str]:
    """The audit's rules (read at run time: the audit may gain rules) that the fixer rewrites."""
    return set(fix.FIXED_RULES) & set(audit.RULES)


def _must_change(finding: audit.Finding) -> bool:
    """True for findings the audit says must change (not guarded code or notes); every
    finding when the audit has no severities."""
    must_change = getattr(audit, "MUST_CHANGE", None)
    severity = getattr(finding, "severity", None)
    return must_change is None or severity is None or severity == must_change


# --------------------------------------------------------------------------------------------
# Fixtures: expected output and what is left


@pytest.mark.parametrize("path", FIXTURE_INPUTS, ids=lambda path: path.stem)
def test_fixture_is_rewritten_as_expected(path: Path) -> None:
    expected = path.with_name(path.name + ".expected").read_text(encoding="utf-8")
    assert fix.fix_file(path).fixed == expected


@pytest.mark.parametrize("path", FIXTURE_INPUTS, ids=lambda path: path.stem)
def test_fixture_reports_exactly_the_marked_lines_as_left(path: Path) -> None:
    # Lines in the fixed text, where the markers (comments) still stand.
    result = fix.fix_source(path.read_text(encoding="utf-8"))
    assert {(item.line, item.rule) for item in result.left} == _left_markers(result.fixed)
    assert all(item.reason and item.code and item.message for item in result.left)


@pytest.mark.parametrize("path", FIXTURE_INPUTS, ids=lambda path: path.stem)
def test_fixed_fixture_parses_keeps_comments_and_is_stable(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    fixed = fix.fix_source(source).fixed
    ast.parse(fixed)
    assert _comments(source) <= _comments(fixed)
    again = fix.fix_source(fixed)
    assert again.fixed == fixed
    assert again.changes == ()


@pytest.mark.parametrize("path", FIXTURE_INPUTS, ids=lambda path: path.stem)
def test_fixed_fixture_has_no_covered_findings_except_on_left_lines(path: Path) -> None:
    fixed = fix.fix_file(path).fixed
    left_lines = {number for number, _ in _left_markers(fixed)}
    remaining = [
        finding
        for finding in audit.audit_code(fixed, path.name)
        if finding.rule in _covered_rules() and _must_change(finding)
    ]
    if path.stem == "guarded":
        remaining = []  # CUDA-only on purpose: the fixer leaves guarded code as it is
    assert [finding for finding in remaining if finding.line not in left_lines] == []


def test_guarded_code_is_left_alone() -> None:
    source = (FIXTURES / "guarded.py").read_text(encoding="utf-8")
    result = fix.fix_source(source)
    assert result.fixed == source
    assert result.changes == ()
    assert result.left == ()


def test_changes_name_their_lines_in_the_original() -> None:
    source = (FIXTURES / "cuda_method.py").read_text(encoding="utf-8")
    lines = source.splitlines()
    result = fix.fix_source(source)
    moved = [change.line for change in result.changes if change.rule == "cuda-method"]
    assert moved == [9, 10, 15]
    assert all(".cuda(" in lines[number - 1] for number in moved)


def test_a_device_string_kept_as_a_string_where_it_is_compared() -> None:
    fixed = fix.fix_source(
        'import torch\nDEVICE = "cuda"\nif DEVICE == "cuda":\n    print(DEVICE)\n'
    ).fixed
    assert "DEVICE = device.type" in fixed


def test_device_assigned_from_a_cuda_string_becomes_the_device_choice() -> None:
    fixed = fix.fix_source(
        'import torch\n\ndef main():\n    device = torch.device("cuda")\n    return device\n'
    ).fixed
    assert f"    device = {fix.CHOOSE_DEVICE}\n" in fixed
    assert fix.DEVICE_LINE + "\n" not in fixed.replace("    device", "")  # no module line


def test_device_type_of_a_parameter_works_for_strings_and_devices() -> None:
    source = "import torch\n\ndef step(device):\n    return torch.cuda.amp.autocast()\n"
    fixed = fix.fix_source(source).fixed
    assert "torch.amp.autocast(torch.device(device).type)" in fixed
    assert torch.device("cpu").type == torch.device(torch.device("cpu")).type == "cpu"


# --------------------------------------------------------------------------------------------
# The table is the single source of the torch.cuda replacements


def test_direct_replacements_come_from_the_table() -> None:
    replacements = fix.direct_replacements()
    by_name = {
        entry.cuda_call.removeprefix("torch.cuda.").split("(")[0]: entry
        for entry in CUDA_TO_ACCELERATOR
    }
    for name, replacement in replacements.items():
        assert by_name[name].replacement.startswith(replacement)
    assert replacements["synchronize"] == "torch.accelerator.synchronize"
    assert replacements["manual_seed_all"] == "torch.manual_seed"
    # Not the same call with the same arguments, or not the same result: never rewritten.
    for name in ("Stream", "Event", "get_rng_state", "get_device_capability", "amp.autocast"):
        assert name not in replacements


@pytest.mark.skipif(torch.accelerator.is_available(), reason="needs a machine without GPU")
def test_the_calls_guarded_as_statements_are_those_that_raise_without_an_accelerator() -> None:
    arguments = {"set_device": (0,), "manual_seed": (0,), "manual_seed_all": (0,)}
    for name, replacement in fix.direct_replacements().items():
        if name in {"set_stream", "device", "OutOfMemoryError"}:
            continue  # need a stream / a `with` block / are not calls
        function = operator.attrgetter(replacement.removeprefix("torch."))(torch)
        try:
            function(*arguments.get(name, ()))
            raised = False
        except RuntimeError:
            raised = True
        assert raised == (name in fix.NEEDS_AN_ACCELERATOR), name


# --------------------------------------------------------------------------------------------
# The added device line: cuda on a GPU machine, cpu without an accelerator


@pytest.mark.parametrize(
    ("accelerator", "expected"), [(torch.device("cuda"), "cuda"), (None, "cpu")]
)
def test_the_added_device_line_picks_cuda_on_cuda_and_cpu_without(
    monkeypatch: pytest.MonkeyPatch, accelerator: torch.device | None, expected: str
) -> None:
    fixed = fix.fix_file(EXAMPLES / "train_cuda_only.py").fixed
    assert fixed.count(fix.DEVICE_LINE) == 1
    line = fix.DEVICE_LINE
    calls = []

    def current_accelerator(check_available: bool = False) -> torch.device | None:
        calls.append(check_available)
        return accelerator

    monkeypatch.setattr(torch.accelerator, "current_accelerator", current_accelerator)
    namespace: dict[str, object] = {"torch": torch}
    exec(line, namespace)
    assert namespace["device"] == torch.device(expected)
    assert calls == [True]


# --------------------------------------------------------------------------------------------
# The book's examples


def test_fixed_train_cuda_only_prints_the_losses_of_the_hand_ported_script(
    tmp_path: Path,
) -> None:
    fixed = tmp_path / "train_fixed.py"
    fixed_text = fix.fix_file(EXAMPLES / "train_cuda_only.py").fixed
    # The script's own check, ported, wants an accelerator; this machine may have none.
    needs_accelerator = (
        '    assert torch.accelerator.is_available(), "this script needs a CUDA GPU"\n'
    )
    assert needs_accelerator in fixed_text
    fixed.write_text(fixed_text.replace(needs_accelerator, ""), encoding="utf-8")
    scripts = (fixed, EXAMPLES / "train_portable.py")
    runs = {  # both at once: each trains for a few seconds
        script.name: subprocess.Popen(
            [sys.executable, str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env={**os.environ, **OFFLINE_ENV},
        )
        for script in scripts
    }
    outputs = {}
    for name, run in runs.items():
        try:
            stdout, stderr = run.communicate(timeout=180)
        finally:
            run.kill()
        assert run.returncode == 0, stderr
        outputs[name] = [line for line in stdout.splitlines() if LOSS_LINE.fullmatch(line)]
    assert len(outputs["train_fixed.py"]) == 5
    assert outputs["train_fixed.py"] == outputs["train_portable.py"]


def test_fixed_train_cuda_only_has_no_covered_findings_left() -> None:
    result = fix.fix_file(EXAMPLES / "train_cuda_only.py")
    findings = audit.audit_code(result.fixed, "train_cuda_only.py")
    assert [f for f in findings if f.rule in _covered_rules() and _must_change(f)] == []
    assert not result.left
    # cudnn.benchmark stays as written: off CUDA it does nothing, and the audit calls it a note.
    (note,) = [f for f in findings if f.rule == "cudnn-setting"]
    assert note.severity == "note"


@pytest.mark.parametrize("name", ["ddp_cuda_only.py"])
def test_what_the_audit_still_finds_is_what_the_fixer_reported_as_left(name: str) -> None:
    result = fix.fix_file(EXAMPLES / name)
    known = set(audit.RULES)  # every must-change finding left is reported
    still_found = Counter(
        finding.rule
        for finding in audit.audit_code(result.fixed, name)
        if finding.rule in known and _must_change(finding)
    )
    assert still_found == Counter(item.rule for item in result.left if item.rule in known)
    assert still_found


def test_fixed_ddp_example_parses_and_reports_what_it_cannot_fix() -> None:
    source = (EXAMPLES / "ddp_cuda_only.py").read_text(encoding="utf-8")
    result = fix.fix_source(source)
    ast.parse(result.fixed)
    assert "dist.init_process_group()" in result.fixed
    assert "pin_memory=torch.accelerator.is_available()" in result.fixed
    lines = result.fixed.splitlines()  # what is left is reported at its line after the fix
    left = {(item.rule, lines[item.line - 1].strip()) for item in result.left}
    assert all(item.code == lines[item.line - 1].strip() for item in result.left)
    assert left == {
        ("set-device-index", "torch.cuda.set_device(local_rank)"),
        ("to-int-device", "model = DDP(model.to(local_rank), device_ids=[local_rank])"),
        ("ddp-device-ids", "model = DDP(model.to(local_rank), device_ids=[local_rank])"),
        ("to-int-device", "batch_features = batch_features.to(local_rank)"),
        (
            "cuda-method",
            "batch_targets = batch_targets.cuda(local_rank, non_blocking=True)",
        ),
    }
    # A device index gets the per-process recipe; DDP's device_ids are dropped.
    per_rank = audit.per_rank_advice("local_rank")
    reasons = {item.rule: item.reason for item in result.left}
    assert per_rank in reasons["set-device-index"] and per_rank in reasons["cuda-method"]
    assert "leave device_ids and output_device out" in reasons["ddp-device-ids"]


# --------------------------------------------------------------------------------------------
# The command line


def _run(paths: list[str], *, write: bool) -> tuple[int, str, str]:
    stdout, stderr = io.StringIO(), io.StringIO()
    status = fix.run_fix(paths, write=write, stdout=stdout, stderr=stderr)
    return status, stdout.getvalue(), stderr.getvalue()


def test_diff_mode_prints_a_diff_and_writes_nothing(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    original = (EXAMPLES / "ddp_cuda_only.py").read_text(encoding="utf-8")
    script.write_text(original, encoding="utf-8")
    status, stdout, stderr = _run([str(script)], write=False)
    assert status == fix.EXIT_LEFT
    assert stdout.startswith(f"--- a/{str(script).lstrip('/')}\n+++ b/")
    assert '-    dist.init_process_group("nccl")\n+    dist.init_process_group()\n' in stdout
    assert "left set-device-index" in stderr
    assert script.read_text(encoding="utf-8") == original


def test_write_mode_rewrites_in_place_and_a_second_run_is_clean(tmp_path: Path) -> None:
    script = tmp_path / "model.py"
    script.write_bytes(b"import torch\r\n\r\nx = torch.zeros(2).cuda()  # move\r\n")
    status, stdout, stderr = _run([str(tmp_path)], write=True)
    assert (status, stderr) == (fix.EXIT_CLEAN, "")
    assert "fixed" in stdout
    assert script.read_bytes() == (
        b"import torch\r\n\r\n"
        + fix.DEVICE_LINE.replace("\n", "\r\n").encode()
        + b"\r\n\r\nx = torch.zeros(2).to(device)  # move\r\n"
    )
    assert _run([str(script)], write=True) == (fix.EXIT_CLEAN, "", "")
    assert _run([str(script)], write=False) == (fix.EXIT_CLEAN, "", "")


def test_unreadable_input_gives_one_line_and_status_2(tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n", encoding="utf-8")
    not_json = tmp_path / "chapter.ipynb"
    not_json.write_text("{", encoding="utf-8")
    for path in (tmp_path / "missing.py", broken, tmp_path / "notes.txt", not_json):
        status, stdout, stderr = _run([str(path)], write=True)
        assert status == fix.EXIT_UNREADABLE
        assert stdout == ""
        assert len(stderr.splitlines()) == 1
        assert str(path) in stderr


def test_a_fifo_or_an_oversized_file_is_refused_without_reading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fifo = tmp_path / "pipe.py"
    os.mkfifo(fifo)
    status, _, stderr = _run([str(fifo)], write=True)
    assert (status, stderr) == (
        fix.EXIT_UNREADABLE,
        f"tpuready fix: error: {fifo} is not a regular file or folder (a FIFO, device, socket "
        "or broken symlink); name Python files, notebooks or folders\n",
    )
    large = tmp_path / "large.py"
    large.write_text("x = 1\n" * 10, encoding="utf-8")
    monkeypatch.setattr(fix, "MAX_FILE_BYTES", 20)
    status, _, stderr = _run([str(large)], write=True)
    assert status == fix.EXIT_UNREADABLE
    assert "60 bytes, over the 20" in stderr


def _notebook(tmp_path: Path, *cells: nbformat.NotebookNode) -> Path:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = list(cells)
    path = tmp_path / "chapter.ipynb"
    nbformat.write(notebook, path)
    return path


def test_a_notebook_gets_one_device_line_in_its_import_cell(tmp_path: Path) -> None:
    on_purpose = nbformat.v4.new_code_cell("y = x.cuda()")
    on_purpose.metadata["tags"] = [fix.CUDA_ON_PURPOSE_TAG]
    path = _notebook(
        tmp_path,
        nbformat.v4.new_markdown_cell("x.cuda() in prose"),
        nbformat.v4.new_code_cell("import torch"),
        nbformat.v4.new_code_cell("x = torch.zeros(2).cuda()  # move"),
        nbformat.v4.new_code_cell("%matplotlib inline\nz = x.cuda()"),
        nbformat.v4.new_code_cell("w = x.to('cuda')"),
        on_purpose,
        nbformat.v4.new_code_cell('%%bash\necho "x.cuda()"'),
    )
    result = fix.fix_notebook(path)
    assert result.skipped == (6,)  # not Python even without its IPython lines
    fixed_cells = dict(result.cells)
    assert fixed_cells[1].fixed == f"import torch\n\n{fix.DEVICE_LINE}"  # no final newline
    assert fixed_cells[2].fixed == "x = torch.zeros(2).to(device)  # move"
    assert fixed_cells[3].fixed == "%matplotlib inline\nz = x.to(device)"  # magics kept
    assert fixed_cells[4].fixed == "w = x.to(device)"
    assert 5 not in fixed_cells
    assert fixed_cells[6].left == ()  # the audit finds nothing to port in a shell cell
    status, stdout, stderr = _run([str(path)], write=True)
    assert (status, stdout, stderr) == (fix.EXIT_CLEAN, f"fixed {path}: 4 changes\n", "")
    written = nbformat.read(path, as_version=4)
    nbformat.validate(written)
    sources = [cell.source for cell in written.cells]
    assert sources[2] == "x = torch.zeros(2).to(device)  # move"
    assert sources[3:5] == ["%matplotlib inline\nz = x.to(device)", "w = x.to(device)"]
    assert sources[5] == "y = x.cuda()"
    again = fix.fix_notebook(path)
    assert not again.changed and again.fixed == again.original


def test_a_notebook_that_defines_device_gets_no_device_line(tmp_path: Path) -> None:
    path = _notebook(
        tmp_path,
        nbformat.v4.new_code_cell("import torch\nimport tpuready.runtime.device"),
        nbformat.v4.new_code_cell("device = tpuready.runtime.device.choose_device()"),
        nbformat.v4.new_code_cell("x = torch.zeros(2).cuda()\ntorch.cuda.manual_seed(0)"),
    )
    status, stdout, _ = _run([str(path)], write=False)
    assert status == fix.EXIT_LEFT
    assert f"--- a/{str(path).lstrip('/')}:cell 3\n" in stdout
    assert "+x = torch.zeros(2).to(device)\n+torch.manual_seed(0)" in stdout
    assert "accelerator.current_accelerator" not in stdout


@pytest.mark.parametrize(
    "binding",
    [
        "def move(x, device='cpu'):",  # a default that is not the choice
        "def move(x):\n    device = 3",
        "def move(x):\n    device = x.device",
        "def move(x):\n    if x.is_sparse:\n        device = torch.device('mps')",
    ],
)
def test_rewrites_never_capture_a_device_the_scope_binds_to_something_else(binding: str) -> None:
    source = f"import torch\n\n\n{binding}\n    return x.cuda()\n"
    fixed = fix.fix_source(source).fixed
    assert "return x.to(chosen_device)" in fixed
    assert "chosen_device = (\n    torch.accelerator.current_accelerator" in fixed
    namespace: dict[str, object] = {}
    exec(compile(fixed, "fixed.py", "exec"), namespace)  # the fresh name is defined
    assert namespace["chosen_device"] == namespace["torch"].device("cpu")  # type: ignore[attr-defined]


def test_the_device_a_caller_passes_or_the_choice_is_used_as_it_is() -> None:
    for binding in (
        "def move(x, device):",
        "def move(x, device: torch.device = torch.device('cuda')):",
        "def move(x):\n    device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')",
    ):
        fixed = fix.fix_source(f"import torch\n\n\n{binding}\n    return x.cuda()\n").fixed
        assert "return x.to(device)" in fixed and "chosen_device" not in fixed, binding


def test_the_fresh_name_is_one_the_file_does_not_use() -> None:
    source = "import torch\nchosen_device = 1\n\n\ndef f(x, device=None):\n    return x.cuda()\n"
    assert "return x.to(chosen_device_)" in fix.fix_source(source).fixed


def test_a_notebook_gets_the_fresh_device_line_once(tmp_path: Path) -> None:
    path = _notebook(
        tmp_path,
        nbformat.v4.new_code_cell("import torch"),
        nbformat.v4.new_code_cell("def f(x, device='cpu'):\n    return x.cuda()"),
        nbformat.v4.new_code_cell("y = torch.zeros(2).cuda()"),
    )
    fixed_cells = dict(fix.fix_notebook(path).cells)
    first = fixed_cells[1].fixed
    assert first.count("chosen_device = (") == 1 and "\ndevice = (" not in first
    assert fixed_cells[2].fixed.endswith("return x.to(chosen_device)")
    assert fixed_cells[3].fixed == "y = torch.zeros(2).to(chosen_device)"


def test_a_file_that_needs_a_fresh_name_gets_one_device_line_used_everywhere() -> None:
    source = (
        "import torch\n\n\ndef f(x, device='cpu'):\n    return x.cuda()\n\n\n"
        "y = torch.ones(1).cuda()\n"
    )
    fixed = fix.fix_source(source).fixed
    assert fixed.count("current_accelerator(check_available=True)") == 1
    assert "return x.to(chosen_device)" in fixed and "y = torch.ones(1).to(chosen_device)" in fixed
    namespace: dict[str, object] = {}
    exec(compile(fixed, "fixed.py", "exec"), namespace)
    assert namespace["y"].device == namespace["chosen_device"]  # type: ignore[attr-defined]


def test_the_book_portable_code_needs_no_change() -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    notebooks = REPOSITORY / "notebooks"
    paths = [
        str(notebooks / name)
        for name in (
            "01_device_agnostic_basics.ipynb",
            "02_train_save_and_audit_on_any_device.ipynb",
            "06_graph_breaks.ipynb",
            "07_host_syncs.ipynb",
            "14_planning_8192_chips.ipynb",
            "examples/train_portable.py",
        )
    ]
    assert fix.run_fix(paths, write=False, stdout=stdout, stderr=stderr) == fix.EXIT_CLEAN
    assert (stdout.getvalue(), stderr.getvalue()) == ("", "")


def test_fix_source_refuses_what_is_not_python_text() -> None:
    with pytest.raises(fix.FixInputError, match="cannot parse"):
        fix.fix_source("def f(:\n")
    with pytest.raises(TypeError, match="bytes"):
        fix.fix_source(b"import torch")  # type: ignore[arg-type]


def test_command_line_diff_prints_the_diff(tmp_path: Path) -> None:
    script = tmp_path / "seed.py"
    script.write_text("import torch\n\ntorch.cuda.manual_seed(0)\n", encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "tpuready", "audit-source", "--diff", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPOSITORY,
    )
    assert result.returncode == fix.EXIT_LEFT
    assert "-torch.cuda.manual_seed(0)\n+torch.manual_seed(0)\n" in result.stdout


# --------------------------------------------------------------------------------------------
# Properties on generated scripts

STATEMENTS = [
    "{name} = {name}.cuda()",
    "{name} = {name}.cuda(non_blocking=True)  # copy",
    '{name} = {name}.to("cuda", non_blocking=True)',
    "{name} = {name}.cuda({name})",
    "torch.cuda.synchronize()",
    "torch.cuda.manual_seed({number})",
    "{name} = torch.cuda.memory_allocated()",
    '{name} = torch.device("cuda")',
    'device = "cuda" if torch.cuda.is_available() else "cpu"',
    'device_type = "cuda" if torch.cuda.is_available() else "cpu"',
    "with torch.cuda.amp.autocast():\n    {name} = {name} + 1",
    "{name} = torch.cuda.amp.GradScaler()",
    'dist.init_process_group("nccl")',
    "{name} = DataLoader({name}, pin_memory=True)",
    'x = {name}.to(f"cuda:{{{name}}}")',
    "if torch.cuda.is_available():\n    {name} = {name}.cuda()",
    'if device.type == "cuda":\n    torch.backends.cudnn.benchmark = True',
    "torch.backends.cudnn.benchmark = True",
    "assert torch.cuda.is_available()",
    "if {name}: assert torch.cuda.is_available()",
    "# a comment about cuda {number}",
    '{name} = torch.zeros({number}, device="cuda")',
]
HEADERS = [
    "import torch\nimport torch.distributed as dist\nfrom torch.utils.data import DataLoader\n",
    "import torch.distributed as dist\nfrom torch.utils.data import DataLoader\n",
]


@st.composite
def cuda_scripts(draw: st.DrawFn) -> str:
    """A small script: imports, then statements from the patterns above, some in a function."""
    names = st.sampled_from(["model", "batch", "features", "local_rank", "data"])
    lines = [draw(st.sampled_from(HEADERS))]
    for _ in range(draw(st.integers(1, 3))):
        statements = [
            draw(st.sampled_from(STATEMENTS)).format(
                name=draw(names), number=draw(st.integers(0, 9))
            )
            for _ in range(draw(st.integers(1, 5)))
        ]
        if draw(st.booleans()):
            body = "\n".join("    " + line for text in statements for line in text.split("\n"))
            lines.append(
                f"\ndef step(model, batch, features, local_rank, data, x):\n{body}\n    pass\n"
            )
        else:
            lines.append("\n".join(statements) + "\n")
    return "\n".join(lines)


@settings(max_examples=60, suppress_health_check=[HealthCheck.too_slow])
@given(cuda_scripts())
def test_fixing_generated_scripts_parses_keeps_comments_and_is_idempotent(source: str) -> None:
    result = fix.fix_source(source)
    ast.parse(result.fixed)
    assert _comments(source) <= _comments(result.fixed)
    again = fix.fix_source(result.fixed)
    assert again.fixed == result.fixed
    assert again.changes == ()
    line_count = len(source.splitlines())
    fixed_lines = result.fixed.splitlines()
    assert all(item.code == fixed_lines[item.line - 1].strip() for item in result.left)
    assert all(1 <= change.line <= line_count + 1 for change in result.changes)


@settings(max_examples=25, suppress_health_check=list(HealthCheck))
@given(hypothesmith.from_grammar())
def test_any_python_is_fixed_or_refused_with_a_clear_error(source: str) -> None:
    try:
        result = fix.fix_source(source)
    except fix.FixInputError:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # generated code may call an int
        compile(result.fixed, "<fixed>", "exec")
    assert fix.fix_source(result.fixed).fixed == result.fixed


def test_deliberate_cuda_checks_stay_cuda_checks_in_the_audit_and_the_fix() -> None:
    source = (FIXTURES / "deliberate_cuda_checks.py").read_text(encoding="utf-8")
    lines = source.splitlines()
    guarded = {
        lines[finding.line - 1].strip()
        for finding in audit.audit_code(source)
        if finding.severity == audit.GUARDED
    }
    kept = {
        "SKIP_FP8 = not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9",
        "torch.cuda.is_available()",  # in `use_fp8_kernels`' `and`
        "and torch.cuda.get_device_capability() >= (9, 0)",
        '@unittest.skipUnless(torch.cuda.is_available(), "CUDA-only kernel")',
        '@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")',
        '@pytest.mark.skipif(condition=not torch.cuda.is_available(), reason="needs CUDA")',
    }
    assert guarded == kept
    fixed = fix.fix_source(source).fixed
    fixed_lines = [line.strip() for line in fixed.splitlines()]
    for line in kept:
        assert fixed_lines.count(line) == 1, line
    # The shapes that check nothing about CUDA itself become the portable probe, and a
    # ported flag guards nothing: the CUDA call under `if HAS_CUDA:` is ported too.
    assert "HAS_CUDA = torch.accelerator.is_available()" in fixed
    assert "available = torch.accelerator.is_available()" in fixed
    assert "return torch.accelerator.is_available() and batch_size > 1" in fixed
    assert "torch.cuda.synchronize" not in fixed
    assert {finding.severity for finding in audit.audit_code(fixed)} == {audit.GUARDED}


def test_a_flag_set_from_a_cuda_probe_is_ported_with_the_code_it_guards() -> None:
    source = (
        "import torch\n"
        "class Trainer:\n"
        "    def __init__(self):\n"
        "        self.use_cuda = torch.cuda.is_available()\n"
        "    def step(self):\n"
        "        if self.use_cuda:\n"
        "            torch.cuda.synchronize()\n"
    )
    severities = {f.line: f.severity for f in audit.audit_code(source)}
    assert severities == {4: audit.MUST_CHANGE, 7: audit.MUST_CHANGE}
    fixed = fix.fix_source(source).fixed
    assert "torch.cuda" not in fixed
    assert "self.use_cuda = torch.accelerator.is_available()" in fixed


def test_a_cuda_flag_set_elsewhere_still_guards_the_code_under_it() -> None:
    # `args.cuda` comes from the command line: only CUDA sets it, so the code is guarded.
    source = "import torch\nif args.cuda:\n    torch.cuda.synchronize()\n"
    (finding,) = audit.audit_code(source)
    assert finding.severity == audit.GUARDED
    assert fix.fix_source(source).fixed == source  # the fixer obeys the audit's verdict


def test_a_cuda_check_in_a_notebook_cell_stays_when_torch_is_imported_in_another(
    tmp_path: Path,
) -> None:
    path = _notebook(
        tmp_path,
        nbformat.v4.new_code_cell("import torch as th"),
        nbformat.v4.new_code_cell(
            "HOPPER = th.cuda.is_available() and th.cuda.get_device_capability() >= (9, 0)\n"
            "ready = th.cuda.is_available()"
        ),
    )
    fixed_lines = dict(fix.fix_notebook(path).cells)[2].fixed.splitlines()  # cells from 1
    assert (
        "HOPPER = th.cuda.is_available() and th.cuda.get_device_capability() >= (9, 0)"
        in fixed_lines
    )
    assert "ready = torch.accelerator.is_available()" in fixed_lines


def test_a_cuda_flag_that_picks_the_device_is_ported_not_kept() -> None:
    # The PyTorch examples' shape: the flag chooses the device, so a TPU must answer True.
    source = (
        "import torch\n"
        "use_cuda = not no_cuda and torch.cuda.is_available()\n"
        'device = torch.device("cuda" if use_cuda else "cpu")\n'
    )
    (probe,) = [f for f in audit.audit_code(source) if f.line == 2]
    assert probe.severity == audit.MUST_CHANGE
    fixed = fix.fix_source(source).fixed
    assert "use_cuda = not no_cuda and torch.accelerator.is_available()" in fixed


# --------------------------------------------------------------------------------------------
# One verdict: what the fixer leaves is what the audit still finds


AUDIT_FIXTURES = [
    *sorted((REPOSITORY / "tests" / "fixtures" / "audit").rglob("*.py")),
    REPOSITORY / "tests" / "fixtures" / "audit" / "notebook.ipynb",
]
LEFT_LINE = re.compile(r"^(?P<label>.+?):(?P<line>\d+):(?P<column>\d+)  left (?P<rule>[\w-]+): ")


@pytest.mark.parametrize(
    "path", AUDIT_FIXTURES, ids=lambda path: path.relative_to(REPOSITORY / "tests").as_posix()
)
def test_fix_then_audit_finds_exactly_what_the_fixer_reported_left(
    path: Path, tmp_path: Path
) -> None:
    copy = tmp_path / path.name
    copy.write_bytes(path.read_bytes())
    status, _, stderr = _run([str(copy)], write=True)
    reported = Counter()
    for line in stderr.splitlines():
        match = LEFT_LINE.match(line)
        assert match is not None, line
        cell = match["label"].rpartition(":cell ")[2] if ":cell " in match["label"] else None
        reported[(cell, int(match["line"]), int(match["column"]), match["rule"])] += 1
    remaining = Counter(
        (
            None if finding.cell is None else str(finding.cell),
            finding.line,
            finding.column,
            finding.rule,
        )
        for finding in audit.audit_file(copy)
        if finding.severity == audit.MUST_CHANGE
    )
    assert reported == remaining
    assert status == (fix.EXIT_LEFT if remaining else fix.EXIT_CLEAN)


def test_a_file_with_only_cudnn_settings_is_reported_not_called_clean(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\ntorch.backends.cudnn.deterministic = True\n", encoding="utf-8")
    status, stdout, stderr = _run([str(script)], write=False)
    assert (status, stdout) == (fix.EXIT_LEFT, "")
    assert f"{script.as_posix()}:2:1  left cudnn-setting: " in stderr


def test_a_harmless_cudnn_setting_is_kept_and_not_reported(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import torch\ntorch.backends.cudnn.benchmark = True\n", encoding="utf-8")
    assert _run([str(script)], write=False) == (fix.EXIT_CLEAN, "", "")


def test_an_assert_that_cuda_is_there_becomes_one_that_an_accelerator_is() -> None:
    source = (
        "import torch\n"
        'assert torch.cuda.is_available(), "this script needs a GPU"  # why\n'
        "if ready: assert torch.cuda.is_available()\n"
        "assert torch.cuda.device_count() >= 2\n"
    )
    result = fix.fix_source(source)
    assert result.fixed.splitlines()[1:] == [
        'assert torch.accelerator.is_available(), "this script needs a GPU"  # why',
        "if ready: assert torch.accelerator.is_available()",
        "assert torch.cuda.device_count() >= 2",
    ]
    # Two ranks on a CUDA host are two GPUs; on TorchTPU each process sees one: a person decides.
    assert [(item.line, item.rule) for item in result.left] == [(4, "torch-cuda-call")]


def test_left_lines_are_the_lines_after_the_rewrite(tmp_path: Path) -> None:
    # The device line added above moves the index line down by five.
    source = "import torch\nx = torch.zeros(2).cuda()\ny = x.cuda(local_rank)\n"
    result = fix.fix_source(source)
    (left,) = result.left
    assert result.fixed.splitlines()[left.line - 1] == "y = x.cuda(local_rank)"
    assert left.line == 8


def test_the_fixer_obeys_the_config_and_ignore_comments(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.tpuready]\nskip = ["pin-memory"]\nexclude = ["vendored"]\n', encoding="utf-8"
    )
    (tmp_path / "vendored").mkdir()
    vendored = tmp_path / "vendored" / "kernel.py"
    vendored.write_text("import torch\nx = torch.ones(1).cuda()\n", encoding="utf-8")
    script = tmp_path / "train.py"
    source = (
        "import torch\n"
        "loader = DataLoader(data, pin_memory=True)\n"
        "a = torch.ones(1).cuda()  # tpuready: ignore\n"
        'b = torch.ones(1).to("cuda").cuda()  # tpuready: ignore[cuda-method]\n'
        "c = torch.ones(1).cuda()\n"
    )
    script.write_text(source, encoding="utf-8")
    status, _, stderr = _run([str(tmp_path)], write=True)
    assert (status, stderr) == (fix.EXIT_CLEAN, "")
    assert vendored.read_text(encoding="utf-8") == "import torch\nx = torch.ones(1).cuda()\n"
    fixed = script.read_text(encoding="utf-8").splitlines()
    assert "loader = DataLoader(data, pin_memory=True)" in fixed
    assert "a = torch.ones(1).cuda()  # tpuready: ignore" in fixed
    assert "b = torch.ones(1).to(device).cuda()  # tpuready: ignore[cuda-method]" in fixed
    assert "c = torch.ones(1).to(device)" in fixed
    # Without the config, the skipped rule is rewritten and the excluded file too.
    stdout, stderr_text = io.StringIO(), io.StringIO()
    fix.run_fix([str(tmp_path)], write=True, stdout=stdout, stderr=stderr_text, use_config=False)
    assert "pin_memory=torch.accelerator.is_available()" in script.read_text(encoding="utf-8")
    assert "torch.ones(1).to(device)" in vendored.read_text(encoding="utf-8")


def test_code_the_audit_calls_guarded_is_left_by_the_fixer() -> None:
    source = (
        "import torch\nif args.cuda:\n    torch.cuda.synchronize()\n"
        "used = torch.cuda.memory_allocated() if args.cuda else 0\n"
    )
    assert {f.severity for f in audit.audit_code(source)} == {audit.GUARDED}
    result = fix.fix_source(source)
    assert (result.fixed, result.changes, result.left) == (source, (), ())


def test_a_cuda_branch_that_alone_moves_the_work_is_ported_not_kept() -> None:
    source = "import torch\nif args.cuda:\n    model.cuda()\nx = y.cuda() if args.cuda else y\n"
    findings = audit.audit_code(source)
    assert {f.severity for f in findings} == {audit.MUST_CHANGE}
    assert {f.line for f in findings if f.rule == "cuda-test-fallback"} == {2, 4}
    result = fix.fix_source(source)
    assert "model.to(device)" in result.fixed and "y.to(device) if args.cuda" in result.fixed
    assert [(left.line, left.rule) for left in result.left] == [
        (7, "cuda-test-fallback"),  # after the device line the fixer adds (lines 3-6)
        (9, "cuda-test-fallback"),
    ]


def test_an_unreadable_folder_is_named_and_the_rest_still_fixed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "train.py").write_text("import torch\nx = torch.ones(1).cuda()\n")
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "inner.py").write_text("import torch\ny = torch.ones(1).cuda()\n")
    refuse_to_list(monkeypatch, locked)
    status, stdout, stderr = _run([str(tmp_path)], write=False)
    assert status == fix.EXIT_UNREADABLE
    assert stderr.startswith(f"tpuready fix: error: cannot read folder {locked}: Permission")
    assert "+x = torch.ones(1).to(device)" in stdout and "inner.py" not in stdout


def test_no_check_is_ported_over_code_the_rewrite_leaves_cuda_only() -> None:
    # On a TPU the original takes the CPU path; a ported check would run set_device(args.gpu).
    source = (
        "import torch\n\n\ndef setup(model, args):\n"
        "    if torch.cuda.is_available():\n"
        "        torch.cuda.set_device(args.gpu)\n"
        "        model.cuda(args.gpu)\n"
        "    return model\n"
    )
    result = fix.fix_source(source)
    assert result.fixed == source and not result.changes
    assert {(left.line, left.rule) for left in result.left} >= {
        (5, "torch-cuda-call"),
        (6, "set-device-index"),
        (7, "cuda-method"),
    }


@pytest.mark.parametrize(
    ("line", "rule"),
    [
        ('model = torch.compile(model, mode="max-autotune")', "compile-mode"),
        ('torch.get_device_module("cuda").synchronize()', "device-module-call"),
        ("x = x.type(torch.cuda.FloatTensor)", "cuda-tensor-type"),
    ],
)
def test_no_check_is_ported_over_a_line_its_rule_leaves_cuda_only(line: str, rule: str) -> None:
    # The original runs on the CPU of a TPU host; with the check ported it would reach `line`,
    # which raises there. RULE_TABLE's `fix` column says which rules' lines stay CUDA-only.
    source = (
        "import torch\n\n\ndef setup(model, x):\n"
        "    if torch.cuda.is_available():\n"
        "        model = model.cuda()\n"
        f"        {line}\n"
        "    else:\n"
        '        print("no GPU: the CPU")\n'
        "    return model, x\n"
    )
    assert rule in fix.LEFT_CUDA_ONLY_RULES
    result = fix.fix_source(source)
    assert "torch.cuda.is_available()" in result.fixed
    assert "torch.accelerator.is_available()" not in result.fixed
    (check,) = [left for left in result.left if left.line == 5]
    assert check.rule == "torch-cuda-call"
    assert "kept by the fixer: it guards line 7, which the fixer leaves CUDA-only" in check.message


def test_the_fixers_rule_lists_are_the_fix_column_of_the_rule_table() -> None:
    by_action = {
        action: {rule.id for rule in audit.RULE_TABLE if rule.fix == action}
        for action in ("rewrite", "leave", "leave-cuda-only")
    }
    assert by_action["rewrite"] == fix.FIXED_RULES
    assert by_action["leave-cuda-only"] == fix.LEFT_CUDA_ONLY_RULES
    assert {"cudnn-setting", "float64", "cuda-env-var"} <= by_action["leave"]
    assert sum(map(len, by_action.values())) == len(audit.RULE_TABLE)


def test_a_rule_row_with_an_unknown_fix_action_is_refused() -> None:
    row = audit.RULE_TABLE[0]
    with pytest.raises(ValueError, match="fix must be one of"):
        audit.Rule(row.id, row.severity, row.description, (), None, row.advice, "rewrite-all")


def test_no_check_is_ported_over_a_ranks_own_cuda_index() -> None:
    source = "import torch\nif torch.cuda.is_available():\n    model.cuda(args.gpu)\n"
    result = fix.fix_source(source)
    assert result.fixed == source
    assert {(left.line, left.rule) for left in result.left} == {
        (2, "torch-cuda-call"),
        (3, "cuda-method"),
    }


def test_the_device_the_program_chose_is_the_one_inputs_follow() -> None:
    source = (
        "import torch\n\n\ndef train(args, model, x):\n"
        "    device = torch.device(args.device)\n"
        "    model.to(device)\n"
        "    return model(x.cuda())\n"
    )
    fixed = fix.fix_source(source).fixed
    assert "return model(x.to(device))" in fixed and "chosen_device" not in fixed


def test_a_diff_marks_a_last_line_without_a_newline_as_diff_does() -> None:
    result = fix.FixResult(original="x = a.cuda()", fixed="x = a.to(device)")
    assert result.diff("cell").splitlines()[-4:] == [
        "-x = a.cuda()",
        "\\ No newline at end of file",
        "+x = a.to(device)",
        "\\ No newline at end of file",
    ]


# --------------------------------------------------------------------------------------------
# Speed: text is rewritten only where the audit found something to rewrite


def refuse_to_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(source: str) -> None:
        raise AssertionError("libcst parsed a text with nothing to rewrite")

    monkeypatch.setattr(fix.cst, "parse_module", refuse)


@pytest.mark.parametrize(
    ("source", "left"),
    [
        ("import torch\ntorch.cuda.set_device(local_rank)\n", [(2, "set-device-index")]),
        ("import torch\nif torch.cuda.is_available():\n    torch.cuda.empty_cache()\n", []),
        ("import numpy as np\nx = np.ones(3)\n", []),
        (  # a rank's own index is left to the per-process recipe
            'import torch\nmodel = model.cuda(args.gpu)\nx = torch.device(f"cuda:{rank}")\n',
            [(2, "cuda-method"), (3, "cuda-device-string")],
        ),
    ],
)
def test_text_with_nothing_to_rewrite_is_not_parsed_by_libcst(
    source: str, left: list[tuple[int, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    refuse_to_parse(monkeypatch)
    result = fix.fix_source(source)
    assert result.fixed == source and not result.changes
    assert [(item.line, item.rule) for item in result.left] == left


def test_text_with_something_to_rewrite_is_rewritten(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_to_parse(monkeypatch)
    with pytest.raises(AssertionError, match="libcst parsed"):
        fix.fix_source("import torch\nx = torch.ones(1).cuda()\n")


def test_text_that_does_not_parse_is_still_refused_with_its_line() -> None:
    with pytest.raises(fix.FixInputError, match=r"cannot parse \(line 2\)"):
        fix.fix_source("x = 1\ndef f(:\n")


# --------------------------------------------------------------------------------------------
# A positional backend, the layout of an edited call, the module docstring


@pytest.mark.parametrize(
    ("call", "fixed"),
    [
        ('"nccl", "env://"', 'init_method="env://"'),
        ('"nccl", "env://", t, 2, rank=r', 'init_method="env://", timeout=t, world_size=2, rank=r'),
        ('"nccl", init_method="env://"', 'init_method="env://"'),
        ('init_method="env://", backend="nccl"', 'init_method="env://"'),
    ],
)
def test_dropping_a_positional_nccl_names_the_arguments_after_it(call: str, fixed: str) -> None:
    result = fix.fix_source(f"import torch.distributed as dist\ndist.init_process_group({call})\n")
    assert result.fixed.splitlines()[1] == f"dist.init_process_group({fixed})"
    assert [change.rule for change in result.changes] == ["nccl-backend"]
    assert not result.left


@pytest.mark.parametrize(
    "backend", ['"NCCL"', '"Nccl"', 'backend="NCCL"', "dist.Backend.NCCL", "backend='nccl'"]
)
def test_nccl_in_any_case_is_dropped_as_torch_reads_it(backend: str) -> None:
    # torch.distributed lower-cases a backend name: "NCCL" asks for NCCL just as "nccl" does.
    result = fix.fix_source(
        f'import torch.distributed as dist\ndist.init_process_group({backend}, init_method="env://")\n'
    )
    assert result.fixed.splitlines()[1] == 'dist.init_process_group(init_method="env://")'
    assert [change.rule for change in result.changes] == ["nccl-backend"]
    assert not result.left


@pytest.mark.parametrize("call", ['"nccl", *rest', '"nccl", a, b, c, d, e, f, g'])
def test_a_positional_nccl_whose_followers_cannot_be_named_is_left_and_reported(call: str) -> None:
    source = f"import torch.distributed as dist\ndist.init_process_group({call})\n"
    result = fix.fix_source(source)
    assert result.fixed == source
    assert [(item.line, item.rule) for item in result.left] == [(2, "nccl-backend")]


@pytest.mark.parametrize(
    ("call", "fixed"),
    [
        (
            '(\n    "nccl",\n    "tcp://a:1",\n    t,\n)',
            '(\n    init_method="tcp://a:1",\n    timeout=t,\n)',
        ),
        ('(\n    init_method="env://",\n    backend="nccl",\n)', '(\n    init_method="env://",\n)'),
        ('(init_method="env://",  backend="nccl")', '(init_method="env://")'),
    ],
)
def test_an_edited_call_keeps_its_layout(call: str, fixed: str) -> None:
    result = fix.fix_source(f"import torch.distributed as dist\ndist.init_process_group{call}\n")
    assert result.fixed == f"import torch.distributed as dist\ndist.init_process_group{fixed}\n"


@pytest.mark.parametrize(
    "head", ['"""Train a model."""\n', '"""Train a model."""\nfrom __future__ import annotations\n']
)
def test_the_module_docstring_stays_first(head: str) -> None:
    result = fix.fix_source(f"{head}x = torch.ones(1).cuda()\n")
    assert result.fixed.startswith(f"{head}import torch\n")
    assert ast.get_docstring(ast.parse(result.fixed)) == "Train a model."
    assert result.fixed.index("device = (") > result.fixed.index("import torch\n")


def test_an_nbformat_3_notebook_is_refused_not_converted(tmp_path: Path) -> None:
    from test_audit_robustness import NBFORMAT_3

    path = tmp_path / "old.ipynb"
    path.write_text(json.dumps(NBFORMAT_3))
    with pytest.raises(fix.FixInputError, match=r"nbformat 3\); convert it with"):
        fix.fix_notebook(path)


def test_a_fixed_notebook_is_written_as_jupyter_saves_it(tmp_path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# Été"),
        nbformat.v4.new_code_cell("import torch"),
        nbformat.v4.new_code_cell("x = torch.ones(1).cuda()\ny = 2"),
    ]
    path = tmp_path / "lesson.ipynb"
    nbformat.write(notebook, path)
    fixed = fix.fix_notebook(path).fixed
    reread = nbformat.reads(fixed, as_version=4)
    nbformat.validate(reread)
    assert nbformat.writes(reread) + "\n" == fixed  # byte for byte what Jupyter would save
    assert [cell.id for cell in reread.cells] == [cell.id for cell in notebook.cells]
    assert reread.cells[0] == notebook.cells[0]
    assert "x = torch.ones(1).to(device)" in reread.cells[2].source
    assert "Été" in fixed  # not escaped, as Jupyter writes it


@pytest.mark.parametrize(
    "cell",
    [
        {"cell_type": "code", "source": "x = torch.zeros(1).cuda()", "metadata": []},
        {"cell_type": "code", "source": "x = torch.zeros(1).cuda()", "metadata": {}},  # no outputs
        {"cell_type": "code", "source": "x = torch.zeros(1).cuda()"},
    ],
)
def test_a_notebook_nbformat_cannot_write_is_still_fixed(cell: dict, tmp_path: Path) -> None:
    path = tmp_path / "odd.ipynb"
    imports = {"cell_type": "code", "source": "import torch", "metadata": {}, "outputs": []}
    path.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 4, "cells": [imports, cell]}))
    fixed = json.loads(fix.fix_notebook(path).fixed)
    assert "".join(fixed["cells"][1]["source"]) == "x = torch.zeros(1).to(device)"
