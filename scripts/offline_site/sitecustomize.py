"""Installs tpuready's network guard in every Python process started with this folder on
PYTHONPATH and TPUREADY_OFFLINE=1: the notebook kernels and the workers they spawn."""

import os

if os.environ.get("TPUREADY_OFFLINE") == "1":
    from tpuready.runtime.offline import install_network_guard

    install_network_guard()
