"""What each host of a TPU slice runs: torchrun behind TorchTPU's launch environment.

Taught in chapter 28 (the exact launch commands for one TPU VM and for several hosts).

TorchTPU runs one process per TPU device, and every process reads launch variables that its
PARENT must set before spawning it (`torch.tpu.distributed.set_tpu_launch_env(nnodes=,
nproc_per_node=)`; without them the first collective fails with "Check failed: client !=
nullptr"). Plain `torchrun` does not set them, so this module's subcommand does it first:

    python -m tpuready torchrun [torchrun arguments...]

reads `--nnodes` and `--nproc-per-node` with torchrun's own parser (so `--nnodes=2`, `--nnodes
2`, `--nproc_per_node`, torchrun's defaults of 1 and its `PET_NNODES`/`PET_NPROC_PER_NODE`
variables all read as torchrun reads them), calls
`tpuready.runtime.launch.prepare_launch_environment(nproc_per_node, nnodes)` in this process,
and hands every argument unchanged to `torch.distributed.run.main`, torchrun itself. Its
children inherit the launch environment on a TPU VM; on a CPU or a GPU
`prepare_launch_environment` sets nothing, so the subcommand is torchrun, unchanged. Two
torchrun forms are refused, with a message: an elastic range of hosts (`--nnodes=1:4`; a TPU
slice has a fixed number of hosts, and TorchTPU needs that number up front) and a rank count that
is not a number (`--nproc-per-node=auto`, which counts GPUs or CPU cores, never TPU devices).

`host_launch_commands` writes the command each host runs: on one host, `--standalone`; on
several, torchrun's static rendezvous (its default backend): the same coordinator on every host
(`--master-addr`, host 0's address, left as a shell variable by default) and each host's own
`--node-rank`, so host `i` runs ranks `i * R` to `i * R + R - 1`. (torchrun reads
`--node-rank` only under the static backend; under c10d it warns and numbers the hosts in the
order they join.)
`format_host_launches` prints them, one line per host.
"""

from __future__ import annotations

import re
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

from tpuready.calc.hardware import as_chip, tpu_ranks_per_host
from tpuready.runtime.launch import prepare_launch_environment
from tpuready.validate import InputError, whole_number

__all__ = [
    "DEFAULT_COORDINATOR",
    "HostLaunch",
    "HostLaunchError",
    "format_host_launches",
    "host_launch_commands",
    "parse_launch_counts",
    "run_torchrun",
]

DEFAULT_COORDINATOR = "$COORDINATOR_ADDRESS"
"""The coordinator's address as a shell variable, expanded by the shell of each host."""

# `$NAME` or `${NAME}`: a coordinator address the shell of each host fills in.
_SHELL_VARIABLE = re.compile(r"\$(?:[A-Za-z_]\w*|\{[A-Za-z_]\w*\})")
_HIGHEST_PORT = 65535
# A module torchrun's `-m` runs: `torchtitan.train`.
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*")


class HostLaunchError(InputError):
    """An argument `host_launch_commands` or `python -m tpuready torchrun` cannot use; an
    `InputError`, so a `ValueError`, naming the argument and the value."""


@dataclass(frozen=True)
class HostLaunch:
    """One host's command: `argv` as a list of words, and `shell()` as a line to paste."""

    host_index: int
    argv: tuple[str, ...]
    num_hosts: int = field(kw_only=True)
    ranks_per_host: int = field(kw_only=True)
    # Shell variables in `argv` (the coordinator's `$COORDINATOR_ADDRESS`) that `shell()` leaves
    # for the host's shell to expand; every other character is quoted.
    shell_variables: tuple[str, ...] = field(default=(), kw_only=True)

    @property
    def world_size(self) -> int:
        """Ranks of the whole job: hosts times ranks per host."""
        return self.num_hosts * self.ranks_per_host

    def shell(self) -> str:
        """The command as one shell line: each word quoted with `shlex.quote`, except that a
        word holding a shell variable of `shell_variables` is double-quoted, so the shell still
        expands the variable (`"--master-addr=$COORDINATOR_ADDRESS"`)."""
        return " ".join(_shell_word(word, self.shell_variables) for word in self.argv)


def _shell_word(word: str, variables: tuple[str, ...]) -> str:
    present = [variable for variable in variables if variable in word]
    if not present:
        return shlex.quote(word)
    pattern = "(" + "|".join(re.escape(variable) for variable in present) + ")"
    pieces = re.split(pattern, word)
    quoted = "".join(
        piece if piece in present else re.sub(r'(["\\$`])', r"\\\1", piece) for piece in pieces
    )
    return f'"{quoted}"'


def _check_text(name: str, value: object, fix: str, *, spaces: bool = False) -> str:
    """`value` if it is a non-empty string (without whitespace unless `spaces`), else an error."""
    if not isinstance(value, str) or not value or (not spaces and any(c.isspace() for c in value)):
        kind = "a non-empty string" if spaces else "a non-empty string without spaces"
        raise HostLaunchError(f"{name} must be {kind}, got {value!r}: {fix}")
    return value


def host_launch_commands(
    script: str,
    *,
    chip: str,
    num_hosts: int,
    ranks_per_host: int | None = None,
    script_args: Sequence[str] = (),
    coordinator: str = DEFAULT_COORDINATOR,
    port: int = 29500,
    python: str = "python",
    module: bool = False,
) -> list[HostLaunch]:
    """The command each of `num_hosts` hosts of a `chip` slice runs to start `script`.

    One host: `python -m tpuready torchrun --standalone --nproc-per-node=R SCRIPT ARGS`.
    Several: on host `i`, `python -m tpuready torchrun --nnodes=N --node-rank=i
    --nproc-per-node=R --master-addr=COORDINATOR --master-port=PORT SCRIPT ARGS`: torchrun's
    static rendezvous, whose store host 0 serves at the coordinator's address (by default the
    shell variable `$COORDINATOR_ADDRESS`, which each host's shell expands); host `i` runs
    global ranks `i * R` to `i * R + R - 1`.

    `ranks_per_host` (R) must be a count TorchTPU starts on one host of the chip's generation
    (`tpuready.calc.hardware.TPU_RANKS_PER_HOST`: v4/v5p 1, 2, 4, 8; v5e/v6e 1, 4, 8; v7 2, 4,
    8; any other count fails in TorchTPU with "No TPU topology found for count: N"). It
    defaults to the largest, 8, a rank per device of a full host: on v5e and v6e one per chip of
    an 8-chip host (the hardware table's notes count 8 chips per v5e and v6e host); on v7 two
    per chip (`Chip.devices_per_chip` is 2, one device per TensorCore), so 8 ranks are 4 chips.
    The table states no chips per host for v4 and v5p: pass the count of devices your host
    shows there. `chip` is a TPU name ('v6e', 'TPU v5e', ...); an unknown name raises
    `UnknownChipError`, a GPU `HostLaunchError`.

    With `module=True`, `script` is a module that every rank runs as `python -m SCRIPT`
    (torchrun's `-m`, written before it: `... -m torchtitan.train ARGS`), and must be a
    dotted module name.
    """
    resolved = as_chip(chip, error=HostLaunchError)
    allowed = tpu_ranks_per_host(resolved)
    if allowed is None:
        raise HostLaunchError(
            f"chip {resolved.name!r} is not a TPU with TorchTPU rank counts: "
            "host_launch_commands writes TorchTPU launches; on GPUs run torchrun with "
            "--nproc-per-node set to the GPUs of a host"
        )
    num_hosts = whole_number(
        "num_hosts", num_hosts, fix="count the hosts (TPU VMs) of the slice", error=HostLaunchError
    )
    allowed_text = ", ".join(map(str, allowed))
    if ranks_per_host is None:
        ranks_per_host = max(allowed)
    ranks_per_host = whole_number(
        "ranks_per_host",
        ranks_per_host,
        fix=f"a {resolved.name} host runs {allowed_text} ranks",
        error=HostLaunchError,
    )
    if ranks_per_host not in allowed:
        raise HostLaunchError(
            f"ranks_per_host must be one of {allowed_text} on a {resolved.name} host, got "
            f"{ranks_per_host}: TorchTPU would fail with 'No TPU topology found for count: "
            f"{ranks_per_host}'"
        )
    port = whole_number(
        "port",
        port,
        fix="pass a TCP port from 1 to 65535 (torchrun's is 29500)",
        error=HostLaunchError,
    )
    if port > _HIGHEST_PORT:
        raise HostLaunchError(f"port must be at most {_HIGHEST_PORT}, got {port}: pass a TCP port")
    if not isinstance(module, bool):
        raise HostLaunchError(f"module must be True or False, got {module!r}")
    if module and (not isinstance(script, str) or not _MODULE_NAME.fullmatch(script)):
        raise HostLaunchError(
            f"script must be a dotted module name with module=True, got {script!r}: "
            "pass the module each rank runs, such as 'torchtitan.train'"
        )
    script = _check_text("script", script, "pass the path of the training script", spaces=True)
    if isinstance(script_args, str | bytes) or not isinstance(script_args, Sequence):
        raise HostLaunchError(
            f"script_args must be a list of strings, got {script_args!r}: pass "
            "['--steps', '100'], not one string"
        )
    if not all(isinstance(argument, str) for argument in script_args):
        raise HostLaunchError(f"script_args must hold strings only, got {list(script_args)!r}")
    coordinator = _check_text(
        "coordinator", coordinator, "pass host 0's address or a shell variable like $NAME"
    )
    is_variable = _SHELL_VARIABLE.fullmatch(coordinator) is not None
    if "$" in coordinator and not is_variable:
        raise HostLaunchError(
            f"coordinator must be an address or one shell variable ($NAME or ${{NAME}}), got "
            f"{coordinator!r}"
        )
    python = _check_text(
        "python", python, "pass the interpreter each host runs, e.g. 'python3'", spaces=True
    )

    prefix = (python, "-m", "tpuready", "torchrun")
    tail = ("-m", script, *script_args) if module else (script, *script_args)
    rank_flag = f"--nproc-per-node={ranks_per_host}"
    if num_hosts == 1:
        return [
            HostLaunch(
                0,
                (*prefix, "--standalone", rank_flag, *tail),
                num_hosts=1,
                ranks_per_host=ranks_per_host,
            )
        ]
    return [
        HostLaunch(
            host,
            (
                *prefix,
                f"--nnodes={num_hosts}",
                f"--node-rank={host}",
                rank_flag,
                f"--master-addr={coordinator}",
                f"--master-port={port}",
                *tail,
            ),
            num_hosts=num_hosts,
            ranks_per_host=ranks_per_host,
            shell_variables=(coordinator,) if is_variable else (),
        )
        for host in range(num_hosts)
    ]


def format_host_launches(launches: Sequence[HostLaunch]) -> str:
    """One line per host, `host 0: python -m tpuready torchrun ...`, each host's full command
    (no trailing newline)."""
    if isinstance(launches, str) or not isinstance(launches, Sequence) or not launches:
        raise HostLaunchError(
            f"launches must be a non-empty list of HostLaunch, got {launches!r}: pass what "
            "host_launch_commands returns"
        )
    if not all(isinstance(launch, HostLaunch) for launch in launches):
        raise HostLaunchError(
            "launches must hold HostLaunch objects only: pass what host_launch_commands returns"
        )
    return "\n".join(f"host {launch.host_index}: {launch.shell()}" for launch in launches)


def _nnodes(value: str) -> int:
    pieces = value.split(":")
    try:
        bounds = [int(piece) for piece in pieces]
    except ValueError:
        bounds = []
    if len(bounds) not in (1, 2) or min(bounds) < 1:
        raise HostLaunchError(f"--nnodes must be a number of hosts, 1 or more, got {value!r}")
    if len(bounds) == 2 and bounds[0] != bounds[1]:
        raise HostLaunchError(
            f"--nnodes={value} is an elastic range of hosts; a TPU slice runs a fixed number "
            f"and TorchTPU's launch environment needs it: pass --nnodes={bounds[1]} (or the "
            "number of hosts the slice has)"
        )
    return bounds[0]


def _nproc_per_node(value: str) -> int:
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise HostLaunchError(
            f"--nproc-per-node must be a number of ranks, 1 or more, got {value!r}: "
            "TorchTPU's launch environment needs the count itself (a TPU host runs 1, 2, 4 or "
            "8 by generation; 'auto' and 'gpu' count GPUs or CPU cores, not TPU devices)"
        )
    return count


def parse_launch_counts(args: Sequence[str]) -> tuple[int, int]:
    """`(nproc_per_node, nnodes)` as torchrun reads them from `args` (its own parser, so its
    spellings, defaults and `PET_*` variables); `HostLaunchError` for an elastic range of hosts
    or a rank count that is not a number. torchrun's parser exits (status 2) on arguments it
    does not take, and prints its help (status 0) for `--help`, as torchrun does."""
    from torch.distributed.run import parse_args

    parsed = parse_args(list(args))
    return _nproc_per_node(parsed.nproc_per_node), _nnodes(parsed.nnodes)


def run_torchrun(args: Sequence[str]) -> int:
    """`python -m tpuready torchrun ARGS`: set TorchTPU's launch environment for the counts
    in `args` in this process, then run torchrun (`torch.distributed.run.main`) with `args`
    unchanged. Returns 0 once torchrun returns (a failed rank raises torchrun's own
    `ChildFailedError`, as torchrun does), 2 when the counts are refused (the message on
    stderr)."""
    import torch.distributed.run as torchrun

    args = list(args)
    try:
        nproc_per_node, nnodes = parse_launch_counts(args)
        prepare_launch_environment(nproc_per_node, nnodes)
    except (InputError, RuntimeError) as error:  # RuntimeError: TorchTPU refuses the count
        print(f"tpuready torchrun: error: {error}", file=sys.stderr)
        return 2
    torchrun.main(args)
    return 0
