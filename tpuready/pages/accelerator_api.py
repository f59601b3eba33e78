"""The CUDA-to-accelerator reference table, rendered from `tpuready.accelerator_api`."""

from __future__ import annotations

from tpuready.accelerator_api import CUDA_TO_ACCELERATOR
from tpuready.pages import markdown

__all__ = ["markdown_table"]


def _sentence(note: str) -> str:
    """A note as a sentence: a plain first word capitalised (never a name such as
    `torch.cuda.amp`), and a full stop."""
    first_word = note.split(" ", 1)[0]
    if first_word.isalpha() and first_word.islower():
        note = note[0].upper() + note[1:]
    return note + "."


def markdown_table() -> str:
    """The table as Markdown: each CUDA-only call with its portable spelling and what
    `torch.tpu.<same name>` is in TorchTPU 0.2.0, then the notes, numbered.

    Two columns, not four, so that the table fits the book's text column at 1280 px: the
    widest cell is one code span, and the notes wrap as prose under the table."""
    note_numbers: dict[str, int] = {}
    for entry in CUDA_TO_ACCELERATOR:
        if entry.note:
            note_numbers.setdefault(entry.note, len(note_numbers) + 1)
    rows = []
    for entry in CUDA_TO_ACCELERATOR:
        marker = f" (note\N{NO-BREAK SPACE}{note_numbers[entry.note]})" if entry.note else ""
        rows.append(
            (f"`{entry.cuda_call}` → `{entry.replacement}`{marker}", entry.torch_tpu_status)
        )
    header = ("CUDA-only call → portable call", "The same call under `torch.tpu` in TorchTPU 0.2.0")
    lines = [markdown.table(header, rows), "", "Notes:", ""]
    lines += [f"{number}. {_sentence(note)}" for note, number in note_numbers.items()]
    return "\n".join(lines)
