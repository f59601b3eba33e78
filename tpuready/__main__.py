"""Command line of the companion toolkit: `python -m tpuready SUBCOMMAND ...`.

Subcommands:
  audit-source PATH...   list the lines that tie code to CUDA (see `tpuready.audit`)

Exit status of `audit-source`: 0 when clean, 1 when there are findings (a file or notebook
cell that does not parse counts as a `syntax-error` finding), 2 on bad arguments or a path
that is missing or cannot be read (the message names it; readable files are still reported).
With no subcommand, or an unknown one, the usage goes to stderr and the status is 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TextIO

from tpuready import audit

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tpuready",
        description="Companion toolkit of the book TPU-ready PyTorch.",
    )
    subcommands = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    audit_parser = subcommands.add_parser(
        "audit-source",
        help="list the lines that tie PyTorch code to CUDA, with portable replacements",
        description=(
            "Scan Python files, notebooks and folders (recursively; .venv, .git, _build, "
            "__pycache__ and hidden folders skipped) for CUDA-only code. Exit status: 0 clean, "
            "1 findings, 2 bad arguments or unreadable paths."
        ),
    )
    audit_parser.add_argument("paths", nargs="+", metavar="PATH", help=".py, .ipynb or folder")
    audit_parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        dest="output_format",
        help="text (default): one line per finding and a summary; json: a list of objects",
    )
    return parser


def run_audit_source(
    paths: Sequence[str], output_format: str, stdout: TextIO, stderr: TextIO
) -> int:
    """Audit `paths`, write the report to `stdout` and errors to `stderr`; return the status."""
    try:
        files = audit.find_source_files(paths)
    except audit.AuditInputError as error:
        print(f"tpuready audit-source: error: {error}", file=stderr)
        return EXIT_USAGE
    findings: list[audit.Finding] = []
    unreadable = 0
    for file in files:
        try:
            findings += audit.audit_file(file)
        except audit.AuditInputError as error:
            print(f"tpuready audit-source: error: {error}", file=stderr)
            unreadable += 1
    if output_format == "json":
        stdout.write(audit.format_json(findings))
    else:
        stdout.write(audit.format_text(findings, files_scanned=len(files) - unreadable))
    if unreadable:
        return EXIT_USAGE
    return EXIT_FINDINGS if findings else EXIT_CLEAN


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the process arguments), run the subcommand, return its status."""
    parser = _build_parser()
    try:
        arguments = parser.parse_args(argv)
    except SystemExit as exit_request:  # argparse exits 2 on bad usage, 0 after --help
        return exit_request.code if isinstance(exit_request.code, int) else EXIT_USAGE
    if arguments.command == "audit-source":
        return run_audit_source(arguments.paths, arguments.output_format, sys.stdout, sys.stderr)
    parser.print_usage(sys.stderr)  # unreachable while every subcommand is handled above
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
