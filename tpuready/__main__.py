"""Command line of the companion toolkit: `python -m tpuready SUBCOMMAND ...`.

Subcommands:
  audit-source PATH...   list the lines that tie code to CUDA (see `tpuready.audit`);
                         with --fix, rewrite what can be ported safely (`tpuready.audit.fix`), with
                         --diff, show that rewrite as a unified diff (the fixer's exit status)
  torchrun [ARGS...]     torchrun with TorchTPU's launch environment set first: reads
                         --nnodes and --nproc-per-node, calls
                         `tpuready.runtime.launch.prepare_launch_environment` (nothing on a CPU
                         or a GPU), then runs `torch.distributed.run.main(ARGS)` with every
                         argument unchanged (see `tpuready.runtime.host_launch`); e.g.
                         `python -m tpuready torchrun --standalone --nproc-per-node=8 train.py`.
                         Exit status: torchrun's (0 when it returns, 1 with its
                         `ChildFailedError` when a rank fails), 2 for an elastic
                         --nnodes=MIN:MAX or a --nproc-per-node that is not a number.

Exit status of `audit-source`: 0 when clean, 1 when there are findings (at or above
`--severity`; a file or notebook cell that does not parse counts as a `syntax-error` finding)
or a file too large to audit (the summary counts it, whatever `--severity`), 2 on bad
arguments or a path that is missing or cannot be read (the message names it; every readable
file, also beside an unreadable folder, is still reported, and `--format json` always prints
a JSON list), 3 when the audit itself failed on a file (one line names the file
and says "internal error"). With no subcommand, or an unknown one, the usage goes to stderr and
the status is 2.
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
EXIT_INTERNAL_ERROR = 3


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tpuready",
        description="Companion toolkit of the book TPU-ready PyTorch.",
    )
    subcommands = parser.add_subparsers(dest="command", metavar="SUBCOMMAND", required=True)
    rules = "\n".join(f"  {rule.id} ({rule.severity})" for rule in audit.RULE_TABLE)
    audit_parser = subcommands.add_parser(
        "audit-source",
        help="list the lines that tie PyTorch code to CUDA, with portable replacements",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Scan Python files, notebooks and folders (recursively; .venv, .git, _build,\n"
            "__pycache__ and hidden folders skipped) for CUDA-only code. [tool.tpuready] in\n"
            "the project's pyproject.toml may list rules to `skip` and paths to `exclude`.\n"
            "Exit status: 0 clean, 1 findings or a file too large to audit, 2 bad\n"
            "arguments or unreadable paths (the rest is still reported),\n"
            "3 internal error.\n\nRules:\n" + rules
        ),
    )
    audit_parser.add_argument("paths", nargs="+", metavar="PATH", help=".py, .ipynb or folder")
    audit_parser.add_argument(
        "--format",
        choices=("text", "json", "github"),
        default=None,
        dest="output_format",
        help="text (default): findings grouped by severity and a summary; json: a list of "
        "objects; github: GitHub Actions annotations (::warning file=...,line=...::...)",
    )
    audit_parser.add_argument(
        "--severity",
        choices=audit.SEVERITIES,
        default=None,
        help="report findings of this severity and above (default: note, everything)",
    )
    audit_parser.add_argument(
        "--no-config", action="store_true", help="ignore [tool.tpuready] in pyproject.toml"
    )
    rewrite = audit_parser.add_mutually_exclusive_group()
    rewrite.add_argument(
        "--fix", action="store_true", help="rewrite what can be ported safely, in place"
    )
    rewrite.add_argument(
        "--diff", action="store_true", help="show what --fix would change, as a unified diff"
    )
    torchrun_parser = subcommands.add_parser(
        "torchrun",
        help="torchrun with TorchTPU's launch environment set first (every argument is torchrun's)",
        add_help=False,
    )
    torchrun_parser.add_argument("torchrun_args", nargs=argparse.REMAINDER, metavar="ARGS")
    return parser


def run_audit_source(
    paths: Sequence[str],
    output_format: str,
    stdout: TextIO,
    stderr: TextIO,
    *,
    severity: str = audit.SEVERITIES[-1],
    use_config: bool = True,
) -> int:
    """Audit `paths`, write the report to `stdout` and errors to `stderr`; return the status."""
    try:
        result = audit.run_audit(paths, use_config=use_config)
    except audit.AuditInputError as error:
        print(f"tpuready audit-source: error: {error}", file=stderr)
        if output_format == "json":
            stdout.write(audit.format_json([]))  # a JSON reader always gets JSON
        return EXIT_USAGE
    shown = audit.SEVERITIES[: audit.SEVERITIES.index(severity) + 1]
    findings = [finding for finding in result.findings if finding.severity in shown]
    for message in result.errors:
        print(f"tpuready audit-source: error: {message}", file=stderr)
    for message in result.internal_errors:
        print(f"tpuready audit-source: {message}", file=stderr)
    if output_format == "json":
        stdout.write(audit.format_json(findings))
    elif output_format == "github":
        stdout.write(audit.format_github(findings))
    else:
        stdout.write(
            audit.format_text(
                findings, files_scanned=result.files_scanned, files_skipped=result.files_skipped
            )
        )
    if result.internal_errors:
        return EXIT_INTERNAL_ERROR
    if result.errors:
        return EXIT_USAGE
    # A file too large to audit is not a clean file, whatever severities are shown.
    return EXIT_FINDINGS if findings or result.files_skipped else EXIT_CLEAN


def _run_fix(paths: Sequence[str], *, write: bool, use_config: bool) -> int:
    from tpuready.audit.fix import run_fix  # imported here: libcst is needed only to rewrite

    return run_fix(paths, write=write, stdout=sys.stdout, stderr=sys.stderr, use_config=use_config)


def main(argv: Sequence[str] | None = None) -> int:
    """Parse `argv` (default: the process arguments), run the subcommand, return its status."""
    arguments_given = list(sys.argv[1:] if argv is None else argv)
    if arguments_given[:1] == ["torchrun"]:
        # Every argument after the subcommand is torchrun's, --help included: none is parsed here.
        from tpuready.runtime.host_launch import run_torchrun

        try:
            return run_torchrun(arguments_given[1:])
        except SystemExit as exit_request:  # torchrun's parser: 2 on bad usage, 0 after --help
            return exit_request.code if isinstance(exit_request.code, int) else EXIT_USAGE
    parser = _build_parser()
    try:
        arguments = parser.parse_args(argv)
    except SystemExit as exit_request:  # argparse exits 2 on bad usage, 0 after --help
        return exit_request.code if isinstance(exit_request.code, int) else EXIT_USAGE
    if arguments.command == "audit-source":
        if arguments.fix or arguments.diff:
            report_options = [
                option
                for option, value in (
                    ("--format", arguments.output_format),
                    ("--severity", arguments.severity),
                )
                if value is not None
            ]
            if report_options:
                parser.print_usage(sys.stderr)
                print(
                    f"tpuready audit-source: error: {' and '.join(report_options)} shape the "
                    "audit's report; --fix and --diff print what they change and, on stderr, "
                    "every must-change finding left: drop the option, or audit after the fix",
                    file=sys.stderr,
                )
                return EXIT_USAGE
            return _run_fix(
                arguments.paths, write=arguments.fix, use_config=not arguments.no_config
            )
        try:
            return run_audit_source(
                arguments.paths,
                arguments.output_format or "text",
                sys.stdout,
                sys.stderr,
                severity=arguments.severity or audit.SEVERITIES[-1],
                use_config=not arguments.no_config,
            )
        except Exception as error:
            print(
                f"tpuready audit-source: internal error: {type(error).__name__}: {error}",
                file=sys.stderr,
            )
            return EXIT_INTERNAL_ERROR
    parser.print_usage(sys.stderr)  # unreachable while every subcommand is handled above
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
