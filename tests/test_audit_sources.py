"""Tests for `tpuready.audit.sources`: which files a scan reads, how it reads them, what it
refuses with an error naming the path, and the `# tpuready: ignore` pragmas."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import REPOSITORY

from tpuready import audit
from tpuready.audit import sources

FIXTURES = REPOSITORY / "tests" / "fixtures" / "audit"


def test_folders_are_searched_recursively_skipping_tool_and_hidden_folders(tmp_path: Path) -> None:
    cuda_line = "import torch\nx = torch.ones(1).cuda()\n"
    for relative in (
        "pkg/module.py",
        "pkg/deep/er/module.py",
        ".venv/lib/site.py",
        ".git/hooks/hook.py",
        "_build/html/page.py",
        "pkg/__pycache__/module.py",
        ".hidden/module.py",
        "pkg/.hidden_file.py",
        "pkg/notes.txt",
    ):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(cuda_line)
    shutil.copy(FIXTURES / "notebook.ipynb", tmp_path / "pkg" / "chapter.ipynb")
    files = audit.find_source_files(tmp_path)
    assert [f.relative_to(tmp_path).as_posix() for f in files] == [
        "pkg/chapter.ipynb",
        "pkg/module.py",
        "pkg/deep/er/module.py",
    ]
    # A path named explicitly is scanned even inside a skipped folder.
    assert audit.find_source_files(tmp_path / ".venv" / "lib" / "site.py")
    # Naming a file twice (directly and through its folder) scans it once.
    assert len(audit.find_source_files([tmp_path / "pkg", tmp_path / "pkg" / "module.py"])) == 3


def test_bad_paths_raise_errors_that_name_them(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.py"
    with pytest.raises(audit.AuditInputError, match=r"nowhere\.py: no such file"):
        audit.audit_source(missing)
    text_file = tmp_path / "notes.txt"
    text_file.write_text("cuda")
    with pytest.raises(audit.AuditInputError, match=r"notes\.txt is neither a \.py file"):
        audit.audit_source([text_file])
    not_a_notebook = tmp_path / "broken.ipynb"
    not_a_notebook.write_text("{not json")
    with pytest.raises(audit.AuditInputError, match=r"broken\.ipynb is not a notebook"):
        audit.audit_source(not_a_notebook)
    latin1 = tmp_path / "latin1.py"
    latin1.write_bytes(b"name = '\xe9'\n")
    with pytest.raises(audit.AuditInputError, match=r"cannot decode .*latin1\.py"):
        audit.audit_file(latin1)
    with pytest.raises(audit.AuditInputError, match="no paths given"):
        audit.audit_source([])


def test_a_file_over_the_limit_is_too_large(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sources, "MAX_FILE_BYTES", 10)
    small, large = tmp_path / "small.py", tmp_path / "large.py"
    small.write_text("x = 1\n")
    large.write_text("x = 1 + 2 + 3\n")
    assert not sources.is_too_large(small)
    assert sources.is_too_large(large)


def test_ignore_pragmas_count_only_in_comments() -> None:
    source = (
        "a = 1  # tpuready: ignore\n"
        "b = 2  # tpuready: ignore[cuda-method, nccl-backend]\n"
        'c = "# tpuready: ignore"\n'
        "\x0cd = 4  # tpuready: ignore[cuda-method]\n"
    )
    assert sources.ignored_rules_by_line(source) == {
        1: None,
        2: frozenset({"cuda-method", "nccl-backend"}),
        4: frozenset({"cuda-method"}),  # a form feed does not start a line
    }
