"""A network guard: refuse every connection that leaves this machine.

The book promises notebooks that run offline (models from configs, tokenizers trained
in code). The test suite runs every notebook under this guard, so a cell that reaches
for the internet fails loudly instead of passing on a machine that happens to be online.
Loopback (127.0.0.0/8, ::1, localhost) and Unix sockets stay allowed: Jupyter kernels
and `torch.distributed` over gloo talk through them.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable
from typing import Any

__all__ = [
    "ENVIRONMENT_SWITCH",
    "NetworkRefusedError",
    "install_network_guard",
    "is_loopback_host",
    "network_guard_installed",
]

# Set this variable to "1" and the sitecustomize in scripts/offline_site installs the
# guard in every Python process started with that folder on PYTHONPATH.
ENVIRONMENT_SWITCH = "TPUREADY_OFFLINE"

_ORIGINALS: dict[str, Callable[..., Any]] = {}


class NetworkRefusedError(ConnectionRefusedError):
    """Raised when code under the guard tries to reach a host off this machine."""


def is_loopback_host(host: object) -> bool:
    """True for names and addresses that stay on this machine: localhost, 127.0.0.0/8, ::1."""
    if isinstance(host, bytes):
        host = host.decode("ascii", errors="replace")
    if not isinstance(host, str):
        return False
    name = host.strip("[]").split("%")[0].lower()
    if name in {"localhost", "localhost.localdomain", "ip6-localhost"}:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _refuse(host: object, port: object) -> NetworkRefusedError:
    return NetworkRefusedError(
        f"network access refused by tpuready.offline: {host!r} port {port!r} is not on this "
        f"machine. The book runs offline: build models from configs, train tokenizers in "
        f"code, and ship small data in the repository ({ENVIRONMENT_SWITCH}=1 is set)."
    )


def _guarded_connect(name: str) -> Callable[..., Any]:
    original = getattr(socket.socket, name)

    def connect(self: socket.socket, address: Any) -> Any:
        if self.family in (socket.AF_INET, socket.AF_INET6):
            host, port = address[0], address[1]
            if not is_loopback_host(host):
                raise _refuse(host, port)
        return original(self, address)

    connect.__name__ = name
    return connect


def _guarded_getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
    # None and "" mean "this machine" (servers binding); names must be loopback.
    if host not in (None, "", b"") and not is_loopback_host(host):
        raise _refuse(host, port)
    return _ORIGINALS["getaddrinfo"](host, port, *args, **kwargs)


def install_network_guard() -> None:
    """Patch `socket` in this process so that only loopback connections go through.

    Calling it twice is harmless. Child processes started with `spawn` install it
    again through the sitecustomize when the environment switch is set.
    """
    if network_guard_installed():
        return
    _ORIGINALS["connect"] = socket.socket.connect
    _ORIGINALS["connect_ex"] = socket.socket.connect_ex
    _ORIGINALS["getaddrinfo"] = socket.getaddrinfo
    socket.socket.connect = _guarded_connect("connect")  # type: ignore[method-assign]
    socket.socket.connect_ex = _guarded_connect("connect_ex")  # type: ignore[method-assign]
    socket.getaddrinfo = _guarded_getaddrinfo
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


def network_guard_installed() -> bool:
    """True once `install_network_guard` has patched this process."""
    return bool(_ORIGINALS)
