"""Companion toolkit of the book *TPU-ready PyTorch*.

One module per idea; import the one you need (`from tpuready import hardware`):

- `device`: one device variable and one seed (chapter 1).
- `accelerator_api`: CUDA-only calls and their `torch.accelerator` spellings (chapter 1).
- `audit`: the portability audit, also `python -m tpuready audit-source PATH...` (chapter 1).
- `dispatch`: record the aten operators code sends through the dispatcher (chapter 2).
- `check`: the book's relative error and a CPU model of bf16 matmul passes (chapters 1, 3).
- `syncs`: count host syncs and graph breaks (chapter 4).
- `compile_trace`: read the compilations a run logged under `TORCH_TRACE` (chapter 12).
- `timing`: wait for a device result by copying it to the host; time a call (chapters 1, 11, 15).
- `hardware`: accelerator figures with their vendor sources (reference page).
- `launch`: run a worker on N processes, each rank on the backend and device of its host (Part II).
- `port_check`: run a port's launch lines as each rank of a host would; where each went (chapter 6).
- `ici`: collective times on a TPU slice's torus, per mesh axis (chapters 5, 7, 9).
- `plan`: per-chip memory, bytes per mesh axis and roofline step time of a sharded run (chapter 9).
- `buckets`: the padding buckets that waste the fewest tokens, and a collate helper (chapter 12).
- `alignment`: MXU utilisation (weights in tiles, tokens streamed), the cheat sheet (chapter 13).
- `roofline`: arithmetic intensity, rooflines, MFU and tokens per second (chapter 15).
- `serving`: the token and request buckets of vLLM's TPU runner, and its scheduler (chapter 16).
- `inference`: KV-cache bytes, the sequences that fit, the decode roofline (chapter 17).
- `background`: run another program with a clock, never left running (chapter 18).
- `fix`: `python -m tpuready audit-source --fix`, rewrite what the audit finds (chapter 1).
- `validate`: one check of calculator arguments and one error family, `InputError`.
- `offline`: the network guard the notebooks run under in the tests.
- `emulator`: the emulated TPU, a `tpu` device on the CPU with TorchTPU 0.2.0's documented rules,
  loaded by `import torch` when `TPUREADY_EMULATE_TPU=1` (chapter 1; CI runs every notebook on it).
"""

__version__ = "0.1.0"
