"""Fill a wheelhouse with every pinned package for one platform, so a room installs offline.

Run it where there is a network, once per platform in the room, then bring the folder:

    python3 fill_wheelhouse.py --platform linux-x86_64 --python 3.11.9 --dest wheelhouse

It calls `pip download` with `--no-deps` (requirements.txt is already the whole frozen
environment) and `--only-binary=:all:` (a wheel for the named platform, never a source
package to build in the room). torch comes from PyTorch's CPU index on Linux, where the
default index serves the CUDA build and its NVIDIA libraries; macOS wheels are CPU-only.
The bundle's `make venv` then installs from the folder with `pip --no-index`.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# pip's platform tags per platform, newest first: pip accepts a wheel tagged with any of them.
PLATFORM_TAGS = {
    "linux-x86_64": ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"],
    "linux-aarch64": [
        "manylinux_2_28_aarch64",
        "manylinux_2_17_aarch64",
        "manylinux2014_aarch64",
    ],
    "macos-arm64": ["macosx_14_0_arm64", "macosx_12_0_arm64", "macosx_11_0_arm64"],
}
PLATFORM_TAGS_ANY = ["any"]  # pure-Python wheels
# A whole release, as 3.11.9: pins such as soupsieve need 3.11.5 or newer, so pip must know
# the patch release to pick the wheels that release can install.
_PYTHON = re.compile(r"^3\.(1[1-9])\.\d+$")


def download_commands(
    platform: str, python: str, requirements: Path, destination: Path
) -> list[list[str]]:
    """The `pip download` commands that fill `destination`: torch first, then the other pins."""
    if platform not in PLATFORM_TAGS:
        raise ValueError(
            f"unknown platform {platform!r}: choose one of {', '.join(sorted(PLATFORM_TAGS))}"
        )
    if not _PYTHON.match(python):
        raise ValueError(
            f"--python must be the learners' whole Python release, as 3.11.9 (3.11.5 or newer; "
            f"`python3 --version` prints it), got {python!r}"
        )
    common = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    common += ["--implementation", "cp", "--python-version", python, "--dest", str(destination)]
    for tag in PLATFORM_TAGS[platform] + PLATFORM_TAGS_ANY:
        common += ["--platform", tag]
    torch_pin = _torch_pin(requirements)
    torch_index = ["--index-url", TORCH_CPU_INDEX] if platform.startswith("linux") else []
    return [
        [*common, *torch_index, torch_pin],
        [*common, "--requirement", str(requirements)],
    ]


def _torch_pin(requirements: Path) -> str:
    for line in requirements.read_text().splitlines():
        if line.startswith("torch=="):
            return line.strip()
    raise ValueError(f"{requirements} pins no torch (a line 'torch==VERSION')")


def main(argv: Sequence[str] | None = None) -> int:
    """Download every pinned wheel for `--platform` and `--python` into `--dest`."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--platform", required=True, choices=sorted(PLATFORM_TAGS))
    parser.add_argument("--python", required=True, help="the learners' Python, as 3.11.9")
    parser.add_argument("--dest", type=Path, default=Path("wheelhouse"))
    parser.add_argument(
        "--requirements", type=Path, default=Path(__file__).with_name("requirements.txt")
    )
    arguments = parser.parse_args(argv)
    torch_command, rest_command = download_commands(
        arguments.platform, arguments.python, arguments.requirements, arguments.dest
    )
    # The torch line goes to its own download (its own index); the others read a copy
    # without it, so the default index is never asked for the CUDA build.
    with tempfile.TemporaryDirectory() as scratch:
        others = Path(scratch) / "requirements-without-torch.txt"
        lines = arguments.requirements.read_text().splitlines()
        others.write_text("\n".join(line for line in lines if not line.startswith("torch==")))
        rest_command[rest_command.index(str(arguments.requirements))] = str(others)
        for command in (torch_command, rest_command):
            print(" ".join(command[1:]), flush=True)
            if subprocess.run(command, check=False).returncode != 0:
                print(f"pip download failed: {' '.join(command[1:])}", file=sys.stderr)
                return 1
    count = len(list(arguments.dest.glob("*.whl")))
    print(f"{count} wheels in {arguments.dest} for {arguments.platform}, Python {arguments.python}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
