"""The network guard the notebooks run under: local traffic passes, nothing else gets out.

Two layers (see tpuready.runtime.offline): scripts/no_network's network namespace, and the Python
guard. The tests check what each one does to the calls a notebook could make, and that a
notebook cell trying UDP, DNS and a raw `_socket` gets no packet out in either mode.
Addresses off the machine are documentation ones (192.0.2.0/24, *.invalid) or the guard
sees them on a closed socket, so even a broken guard sends nothing anywhere that matters.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPOSITORY
from hypothesis import given
from hypothesis import strategies as st

from tpuready.runtime import offline
from tpuready.runtime.offline import GuardedSocket, NetworkRefusedError, is_loopback_host

OFFLINE_SITE = REPOSITORY / "scripts" / "offline_site"
NO_NETWORK = REPOSITORY / "scripts" / "no_network"
OFF_MACHINE_ADDRESS = "192.0.2.1"  # TEST-NET-1: not loopback, routed nowhere


def offline_environment(**changes: str) -> dict[str, str]:
    """The environment `make test` gives notebook kernels (see NOTEBOOK_ENV in the Makefile)."""
    environment = dict(os.environ)
    environment.update(TPUREADY_OFFLINE="1", PYTHONPATH=str(OFFLINE_SITE))
    environment.pop("HF_HUB_OFFLINE", None)  # the guard must set it on its own
    for name in ("TPUREADY_NETWORK_NAMESPACE", "TPUREADY_SKIP_NETWORK_NAMESPACE"):
        environment.pop(name, None)
    environment.update(changes)
    return environment


def run(command: list[str], environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120)


def run_python(code: str, environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-c", textwrap.dedent(code)], environment)


def is_on_this_machine(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """The rule the guard should follow, written from the address ranges themselves."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if isinstance(address, ipaddress.IPv4Address):
        return address in ipaddress.ip_network("127.0.0.0/8") or address.packed == bytes(4)
    return address.packed in (bytes(15) + b"\x01", bytes(16))  # ::1 and ::


def closed_socket(family: int) -> GuardedSocket:
    """A guarded UDP socket that is already closed: any call the guard lets through fails
    with EBADF inside the C method, before a packet could be made."""
    sock = GuardedSocket(family, socket.SOCK_DGRAM)
    sock.close()
    return sock


def raise_if_error(code: int) -> int:
    """Turn connect_ex's returned error number into the OSError connect would raise."""
    if code:
        raise OSError(code, os.strerror(code))
    return code


SOCKET_CALLS: dict[str, Callable[[GuardedSocket, tuple[Any, ...]], object]] = {
    "connect": lambda sock, address: sock.connect(address),
    "connect_ex": lambda sock, address: raise_if_error(sock.connect_ex(address)),
    "sendto": lambda sock, address: sock.sendto(b"x", address),
    "sendto with flags": lambda sock, address: sock.sendto(b"x", 0, address),
    "sendmsg": lambda sock, address: sock.sendmsg([b"x"], [], 0, address),
}


# --- the Python guard's rule, seen through the socket calls it guards -------------------


@pytest.mark.parametrize("call", SOCKET_CALLS)
@given(address=st.ip_addresses())
def test_a_socket_call_is_refused_exactly_when_the_address_is_off_this_machine(
    call: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address
) -> None:
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    sock = closed_socket(family)
    try:
        SOCKET_CALLS[call](sock, (str(address), 9))
    except NetworkRefusedError as error:
        assert not is_on_this_machine(address), f"{address} is local but was refused"
        assert f"{str(address)!r} port 9 is not on this machine" in str(error)
    except OSError as error:  # let through to the C method, which found the socket closed
        assert error.errno == errno.EBADF, error
        assert is_on_this_machine(address), f"{address} left the guard's hands"
    else:
        pytest.fail(f"{call} on a closed socket returned")


def is_not_a_broadcast(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """127.255.255.255 (and its mapped form) needs SO_BROADCAST: the system, not the guard,
    refuses it on a plain socket."""
    return not address.packed.endswith(b"\xff" * 3)


LOOPBACK_HOSTS = (
    (st.ip_addresses(network="127.0.0.0/8") | st.ip_addresses(network="::ffff:127.0.0.0/104"))
    .filter(is_not_a_broadcast)
    .map(str)
) | st.sampled_from(["localhost", "::1", "0.0.0.0", "::ffff:127.0.0.1"])


@given(host=LOOPBACK_HOSTS)
def test_a_datagram_to_a_loopback_address_arrives(host: str) -> None:
    # Every 127/8 address and its IPv4-mapped form reach the receiver; 0.0.0.0 means "this
    # machine" and reaches a receiver on 127.0.0.1.
    mapped = ipaddress.ip_address(host).ipv4_mapped if ":" in host else None
    receive_on = {"localhost": "127.0.0.1", "0.0.0.0": "127.0.0.1"}.get(host, host)
    if mapped is not None:
        receive_on = str(mapped)
    receiver_family = socket.AF_INET6 if receive_on == "::1" else socket.AF_INET
    sender_family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with (
        socket.socket(receiver_family, socket.SOCK_DGRAM) as receiver,
        contextlib.closing(GuardedSocket(sender_family, socket.SOCK_DGRAM)) as sender,
    ):
        receiver.bind((receive_on, 0))
        receiver.settimeout(10)
        port = receiver.getsockname()[1]
        sender.sendto(b"sendto", (host, port))
        sender.sendmsg([b"sendmsg"], [], 0, (host, port))
        assert {receiver.recv(16), receiver.recv(16)} == {b"sendto", b"sendmsg"}


def test_a_tcp_connection_to_an_ipv4_mapped_loopback_address_goes_through() -> None:
    with (
        socket.create_server(("127.0.0.1", 0)) as server,
        contextlib.closing(GuardedSocket(socket.AF_INET6)) as sock,
    ):
        sock.settimeout(10)
        assert sock.connect_ex(("::ffff:127.0.0.1", server.getsockname()[1])) == 0


NAMES_OFF_THIS_MACHINE = st.from_regex(
    r"[a-z][a-z0-9-]{0,15}(\.[a-z][a-z0-9-]{0,15}){0,2}\.invalid"
)


@given(name=NAMES_OFF_THIS_MACHINE)
def test_name_lookups_of_other_hosts_are_refused(name: str) -> None:
    for lookup in (offline.gethostbyname, offline.gethostbyname_ex):
        with pytest.raises(NetworkRefusedError, match=re.escape(f"{name!r} is not on this")):
            lookup(name)
    with pytest.raises(NetworkRefusedError, match=re.escape(f"{name!r} port 443 is not on")):
        offline.getaddrinfo(name, 443)


@given(address=st.ip_addresses().filter(lambda address: not is_on_this_machine(address)))
def test_reverse_lookups_of_other_addresses_are_refused(address: object) -> None:
    with pytest.raises(NetworkRefusedError, match="gethostbyaddr"):
        offline.gethostbyaddr(str(address))
    with pytest.raises(NetworkRefusedError, match="getnameinfo"):
        offline.getnameinfo((str(address), 80), socket.NI_NUMERICHOST)


def test_lookups_of_this_machine_still_work() -> None:
    addresses = {info[4][0] for info in offline.getaddrinfo("localhost", 80)}
    assert addresses and all(is_loopback_host(address) for address in addresses), addresses
    assert offline.gethostbyname("localhost").startswith("127.")
    assert offline.getaddrinfo(None, 80, socket.AF_INET)[0][4] == ("127.0.0.1", 80)
    assert offline.getnameinfo(("127.0.0.1", 80), socket.NI_NUMERICHOST)[0] == "127.0.0.1"


@pytest.mark.parametrize(
    ("host", "local"),
    [
        ("localhost", True),
        ("LOCALHOST", True),
        ("[::1]", True),
        (b"127.0.0.1", True),
        ("::ffff:127.0.0.1", True),
        ("0.0.0.0", True),
        ("::", True),
        ("fe80::1%lo", False),
        ("<broadcast>", False),
        ("127.0.0.1.example.com", False),
        ("localhost.example.com", False),
        ("::ffff:192.0.2.1", False),
        ("::127.0.0.1", False),  # IPv4-compatible, not mapped: not routed to loopback
        (None, False),
        (80, False),
    ],
)
def test_hosts_that_name_this_machine(host: object, local: bool) -> None:
    assert is_loopback_host(host) is local


@pytest.mark.parametrize("host", [None, "", b""])
def test_an_empty_host_is_this_machine_to_the_socket_calls(host: object) -> None:
    # The socket API reads None, "" and b"" as this machine (INADDR_ANY): the guard lets them
    # through to the C method, although they name no loopback host.
    assert offline.is_local(host) and not is_loopback_host(host)
    if isinstance(host, str):
        with pytest.raises(OSError) as raised:
            closed_socket(socket.AF_INET).connect((host, 9))
        assert not isinstance(raised.value, NetworkRefusedError)
        assert raised.value.errno == errno.EBADF


# --- the guard installed by the sitecustomize, as notebook kernels get it ---------------


def test_the_installed_guard_refuses_the_internet_through_every_door() -> None:
    result = run_python(
        f"""
        import _socket, asyncio, os, socket, urllib.error, urllib.request
        from tpuready.runtime.offline import NetworkRefusedError, network_guard_installed
        assert network_guard_installed(), "sitecustomize did not install the guard"
        print("HF_HUB_OFFLINE", os.environ["HF_HUB_OFFLINE"])
        def attempt(label, action):
            try:
                action()
            except Exception as error:
                reason = getattr(error, "reason", error)  # urllib wraps it in a URLError
                assert isinstance(reason, NetworkRefusedError), repr(error)
                print(label, "refused:", str(reason).split(" (")[0])
        attempt("urllib", lambda: urllib.request.urlopen("http://example.invalid", timeout=5))
        attempt("create_connection",
                lambda: socket.create_connection(("{OFF_MACHINE_ADDRESS}", 443)))
        attempt("gethostbyname", lambda: socket.gethostbyname("example.invalid"))
        attempt("gethostbyaddr", lambda: socket.gethostbyaddr("{OFF_MACHINE_ADDRESS}"))
        attempt("_socket.gethostbyname", lambda: _socket.gethostbyname("example.invalid"))
        attempt("_socket connect_ex",
                lambda: _socket.socket().connect_ex(("{OFF_MACHINE_ADDRESS}", 80)))
        attempt("udp sendto", lambda: _socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                .sendto(b"x", ("{OFF_MACHINE_ADDRESS}", 9)))
        attempt("asyncio", lambda: asyncio.run(asyncio.open_connection("example.invalid", 80)))
        """,
        offline_environment(),
    )
    assert result.returncode == 0, result.stderr
    target = repr(OFF_MACHINE_ADDRESS)
    refusals = [
        ("urllib", "'example.invalid' port 80"),
        ("create_connection", f"{target} port 443"),
        ("gethostbyname", "'example.invalid'"),
        ("gethostbyaddr", target),
        ("_socket.gethostbyname", "'example.invalid'"),
        ("_socket connect_ex", f"{target} port 80"),
        ("udp sendto", f"{target} port 9"),
        ("asyncio", "'example.invalid' port 80"),
    ]
    assert result.stdout.splitlines() == ["HF_HUB_OFFLINE 1"] + [
        f"{label} refused: network access refused by tpuready.runtime.offline: {where} is not "
        "on this machine"
        for label, where in refusals
    ]


def test_the_installed_guard_keeps_local_servers_and_clients_working() -> None:
    result = run_python(
        """
        import asyncio, socket, socketserver, threading, _socket
        server = socketserver.TCPServer(("0.0.0.0", 0), socketserver.BaseRequestHandler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        for host in ("127.0.0.1", "localhost", "::ffff:127.0.0.1", "0.0.0.0"):
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            with socket.socket(family) as sock:
                sock.connect((host, port))
        raw = _socket.socket()
        assert raw.connect_ex(("127.0.0.1", port)) == 0
        raw.close()
        async def main():
            reader, writer = await asyncio.open_connection("localhost", port)
            writer.close()
        asyncio.run(main())
        server.shutdown()
        print("local ok")
        """,
        offline_environment(),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "local ok\n"


def test_without_the_switch_no_guard_is_installed() -> None:
    result = run_python(
        "from tpuready.runtime.offline import network_guard_installed as i; print(i())",
        offline_environment(TPUREADY_OFFLINE="0"),
    )
    assert result.stdout.strip() == "False", result.stderr


# --- scripts/no_network -------------------------------------------------------------------


def namespace_available() -> bool:
    """Whether this machine lets scripts/no_network make a network namespace."""
    result = run([str(NO_NETWORK), "true"], offline_environment())
    return result.returncode == 0 and result.stderr == ""


def test_no_network_falls_back_loudly_and_runs_the_command() -> None:
    result = run(
        [str(NO_NETWORK), "sh", "-c", 'echo "mode $TPUREADY_NETWORK_NAMESPACE"; exit 7'],
        offline_environment(TPUREADY_SKIP_NETWORK_NAMESPACE="1"),
    )
    assert result.returncode == 7  # the command's own exit status
    assert result.stdout == "mode 0\n"
    assert result.stderr == (
        "no_network: no network namespace (TPUREADY_SKIP_NETWORK_NAMESPACE=1 is set); only "
        "the Python guard (TPUREADY_OFFLINE=1) keeps the network away\n"
    )


def test_no_network_reports_a_missing_command() -> None:
    result = run([str(NO_NETWORK), "no-such-command-here"], offline_environment())
    assert result.returncode == 127
    assert "no_network: cannot run 'no-such-command-here'" in result.stderr


def test_inside_the_namespace_only_loopback_exists_and_works() -> None:
    if not namespace_available():
        pytest.skip("this machine allows no network namespace; the fallback is tested above")
    result = run(
        [
            str(NO_NETWORK),
            sys.executable,
            "-I",
            "-c",
            "import os, socket\n"
            "print(os.environ['TPUREADY_NETWORK_NAMESPACE'], os.getuid())\n"
            "print([name for _, name in socket.if_nameindex()])\n"
            "with socket.create_server(('127.0.0.1', 0)) as server:\n"
            "    socket.create_connection(server.getsockname()).close()\n"
            "print('loopback ok')\n",
        ],
        offline_environment(),
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""  # quiet when the namespace works
    assert result.stdout.splitlines() == [f"1 {os.getuid()}", "['lo']", "loopback ok"]


# --- a notebook cell tries UDP, DNS and a raw socket, in both modes ----------------------

# What the probe cell does. Python-level attempts run in both modes; a `python -I` child
# (no sitecustomize, so no guard) and a C-level connect through ctypes only inside the
# namespace, since outside it nothing would stop them.
PROBE_CELL = f"""
import _socket, ctypes, errno, os, socket, struct, subprocess, sys
from tpuready.runtime.offline import network_guard_installed

TARGET = "{OFF_MACHINE_ADDRESS}"
print("guard", network_guard_installed(), "namespace", os.environ["TPUREADY_NETWORK_NAMESPACE"])

def attempt(label, action):
    try:
        result = action()
    except OSError as error:
        name = errno.errorcode.get(error.errno, error.errno) if error.errno else None
        print(label, type(error).__name__, name)
    else:
        print(label, "returned", result)

udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
attempt("udp sendto", lambda: udp.sendto(b"probe", (TARGET, 9)))
attempt("dns", lambda: socket.gethostbyname("example.invalid"))
attempt("raw _socket connect", lambda: _socket.socket().connect((TARGET, 80)))
attempt("raw _socket connect_ex",
        lambda: errno.errorcode[_socket.socket().connect_ex((TARGET, 80))])

if os.environ["TPUREADY_NETWORK_NAMESPACE"] == "1":
    child = subprocess.run(
        [sys.executable, "-I", "-c",
         "import socket\\n"
         "try:\\n"
         "    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('%s', 9))\\n"
         "except OSError as error:\\n"
         "    print(type(error).__name__, error.errno)\\n" % TARGET],
        capture_output=True, text=True)
    print("python -I child", child.stdout.strip())
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)
    address = struct.pack("=H", socket.AF_INET) + struct.pack("!H", 80)
    address += socket.inet_aton(TARGET) + bytes(8)
    result = libc.connect(fd, address, len(address))
    print("native connect", result, errno.errorcode[ctypes.get_errno()])
    os.close(fd)
"""

# Runs the probe notebook with nbclient; the kernel inherits this process's environment
# (and its network namespace), as it does under nbval and scripts/notebooks.py.
NOTEBOOK_RUNNER = """
import json, sys
import nbformat
from nbclient import NotebookClient
notebook = nbformat.v4.new_notebook()
notebook.cells = [nbformat.v4.new_code_cell(sys.argv[1])]
NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
outputs = notebook.cells[0].outputs
stdout = "".join(o.get("text", "") for o in outputs if o.get("name") == "stdout")
others = [o for o in outputs if o.get("name") != "stdout"]
print(json.dumps([stdout, others]))
"""


def run_probe_notebook(environment: dict[str, str]) -> tuple[list[str], str]:
    """Execute the probe cell in a kernel under scripts/no_network; its lines and stderr."""
    result = run([str(NO_NETWORK), sys.executable, "-c", NOTEBOOK_RUNNER, PROBE_CELL], environment)
    assert result.returncode == 0, result.stderr
    text, other_outputs = json.loads(result.stdout.splitlines()[-1])
    assert other_outputs == []  # nothing on the cell's stderr, no error
    return text.splitlines(), result.stderr


def test_a_notebook_gets_no_packet_out_under_the_python_guard_alone() -> None:
    lines, stderr = run_probe_notebook(offline_environment(TPUREADY_SKIP_NETWORK_NAMESPACE="1"))
    assert stderr.startswith("no_network: no network namespace")
    # The guard refuses each attempt before the C library sees it.
    assert lines == [
        "guard True namespace 0",
        "udp sendto NetworkRefusedError None",
        "dns NetworkRefusedError None",
        "raw _socket connect NetworkRefusedError None",
        "raw _socket connect_ex NetworkRefusedError None",
    ]


def test_a_notebook_gets_no_packet_out_in_the_namespace() -> None:
    if not namespace_available():
        pytest.skip("this machine allows no network namespace; the guard alone is tested above")
    # With the guard, as `make test` runs notebooks: its clear refusal comes first, and the
    # namespace stops what the guard cannot see (a `python -I` child, native code).
    lines, stderr = run_probe_notebook(offline_environment())
    assert "no_network" not in stderr
    assert lines == [
        "guard True namespace 1",
        "udp sendto NetworkRefusedError None",
        "dns NetworkRefusedError None",
        "raw _socket connect NetworkRefusedError None",
        "raw _socket connect_ex NetworkRefusedError None",
        f"python -I child OSError {errno.ENETUNREACH}",
        "native connect -1 ENETUNREACH",
    ]
    # Without the guard, the namespace alone: the network is unreachable, names unknown.
    lines, stderr = run_probe_notebook(offline_environment(TPUREADY_OFFLINE="0"))
    assert "no_network" not in stderr
    assert lines[0] == "guard False namespace 1"
    assert lines[1:] == [
        "udp sendto OSError ENETUNREACH",
        lines[2],
        "raw _socket connect OSError ENETUNREACH",
        "raw _socket connect_ex returned ENETUNREACH",
        f"python -I child OSError {errno.ENETUNREACH}",
        "native connect -1 ENETUNREACH",
    ]
    assert lines[2].startswith("dns gaierror"), lines[2]  # no resolver can be reached


def test_another_venvs_python_gets_the_guard_through_pythonpath(tmp_path) -> None:
    """The base interpreter, which has no tpuready, installs the guard all the same."""
    from tpuready.runtime.offline import environment_for_another_python

    base = {"PATH": os.environ["PATH"], "TPUREADY_OFFLINE": "1", "PYTHONPATH": "/some/where"}
    environment = environment_for_another_python(base)
    assert environment["PYTHONPATH"].split(os.pathsep) == ["/some/where", str(REPOSITORY)]
    assert environment_for_another_python({"PATH": "/bin"}) == {"PATH": "/bin"}

    other_python = Path(sys.base_prefix) / "bin" / "python3"
    without_tpuready = subprocess.run(
        [str(other_python), "-c", "import tpuready"],
        cwd=tmp_path,
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert without_tpuready.returncode != 0, "the base interpreter should not hold tpuready"
    site = str(REPOSITORY / "scripts" / "offline_site")
    environment = environment_for_another_python({**base, "PYTHONPATH": site})
    probe = "import socket; socket.create_connection(('192.0.2.1', 80), timeout=1)"
    completed = subprocess.run(
        [str(other_python), "-c", probe],
        env=environment,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "NetworkRefusedError" in completed.stderr, completed.stderr
