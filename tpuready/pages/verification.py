"""The verification records (`verification/*.json`) and the page "Where this book was verified".

`scripts/verify.py` runs the notebooks and writes a record; this module holds what a record is,
reads and checks the record files (with pydantic), and renders `book/verification.md` and the
line under each chapter's title (book/_ext/verified_stamp.py). It imports neither nbclient nor
nbformat, so the site build can import it.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal, Self, get_args

from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass
from pydantic_core import ErrorDetails, PydanticCustomError

__all__ = [
    "COLUMN_TITLES",
    "DATE_FORMAT",
    "KINDS",
    "KIND_PHRASES",
    "MACHINE_KINDS",
    "NOT_VERIFIED",
    "Failure",
    "NotebookResult",
    "Record",
    "RecordError",
    "failure_text",
    "load_records",
    "newest",
    "parse_record",
    "record_file_name",
    "record_to_json",
    "stamp",
    "verification_page",
]

Kind = Literal["cpu", "cuda", "tpu", "emulated-tpu"]
KINDS: tuple[str, ...] = get_args(Kind)  # the page's columns, in order
COLUMN_TITLES = {"cpu": "CPU", "cuda": "CUDA", "tpu": "TPU", "emulated-tpu": "Emulated TPU"}
KIND_PHRASES = {
    "cpu": "a CPU",
    "cuda": "a CUDA GPU",
    "tpu": "a Cloud TPU",
    "emulated-tpu": "the emulated TPU",
}
# The machines a stamp says a notebook has "not yet" run on: real ones (CI runs every notebook
# on the emulated TPU at every change, and a record of it is optional).
MACHINE_KINDS = ("cpu", "cuda", "tpu")
NOT_VERIFIED = "not yet verified"
DATE_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # UTC, as 2026-12-05T07:45:12Z


class RecordError(ValueError):
    """Raised for a record file that lacks a field or holds a value of the wrong kind."""


# The records are pydantic dataclasses: built in code (scripts/verify.py) or from a file
# (`parse_record`), each field is checked strictly (a bool is no number, "12" no float).


@dataclass(frozen=True)
class Failure:
    """The first cell that raised unexpectedly: its index among the code cells, from 0, as
    nbval names cells ("Cell 38"; None: the kernel never ran a cell)."""

    cell: StrictInt | None
    error: StrictStr
    message: StrictStr
    # The whole error, shown by `verify.py check` only; never written into a record.
    detail: StrictStr = dataclasses.field(default="", compare=False)


@dataclass(frozen=True)
class NotebookResult:
    """One notebook's run: ok when every cell ran, its seconds from kernel start to shutdown."""

    ok: StrictBool
    seconds: StrictFloat  # an int is taken too, as JSON may write 12 for 12.0
    code_cells: StrictInt
    failure: Failure | None

    @model_validator(mode="after")
    def _ok_without_failure(self) -> Self:
        """A run is ok exactly when it has no failure."""
        if self.ok != (self.failure is None):
            raise PydanticCustomError(
                "ok_and_failure",
                "'ok' is {ok} but 'failure' is {failure}",
                {"ok": str(self.ok), "failure": repr(self.failure)},
            )
        return self


@dataclass(frozen=True)
class Record:
    """One `make verify` run on one machine; `source` names the file it was read from."""

    date: StrictStr
    kind: Kind
    device_name: StrictStr
    driver_version: StrictStr | None
    torch: StrictStr
    transformers: StrictStr | None
    torch_tpu: StrictStr | None
    python: StrictStr
    notebooks: Annotated[Mapping[StrictStr, NotebookResult], Field(min_length=1)]
    source: StrictStr = ""

    @field_validator("date")
    @classmethod
    def _utc_time(cls, date: str) -> str:
        """The date as `DATE_FORMAT` writes it, so records sort by it."""
        try:
            datetime.datetime.strptime(date, DATE_FORMAT)
        except ValueError:
            raise PydanticCustomError(
                "utc_time",
                "field 'date' must be a UTC time such as 2026-12-05T07:45:12Z, got {date}",
                {"date": repr(date)},
            ) from None
        return date


_RECORD = TypeAdapter(Record)
# What a pydantic error type says was expected, in the words of the record's JSON.
_EXPECTED = {
    "string_type": "str",
    "int_type": "int",
    "float_type": "int or float",
    "bool_type": "bool",
    "dict_type": "an object",
    "dataclass_type": "an object",
}
_NULLABLE = {
    field.name
    for owner in (Failure, NotebookResult, Record)
    for field in dataclasses.fields(owner)
    if str(field.type).endswith("| None")
}


def _problem(error: ErrorDetails, source: str) -> str:
    """One pydantic error as '<file>[, notebook <name>]: <what is wrong>'."""
    location = tuple(error["loc"])
    where = source
    if len(location) >= 2 and location[0] == "notebooks":
        where = f"{source}, notebook {location[1]!r}"
        location = location[2:]
        if location[:1] == ("failure",) and len(location) > 1:
            location = location[1:]
    name = str(location[-1]) if location else None
    kind, given = error["type"], error.get("input")
    if kind in ("missing", "missing_argument"):
        return f"{where}: missing field {name!r}"
    if kind == "literal_error":
        return f"{where}: field {name!r} must be one of {list(KINDS)}, got {given!r}"
    if kind == "too_short":
        return f"{where}: field {name!r} holds no notebook"
    if kind in _EXPECTED:
        if name is None:
            return f"{where}: expected an object, got {type(given).__name__}"
        expected = _EXPECTED[str(kind)] + (" or null" if name in _NULLABLE else "")
        return f"{where}: field {name!r} must be {expected}, got {given!r}"
    return f"{where}: {error['msg']}"  # our own checks (date, ok and failure) word it whole


def parse_record(data: object, source: str = "record") -> Record:
    """A record from its JSON data, every field checked; an error names the file and field."""
    if not isinstance(data, Mapping):
        raise RecordError(f"{source}: expected an object, got {type(data).__name__}")
    try:
        return _RECORD.validate_python({**data, "source": source})
    except ValidationError as error:
        problems = [_problem(problem, source) for problem in error.errors()]
        raise RecordError("\n".join(dict.fromkeys(problems))) from None


def record_to_json(record: Record) -> dict[str, object]:
    """The record as its file holds it (every field, notebooks by name)."""
    return {
        "date": record.date,
        "kind": record.kind,
        "device_name": record.device_name,
        "driver_version": record.driver_version,
        "torch": record.torch,
        "transformers": record.transformers,
        "torch_tpu": record.torch_tpu,
        "python": record.python,
        "notebooks": {
            name: {
                "ok": result.ok,
                "seconds": result.seconds,
                "code_cells": result.code_cells,
                "failure": None
                if result.failure is None
                else {
                    "cell": result.failure.cell,
                    "error": result.failure.error,
                    "message": result.failure.message,
                },
            }
            for name, result in sorted(record.notebooks.items())
        },
    }


def load_records(folder: Path) -> list[Record]:
    """Every record in `folder` (its *.json files), checked; none when the folder is absent."""
    records = []
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as error:
            raise RecordError(f"{path.name}: not JSON ({error})") from error
        records.append(parse_record(data, path.name))
    return records


def record_file_name(record: Record) -> str:
    """'<kind>-<device, as a slug>-<UTC date and time>.json': no hostname, and the records of
    one machine sort by date. A device name that starts with the kind says it once
    ('emulated-tpu-on-amd-epyc-...', not 'emulated-tpu-emulated-tpu-on-...')."""
    slug = re.sub(r"[^a-z0-9]+", "-", record.device_name.lower()).strip("-")[:32].strip("-")
    stamp = record.date.replace(":", "").replace("-", "")  # 20261205T074512Z
    if slug.startswith(f"{record.kind}-"):
        return f"{slug}-{stamp}.json"
    return f"{record.kind}-{slug or 'device'}-{stamp}.json"


# ---------------------------------------------------------------------------------------------
# The page


def failure_text(failure: Failure) -> str:
    """'cell 38: RuntimeError: shapes differ', or 'before the first cell: ...'."""
    where = "before the first cell" if failure.cell is None else f"cell {failure.cell}"
    message = f": {failure.message}" if failure.message else ""
    return f"{where}: {failure.error}{message}"


def _escaped(text: str) -> str:
    """Text safe inside a Markdown table cell: punctuation that MyST reads is backslashed."""
    return re.sub(r"([\\`*_{}\[\]<>|#$~])", r"\\\1", text)


def _cell(record: Record, result: NotebookResult) -> str:
    if result.ok:
        state = "ok"
    else:
        assert result.failure is not None
        state = f"**failed**, {_escaped(failure_text(result.failure))}"
    return f"{state}; {record.date[:10]}; torch {_escaped(record.torch)}; {result.seconds:.1f} s"


def newest(records: list[Record], kind: str, notebook: str) -> Record | None:
    """The newest record of this kind that ran this notebook (a later partial run, such as
    `make verify NB=...`, replaces only the notebooks it ran)."""
    ran = [r for r in records if r.kind == kind and notebook in r.notebooks]
    return max(ran, key=lambda r: (r.date, r.source), default=None)


def verification_page(records: list[Record], notebooks: list[tuple[str, str]]) -> str:
    """The page "Where this book was verified": one row per notebook, one column per kind."""
    header = "| Notebook | " + " | ".join(COLUMN_TITLES[kind] for kind in KINDS) + " |"
    rows = [header, "|---" * (len(KINDS) + 1) + "|"]
    for stem, title in notebooks:
        cells = []
        for kind in KINDS:
            record = newest(records, kind, stem)
            cells.append(NOT_VERIFIED if record is None else _cell(record, record.notebooks[stem]))
        rows.append(f"| [{title}](../notebooks/{stem}.ipynb) | " + " | ".join(cells) + " |")
    missing = [COLUMN_TITLES[k] for k in MACHINE_KINDS if not any(r.kind == k for r in records)]
    unrecorded = ""
    if missing:
        kinds = " or ".join([", ".join(missing[:-1]), missing[-1]] if missing[:-1] else missing)
        columns = "its column says" if len(missing) == 1 else "their columns say"
        unrecorded = f'No {kinds} machine has a record yet: {columns} "{NOT_VERIFIED}".\n\n'
    machines = [
        f"- `{r.source}`: {COLUMN_TITLES[r.kind]}, {_escaped(r.device_name)}"
        + ("" if r.driver_version is None else f", driver {_escaped(r.driver_version)}")
        + f"; torch {_escaped(r.torch)}"
        + ("" if r.torch_tpu is None else f", torch-tpu {_escaped(r.torch_tpu)}")
        + f", transformers {_escaped(r.transformers or 'not installed')}"
        + f", Python {_escaped(r.python)}; {r.date[:10]}; "
        + f"{sum(n.ok for n in r.notebooks.values())} of {len(r.notebooks)} notebooks ok"
        for r in sorted(records, key=lambda r: (r.date, r.source), reverse=True)
    ]
    return f"""% Generated by `python scripts/verify.py page` from the records in verification/:
% edit the script or add a record, not this file (tests/test_verify.py checks it).

# Where this book was verified

Continuous integration runs every notebook on a CPU and compares its outputs with the stored
ones. This page says where each notebook was also executed in full, every cell and so every
`assert` in it passing, on each kind of machine: a CPU, a CUDA GPU and a Cloud TPU, and on the
book's [emulated TPU](reference/emulated-tpu.md), a CPU that plays TorchTPU 0.2.0's documented
rules (CI runs every notebook on it at every change; its column shows a recorded run, and its
seconds are a CPU's, not a TPU's). Each cell comes from the newest record of that kind that ran
the notebook: its result (a failure names the first cell that raised and its error), the date
(UTC), the torch version and the seconds the notebook took from kernel start to shutdown.

{chr(10).join(rows)}

## Record a machine

{unrecorded}A cell is filled only from a record. To record one, run `make verify` on such a
machine with the book installed ([Set up your machine](setup.md) says how, for CUDA and for a
Cloud TPU VM), then commit the new file in `verification/` and this page, which `make verify`
rewrites. `make verify NB=notebooks/NN_slug.ipynb` records one notebook, and `make verify
EMULATED=1` a run on the emulated TPU (any machine). Each record holds the machine's device
name, driver and package versions, and each notebook's result.

## The records

{chr(10).join(machines) if machines else "None yet."}
"""


def stamp(records: list[Record], notebook: str) -> str:
    """One line of plain text for the top of a chapter page: when and with which torch it was
    last run in full, on each kind of machine that has a record of it."""
    runs = []
    for kind in KINDS:
        record = newest(records, kind, notebook)
        if record is not None:
            result = "ran in full" if record.notebooks[notebook].ok else "failed"
            runs.append(
                f"{result} on {KIND_PHRASES[kind]} on {record.date[:10]} with torch {record.torch}"
            )
    if not runs:
        return "Not yet run in full outside CI."
    missing = [
        KIND_PHRASES[kind] for kind in MACHINE_KINDS if newest(records, kind, notebook) is None
    ]
    tail = f"; not yet on {' or '.join(missing)}" if missing else ""
    return f"Last verified: {'; '.join(runs)}{tail}."
