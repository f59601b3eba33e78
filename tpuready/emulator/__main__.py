"""`python -m tpuready.emulator script.py [arguments]`: run a script on the emulated TPU.

The same as `TPUREADY_EMULATE_TPU=1 python script.py`, and it also works where another `tpu`
backend is installed (on a TPU VM, TorchTPU): this process turns PyTorch's backend autoload
off, so that `import torch` loads none, and installs the emulator itself. Processes the script
spawns load backends as usual (TorchTPU on a TPU VM): rehearse multi-process scripts with the
variable on a machine without TorchTPU.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
from collections.abc import Sequence

from tpuready.emulator.findings import REPORT_VARIABLE
from tpuready.emulator.host import ENVIRONMENT_VARIABLE, parse_host

AUTOLOAD_VARIABLE = "TORCH_DEVICE_BACKEND_AUTOLOAD"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, install the emulator, run the script as `__main__`."""
    parser = argparse.ArgumentParser(prog="python -m tpuready.emulator", description=__doc__)
    from_environment = os.environ.get(ENVIRONMENT_VARIABLE, "").strip()
    try:
        names_a_host = parse_host(from_environment) is not None
    except ValueError:
        names_a_host = True  # a bad value: the --host check below names it
    parser.add_argument(
        "--host",
        # The variable's host when it names one; an off value (0) does not stop the command.
        default=from_environment if names_a_host else "1",
        help="the host to play, as TPUREADY_EMULATE_TPU names it (default: the variable's "
        "host, else 1, a v6e-8 host)",
    )
    parser.add_argument(
        "--report", help="also write the report as JSON to this path (or 'off': no report)"
    )
    parser.add_argument("script", help="the Python file to run")
    parser.add_argument("arguments", nargs=argparse.REMAINDER, help="the script's arguments")
    options = parser.parse_args(argv)
    try:
        host = parse_host(options.host)
    except ValueError as error:
        parser.error(str(error))
    if host is None:
        parser.error(f"--host {options.host!r} switches the emulator off: name a host, e.g. 1")
    if options.report and not options.report.lower().endswith(".json") and options.report != "off":
        parser.error(f"--report {options.report!r}: name a .json file, or 'off' for no report")
    if not os.path.isfile(options.script):
        parser.error(f"no such script: {options.script}")
    os.environ[ENVIRONMENT_VARIABLE] = options.host
    if options.report:
        os.environ[REPORT_VARIABLE] = options.report
    # Autoload off for this process only (read when torch is first imported), so that it loads
    # no other backend; the script's own workers inherit the variable as it was and load as usual.
    autoload = os.environ.get(AUTOLOAD_VARIABLE)
    os.environ[AUTOLOAD_VARIABLE] = "0"
    import torch

    if autoload is None:
        del os.environ[AUTOLOAD_VARIABLE]
    else:
        os.environ[AUTOLOAD_VARIABLE] = autoload

    from tpuready import emulator

    if torch._C._get_privateuse1_backend_name() != "privateuseone":
        parser.error("torch was imported with another backend first: start a fresh Python")
    emulator.install_host(host)
    sys.argv = [options.script, *options.arguments]
    sys.path.insert(0, os.path.dirname(os.path.abspath(options.script)))
    runpy.run_path(options.script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
