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

from tpuready.emulator.host import ENVIRONMENT_VARIABLE, parse_host

REPORT_VARIABLE = "TPUREADY_EMULATE_TPU_REPORT"


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the command line, install the emulator, run the script as `__main__`."""
    parser = argparse.ArgumentParser(prog="python -m tpuready.emulator", description=__doc__)
    parser.add_argument(
        "--host",
        default=os.environ.get(ENVIRONMENT_VARIABLE, "").strip() or "1",
        help="the host to play, as TPUREADY_EMULATE_TPU names it (default: 1, a v6e-8 host)",
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
    if not os.path.isfile(options.script):
        parser.error(f"no such script: {options.script}")
    os.environ[ENVIRONMENT_VARIABLE] = options.host
    if options.report:
        os.environ[REPORT_VARIABLE] = options.report
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # read when torch is first imported
    import torch

    from tpuready import emulator

    if torch._C._get_privateuse1_backend_name() != "privateuseone":
        parser.error("torch was imported with another backend first: start a fresh Python")
    emulator._install(host)
    sys.argv = [options.script, *options.arguments]
    sys.path.insert(0, os.path.dirname(os.path.abspath(options.script)))
    runpy.run_path(options.script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
