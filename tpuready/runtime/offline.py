"""A network guard: keep every notebook's traffic on this machine, and say so when it tries not to.

The book promises notebooks that run offline (models from configs, tokenizers trained
in code). The tests run every notebook under two layers of protection, because neither
one alone is enough:

1. `scripts/no_network CMD` runs CMD in a Linux network namespace whose only interface is
   loopback. Nothing inside can send a packet off the machine: not Python code, not a child
   started with `python -I` or `python -S` (which skip the sitecustomize that installs layer
   2), not native code (a C library's own `connect`, glibc's DNS resolver, `ctypes`, a raw
   packet socket). It sets `TPUREADY_NETWORK_NAMESPACE=1` inside. Where the machine allows no
   namespace (macOS, a container without the privilege) it runs CMD as it is, sets
   `TPUREADY_NETWORK_NAMESPACE=0`, says so in one line on stderr, and only layer 2 holds.
2. This module patches Python's `socket` in each process where it is installed (by
   `scripts/offline_site/sitecustomize.py` when `TPUREADY_OFFLINE=1`): `connect`,
   `connect_ex`, `sendto` and `sendmsg` towards an address off this machine, and name
   lookups (`getaddrinfo`, `gethostbyname`, `gethostbyname_ex`, `gethostbyaddr`,
   `getnameinfo`) of names off it, raise `NetworkRefusedError` with a message that says
   what to do instead. It patches `socket.socket` and replaces `_socket.socket` by a
   guarded subclass, so code that reaches for the C module directly is refused too.
   Inside the namespace the same calls would fail anyway, with a bare "Network is
   unreachable" or a name-resolution error; the guard's message is the readable one.

What stays allowed: loopback (`localhost`, 127.0.0.0/8, `::1`, the IPv4-mapped
`::ffff:127.0.0.1`), the unspecified addresses `0.0.0.0` and `::` (which reach this machine),
and Unix sockets. Jupyter kernels (ZeroMQ over 127.0.0.1) and `torch.distributed` over gloo
talk through them.

What layer 2 cannot see, and why layer 1 exists: processes without the sitecustomize
(`python -I`, `python -S`, programs that are not Python), native code that calls the C
library's socket functions itself, and any Python code that digs out the original C methods.
What layer 1 cannot see: a name lookup that glibc hands to a resolver daemon over a Unix
socket (nscd, systemd-resolved through nss-resolve) may still be answered from outside;
no connection can follow it, and layer 2 refuses the lookup first in Python code.
"""

from __future__ import annotations

import _socket
import ipaddress
import os
import socket
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "ENVIRONMENT_SWITCH",
    "NAMESPACE_VARIABLE",
    "GuardedSocket",
    "NetworkRefusedError",
    "environment_for_another_python",
    "getaddrinfo",
    "gethostbyaddr",
    "gethostbyname",
    "gethostbyname_ex",
    "getnameinfo",
    "install_network_guard",
    "is_local",
    "is_loopback_host",
    "network_guard_installed",
]

# Set this variable to "1" and the sitecustomize in scripts/offline_site installs the
# guard in every Python process started with that folder on PYTHONPATH.
ENVIRONMENT_SWITCH = "TPUREADY_OFFLINE"
# scripts/no_network sets this to "1" inside its network namespace, "0" where it found none.
NAMESPACE_VARIABLE = "TPUREADY_NETWORK_NAMESPACE"

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
_INET_FAMILIES = (socket.AF_INET, socket.AF_INET6)
# The C socket type, whatever `_socket.socket` names once the guard is installed.
_C_SOCKET: type[Any] = socket.SocketType
_LOOKUPS = ("getaddrinfo", "gethostbyname", "gethostbyname_ex", "gethostbyaddr", "getnameinfo")
# The resolver's own functions, taken from the C module before anything patches it.
_ORIGINAL_LOOKUPS: dict[str, Callable[..., Any]] = {
    name: getattr(getattr(_socket, name), "__wrapped__", getattr(_socket, name))
    for name in _LOOKUPS
}
_installed = False


class NetworkRefusedError(ConnectionRefusedError):
    """Raised when code under the guard tries to reach a host off this machine."""


def is_loopback_host(host: object) -> bool:
    """True for a host on this machine: localhost, 127.0.0.0/8, ::1, ::ffff:127.x, 0.0.0.0, ::.

    The unspecified addresses count because connecting to them reaches this machine and
    binding to them is how servers listen; IPv4-mapped IPv6 forms count as their IPv4
    address. Anything that is not a `str` or `bytes` is not a host.
    """
    if isinstance(host, bytes | bytearray):
        host = bytes(host).decode("ascii", errors="replace")
    if not isinstance(host, str):
        return False
    name = host.strip("[]").split("%")[0].lower()
    if name in _LOOPBACK_NAMES:
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def is_local(host: object) -> bool:
    """Like `is_loopback_host`, plus "" and None, which the socket API reads as this machine."""
    return host in (None, "", b"") or is_loopback_host(host)


def _refuse(call: str, host: object, port: object = None) -> NetworkRefusedError:
    where = f"{host!r}" if port is None else f"{host!r} port {port!r}"
    return NetworkRefusedError(
        f"network access refused by tpuready.runtime.offline: {where} is not on this machine "
        f"({call}). The book runs offline: build models from configs, train tokenizers in "
        f"code, and ship small data in the repository ({ENVIRONMENT_SWITCH}=1 is set)."
    )


def _check_address(sock: Any, address: object, call: str) -> None:
    """Refuse an internet address off this machine; let the C method judge anything else."""
    if (
        sock.family in _INET_FAMILIES
        and isinstance(address, tuple)
        and address
        and not is_local(address[0])
    ):
        raise _refuse(call, address[0], address[1] if len(address) > 1 else None)


def _connect(self: Any, address: Any) -> None:
    """`socket.connect`, refused for addresses off this machine."""
    _check_address(self, address, "connect")
    return _C_SOCKET.connect(self, address)


def _connect_ex(self: Any, address: Any) -> int:
    """`socket.connect_ex`, refused for addresses off this machine."""
    _check_address(self, address, "connect_ex")
    return _C_SOCKET.connect_ex(self, address)


def _sendto(self: Any, data: Any, *flags_and_address: Any) -> int:
    """`socket.sendto(data[, flags], address)`, refused for addresses off this machine."""
    if flags_and_address:
        _check_address(self, flags_and_address[-1], "sendto")
    return _C_SOCKET.sendto(self, data, *flags_and_address)


def _sendmsg(self: Any, *arguments: Any) -> int:
    """`socket.sendmsg(buffers[, ancdata[, flags[, address]]])`, refused off this machine."""
    if len(arguments) >= 4 and arguments[3] is not None:
        _check_address(self, arguments[3], "sendmsg")
    return _C_SOCKET.sendmsg(self, *arguments)


_METHOD_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "connect": _connect,
    "connect_ex": _connect_ex,
    "sendto": _sendto,
    "sendmsg": _sendmsg,
}


class GuardedSocket(_C_SOCKET):
    """The C socket type with the guard's checks: what `_socket.socket` names once installed."""

    connect = _connect
    connect_ex = _connect_ex
    sendto = _sendto
    sendmsg = _sendmsg


def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
    """`_socket.getaddrinfo`, refused for names off this machine ("" and None mean this one)."""
    if not is_local(host):
        raise _refuse("getaddrinfo", host, port)
    return _ORIGINAL_LOOKUPS["getaddrinfo"](host, port, *args, **kwargs)


def gethostbyname(hostname: Any) -> Any:
    """`socket.gethostbyname`, refused for names off this machine."""
    if not is_local(hostname):
        raise _refuse("gethostbyname", hostname)
    return _ORIGINAL_LOOKUPS["gethostbyname"](hostname)


def gethostbyname_ex(hostname: Any) -> Any:
    """`socket.gethostbyname_ex`, refused for names off this machine."""
    if not is_local(hostname):
        raise _refuse("gethostbyname_ex", hostname)
    return _ORIGINAL_LOOKUPS["gethostbyname_ex"](hostname)


def gethostbyaddr(ip_address: Any) -> Any:
    """`socket.gethostbyaddr`, a reverse lookup, refused for addresses off this machine."""
    if not is_local(ip_address):
        raise _refuse("gethostbyaddr", ip_address)
    return _ORIGINAL_LOOKUPS["gethostbyaddr"](ip_address)


def getnameinfo(sockaddr: Any, flags: Any) -> Any:
    """`socket.getnameinfo`, a reverse lookup, refused for addresses off this machine."""
    if isinstance(sockaddr, tuple) and sockaddr and not is_local(sockaddr[0]):
        raise _refuse("getnameinfo", sockaddr[0], sockaddr[1] if len(sockaddr) > 1 else None)
    return _ORIGINAL_LOOKUPS["getnameinfo"](sockaddr, flags)


_LOOKUP_FUNCTIONS: dict[str, Callable[..., Any]] = {
    "getaddrinfo": getaddrinfo,
    "gethostbyname": gethostbyname,
    "gethostbyname_ex": gethostbyname_ex,
    "gethostbyaddr": gethostbyaddr,
    "getnameinfo": getnameinfo,
}
for _name, _function in _LOOKUP_FUNCTIONS.items():
    _function.__wrapped__ = _ORIGINAL_LOOKUPS[_name]  # type: ignore[attr-defined]  # for inspect.unwrap


def install_network_guard() -> None:
    """Patch `socket` and `_socket` in this process so that only local traffic goes through.

    Calling it twice is harmless. Child processes started with `spawn` install it again
    through the sitecustomize when the environment switch is set; children that skip the
    sitecustomize (`python -I`, `python -S`) are covered only by scripts/no_network.
    """
    global _installed
    if _installed:
        return
    for name, function in _METHOD_FUNCTIONS.items():
        setattr(socket.socket, name, function)
    _socket.socket = GuardedSocket  # type: ignore[misc]  # replacing the class is the guard
    for name, function in _LOOKUP_FUNCTIONS.items():
        setattr(_socket, name, function)
        # `socket.getaddrinfo` is a Python wrapper that calls `_socket.getaddrinfo`; the
        # others are the C functions themselves, copied into `socket` at import.
        if name != "getaddrinfo":
            setattr(socket, name, function)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    _installed = True


def network_guard_installed() -> bool:
    """True once `install_network_guard` has patched this process."""
    return _installed


def environment_for_another_python(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (this process's environment by default) for a Python of another venv, such as
    the vLLM venv: where the guard's switch is on, `tpuready`'s folder joins PYTHONPATH so that
    the sitecustomize can install the guard there too (the other venv does not hold tpuready)."""
    environment = dict(os.environ if base is None else base)
    if environment.get(ENVIRONMENT_SWITCH) == "1":
        package_parent = str(Path(__file__).resolve().parents[2])  # above tpuready/
        paths = [path for path in environment.get("PYTHONPATH", "").split(os.pathsep) if path]
        environment["PYTHONPATH"] = os.pathsep.join([*paths, package_parent])
    return environment
