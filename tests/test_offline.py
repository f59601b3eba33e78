"""The network guard the notebooks run under: loopback passes, everything else is refused."""

from __future__ import annotations

import ipaddress
import os
import subprocess
import sys
import textwrap

import nbformat
import pytest
from conftest import REPOSITORY
from hypothesis import given
from hypothesis import strategies as st
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from tpuready.offline import is_loopback_host

OFFLINE_SITE = REPOSITORY / "scripts" / "offline_site"


def offline_environment() -> dict[str, str]:
    """The environment `make test` gives notebook kernels (see NOTEBOOK_ENV in the Makefile)."""
    environment = dict(os.environ)
    environment.update(TPUREADY_OFFLINE="1", PYTHONPATH=str(OFFLINE_SITE))
    environment.pop("HF_HUB_OFFLINE", None)  # the guard must set it on its own
    return environment


def run_python(code: str, environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.8.9.10", "::1", "[::1]"])
def test_loopback_hosts_are_allowed(host: str) -> None:
    assert is_loopback_host(host)


@pytest.mark.parametrize(
    "host", ["example.com", "8.8.8.8", "10.0.0.1", "192.168.1.1", "::2", "", None, 80]
)
def test_other_hosts_are_refused(host: object) -> None:
    assert not is_loopback_host(host)


@given(st.ip_addresses(v=4))
def test_an_ipv4_address_passes_exactly_when_it_is_in_127_slash_8(address) -> None:
    assert is_loopback_host(str(address)) == (address in ipaddress.ip_network("127.0.0.0/8"))


def test_guard_refuses_the_internet_and_allows_loopback() -> None:
    result = run_python(
        """
        import os, socket, socketserver, threading, urllib.error, urllib.request
        from tpuready.offline import NetworkRefusedError, network_guard_installed
        assert network_guard_installed(), "sitecustomize did not install the guard"
        assert os.environ["HF_HUB_OFFLINE"] == "1"
        try:
            urllib.request.urlopen("http://example.com", timeout=5)
        except urllib.error.URLError as error:
            assert isinstance(error.reason, NetworkRefusedError), error
            print("refused:", error.reason)
        try:
            socket.create_connection(("93.184.215.14", 443), timeout=5)
        except NetworkRefusedError:
            print("refused by address too")
        server = socketserver.TCPServer(("127.0.0.1", 0), socketserver.BaseRequestHandler)
        threading.Thread(target=server.handle_request, daemon=True).start()
        socket.create_connection(server.server_address, timeout=5).close()
        print("loopback ok")
        """,
        offline_environment(),
    )
    assert result.returncode == 0, result.stderr
    assert "refused: network access refused by tpuready.offline: 'example.com'" in result.stdout
    assert "refused by address too" in result.stdout
    assert "loopback ok" in result.stdout


def test_without_the_switch_no_guard_is_installed() -> None:
    environment = offline_environment()
    environment["TPUREADY_OFFLINE"] = "0"
    result = run_python(
        "from tpuready.offline import network_guard_installed as i; print(i())", environment
    )
    assert result.stdout.strip() == "False", result.stderr


def test_a_notebook_cell_reaching_for_the_internet_fails_under_the_guard(tmp_path) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell("import os\nprint(os.environ['HF_HUB_OFFLINE'])"),
        nbformat.v4.new_code_cell(
            "import urllib.request\nurllib.request.urlopen('https://pypi.org', timeout=5)"
        ),
    ]
    client = NotebookClient(notebook, timeout=120, kernel_name="python3")
    # The kernel inherits this process's environment, as it does under nbval.
    original = dict(os.environ)
    os.environ.clear()
    os.environ.update(offline_environment())
    try:
        with pytest.raises(CellExecutionError, match="network access refused"):
            client.execute(cwd=str(tmp_path))
    finally:
        os.environ.clear()
        os.environ.update(original)
    assert notebook.cells[0].outputs[0]["text"].strip() == "1"
