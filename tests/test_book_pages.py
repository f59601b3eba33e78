"""Claims the prose pages and the repository's own files make, checked against what they name."""

from __future__ import annotations

import re
import subprocess

import pytest
import yaml
from conftest import REPOSITORY, read_notebook

BOOK_PAGES = sorted((REPOSITORY / "book").rglob("*.md"))
CHAPTER_FILES = {path.name[:2]: path for path in (REPOSITORY / "notebooks").glob("[0-9][0-9]_*")}


def chapter_text(number: str) -> str:
    """The sources of chapter `number` ("3" or "03")."""
    return "\n".join(cell.source for cell in read_notebook(CHAPTER_FILES[number.zfill(2)]).cells)


def test_pages_send_readers_to_recompile_coverage_only_where_it_exists() -> None:
    wrong = []
    for page in BOOK_PAGES:
        for sentence in re.split(r"(?<=[.!?])\s", page.read_text()):
            if "recompil" not in sentence.lower():
                continue
            for number in re.findall(r"[Cc]hapters? (\d+)", sentence):
                said = re.search(rf"[Cc]hapters? {number}[^.]*?recompil", sentence)
                if said and "recompil" not in chapter_text(number).lower():
                    wrong.append(f"{page.name}: {sentence.strip()[:80]}")
    assert wrong == []


def test_pages_are_published_only_after_the_test_command_passes() -> None:
    workflow = yaml.safe_load((REPOSITORY / ".github/workflows/pages.yml").read_text())
    jobs = workflow["jobs"]

    def upstream(name: str) -> set[str]:
        needs = jobs[name].get("needs", [])
        needs = [needs] if isinstance(needs, str) else needs
        return set(needs).union(*(upstream(need) for need in needs))

    testing = {
        name
        for name, job in jobs.items()
        if any("make test" in step.get("run", "") for step in job.get("steps", []))
    }
    deploying = [name for name, job in jobs.items() if "deploy-pages" in str(job.get("steps"))]
    assert testing and deploying
    for name in deploying:
        assert upstream(name) & testing, f"job {name} deploys without a passing `make test`"


def run_torch_choice(torch_build: str) -> subprocess.CompletedProcess[str]:
    """Run the `TORCH=...` step of `make venv` with pip replaced by `echo`: what would it do?"""
    dry_run = subprocess.run(
        ["make", "-n", "-B", "venv", f"TORCH={torch_build}"],
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    step = dry_run[dry_run.index("case") : dry_run.index("esac") + len("esac")]
    step = re.sub(r"\S*python -m pip install", "echo pip install", step)
    return subprocess.run(["bash", "-c", step], capture_output=True, text=True, timeout=60)


def test_torch_cpu_installs_from_pytorchs_cpu_index() -> None:
    chosen = run_torch_choice("cpu")
    assert chosen.returncode == 0
    assert "pip install --quiet torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in (
        chosen.stdout.replace('"', "")
    )


def test_the_default_torch_comes_with_the_other_pins() -> None:
    chosen = run_torch_choice("default")
    assert chosen.returncode == 0 and "pip install" not in chosen.stdout


def test_an_unknown_torch_build_is_refused_by_name() -> None:
    refused = run_torch_choice("rocm")
    assert refused.returncode == 2 and "'rocm'" in refused.stdout


def test_glue_keys_the_pages_name_exist() -> None:
    # setup.md, workshop.md and CONTRIBUTING.md show readers a glue key as an example; a key no
    # notebook glues would teach them to look for a value that is not there.
    pages = [*BOOK_PAGES, REPOSITORY / "CONTRIBUTING.md", REPOSITORY / "README.md"]
    glued = {
        key
        for path in (REPOSITORY / "notebooks").glob("*.ipynb")
        for cell in read_notebook(path).cells
        if cell.cell_type == "code"
        for key in re.findall(r"glue\(\s*\"(\w+)\"", cell.source)
    }
    named = {
        (page.name, key)
        for page in pages
        for key in re.findall(r"`(?:\{glue:text\}`)?((?:ch\d\d|hw)_\w+)[:`]", page.read_text())
    }
    assert sorted((page, key) for page, key in named if key not in glued) == []
    assert named  # the pages do name keys, so the check reads them


# The workshop's agendas (book/workshop/agendas.md): times that add up, breaks in time.
AGENDAS = REPOSITORY / "book" / "workshop" / "agendas.md"
AGENDA_TIME = re.compile(r"^(\d+):(\d\d)-(\d+):(\d\d)$")
MAX_MINUTES_WITHOUT_A_BREAK = 90


def chapters_of_parts() -> dict[str, list[int]]:
    """Part I, II and III's chapter numbers, read from the table of contents."""
    toc = yaml.safe_load((REPOSITORY / "_toc.yml").read_text())
    parts = {}
    for part in toc["parts"]:
        numeral = part["caption"].split(".")[0]
        if numeral in ("I", "II", "III"):
            files = [chapter["file"] for chapter in part["chapters"]]
            parts[numeral] = [int(f[10:12]) for f in files if re.match(r"notebooks/\d\d_", f)]
    return parts


PARTS = chapters_of_parts()


def agenda(heading: str) -> list[dict]:
    """The rows of the table under `## heading`, with start and end in minutes."""
    section = AGENDAS.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        match = AGENDA_TIME.match(cells[0])
        if match and len(cells) == 6:
            h1, m1, h2, m2 = (int(part) for part in match.groups())
            block, material, teach, exercises, cut = cells[1:]
            rows.append(
                {
                    "start": h1 * 60 + m1,
                    "end": h2 * 60 + m2,
                    "block": block,
                    "material": material,
                    "teach": int(teach or 0),
                    "exercises": int(exercises or 0),
                    "cut": cut,
                }
            )
    assert rows, f"no agenda table under '## {heading}'"
    return rows


@pytest.mark.parametrize(("heading", "minutes"), [("Half day", 210), ("Full day", 480)])
def test_an_agenda_adds_up_and_breaks_in_time(heading: str, minutes: int) -> None:
    rows = agenda(heading)
    assert rows[0]["start"] == 0 and rows[-1]["end"] == minutes
    since_break = 0
    for previous, row in zip([None, *rows], rows, strict=False):
        if previous is not None:
            assert row["start"] == previous["end"], f"a gap or overlap before {row['block']}"
        length = row["end"] - row["start"]
        if row["block"] in ("Break", "Lunch"):
            since_break = 0
            continue
        assert row["teach"] + row["exercises"] == length, row["block"]
        assert row["cut"], f"{row['block']} says nothing to cut when short"
        since_break += length
        assert since_break <= MAX_MINUTES_WITHOUT_A_BREAK, f"no break before {row['block']}"


@pytest.mark.parametrize("heading", ["Half day", "Full day"])
def test_an_agenda_covers_parts_one_to_three_with_exercises(heading: str) -> None:
    taught = {}
    for row in agenda(heading):
        for number in re.findall(r"notebooks/(\d\d)_", row["material"]):
            taught[int(number)] = row
    for part, chapters in PARTS.items():
        assert any(chapter in taught for chapter in chapters), f"Part {part} is not taught"
    assert all(row["exercises"] > 0 for row in taught.values() if row["material"])


def test_the_full_day_ends_on_the_capstone() -> None:
    """Issue 38: the last taught block of the full day is Part V, both of its chapters."""
    toc = yaml.safe_load((REPOSITORY / "_toc.yml").read_text())
    capstone = next(part for part in toc["parts"] if part["caption"].startswith("V."))
    chapters = {c["file"] for c in capstone["chapters"] if c["file"].startswith("notebooks/")}
    last = [row for row in agenda("Full day") if "notebooks/" in row["material"]][-1]
    assert len(chapters) == 2
    assert {f"{chapter}.ipynb" for chapter in chapters} <= set(
        re.findall(r"(notebooks/\d\d_\w+\.ipynb)", last["material"])
    )


GLOSSARY = REPOSITORY / "book" / "reference" / "glossary.md"
GLOSSARY_ENTRY = re.compile(r"^(\S[^\n]*)\n((?:  [^\n]*\n)+)", re.MULTILINE)


def glossary_entries() -> dict[str, str]:
    block = GLOSSARY.read_text().split("```{glossary}\n", 1)[1].split("\n```", 1)[0] + "\n"
    return {term: " ".join(text.split()) for term, text in GLOSSARY_ENTRY.findall(block)}


def test_the_glossary_is_sorted_and_names_the_terms_the_issue_asked_for() -> None:
    terms = list(glossary_entries())
    assert terms == sorted(terms, key=str.lower)
    asked = {"MXU", "ICI", "DCN", "HBM", "MFU", "SPMD", "FSDP", "TP", "EP", "DTensor"}
    asked |= {"device mesh", "guard", "recompile", "bucket"}
    assert asked <= set(terms)


def test_each_glossary_term_is_used_by_the_chapters_it_names() -> None:
    wrong = []
    for term, text in glossary_entries().items():
        named = re.findall(r"Chapters? (\d+)(?: (?:and|to) (\d+))?", text)
        for first, second in named:
            for number in {first, second or first}:
                chapter = chapter_text(number).lower()
                if term.lower().split()[0] not in chapter:
                    wrong.append(f"{term}: chapter {number}")
    assert wrong == []


def test_the_environment_page_lists_every_variable_the_notebooks_run_under() -> None:
    makefile = (REPOSITORY / "Makefile").read_text()
    conditions = makefile.split("NOTEBOOK_ENV :=", 1)[1].split("\n\n", 1)[0]
    conditions += makefile.split("PORTABLE_KERNELS :=", 1)[1].split("\n", 1)[0]
    variables = set(re.findall(r"\b([A-Z][A-Z0-9_]+)=", conditions)) - {"PYTHONPATH"}
    page = (REPOSITORY / "book" / "reference" / "environment-variables.md").read_text()
    assert variables and {name for name in variables if f"`{name}" not in page} == set()


HANDOUT_I = REPOSITORY / "book" / "workshop" / "handouts" / "part1-device-agnostic.md"


def _call(code: str) -> str:
    """A call without its arguments: `torch.manual_seed(s)` reads `torch.manual_seed()`."""
    return re.sub(r"\(.*\)$", "()", code)


def test_handout_one_gives_the_replacements_the_reference_map_gives() -> None:
    """The handout's short table is written for one page; its torch.cuda rows must still say
    what tpuready.accelerator_api (and the generated reference page) says."""
    from tpuready.accelerator_api import CUDA_TO_ACCELERATOR

    portable = {_call(entry.cuda_call): _call(entry.replacement) for entry in CUDA_TO_ACCELERATOR}
    rows = re.findall(r"^\| `(torch\.cuda\.[^`]+)` \| `([^`]+)`", HANDOUT_I.read_text(), re.M)
    assert len(rows) >= 4
    for cuda_call, written in rows:
        assert _call(written) == portable[_call(cuda_call)], cuda_call
