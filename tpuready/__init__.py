"""Companion toolkit of the book *TPU-ready PyTorch*.

One module per idea: `device` (one device variable), `accelerator_api` (CUDA calls and
their portable spellings), `hardware` (accelerator figures with vendor sources),
`launch` (multi-process runs on CPU with gloo), `offline` (the network guard the
notebooks run under). Import the module you need: `from tpuready import hardware`.
"""

__version__ = "0.1.0"
