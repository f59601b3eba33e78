"""Companion toolkit of the book *TPU-ready PyTorch*.

One subpackage per purpose; import the module you need (`from tpuready.calc import hardware`).
Imports point one way (tests/test_layout.py holds the rule): `calc` and `inspection` read only
`validate`, the audit only `accelerator_api`, `emulator` reads `calc` and `inspection`, `runtime`
reads those and `emulator`, and `pages` reads any part but `runtime`; nothing reads `pages`.

- `runtime`: what runs the book's code. `device` (one device variable and one seed, chapter 1),
  `launch` (N processes, each rank on the backend and device of its host; Part II), `timing`
  (wait for a result by copying it to the host; chapters 1, 11, 15), `background` (another program
  with a clock, chapter 18), `offline` (the network guard of the tests), `setup_check` (the
  learner's set-up check), `port_check` (a port's launch lines as each rank would run them,
  chapter 6), `tiny_models` (the book's tiny Qwen3 sizes, spelled once), `cpu_roofline` (this
  CPU's measured peak and bandwidth, chapter 15 and the appendix *Measuring this CPU*),
  `tiny_decoder` (chapter 15's tiny decoder and training step, rebuilt by chapter 15b).
- `calc`: the book's calculators, pure functions of a chip table. `hardware` (figures with their
  vendor sources), `ici` (collective times on a torus, chapters 5, 7, 9), `plan` (memory, bytes
  and step time of a sharded run, chapter 9), `titan` (a plan as TorchTitan flags, chapter 19),
  `buckets` (padding buckets, chapter 12), `alignment` (MXU tiles, chapter 13), `roofline`
  (chapter 15), `serving` (vLLM's TPU buckets, chapter 16), `inference` (KV cache, chapter 17).
- `inspection`: looking inside a run. `dispatch` (aten operators, chapter 2), `syncs` (host
  syncs and graph breaks, chapters 4 and 4b), `compile_trace` (compilations under `TORCH_TRACE`,
  chapter 12), `check` (the book's relative error and a model of bf16 matmul passes,
  chapters 1b, 3b).
- `audit`: the portability audit (`python -m tpuready audit-source PATH...`, chapter 1b) and its
  fixer (`--fix`): `sources` reads files, `syntax` holds the shared readers and tables, `walker`
  walks a file, `rules` holds one check per rule, `report` prints, `fix*` rewrite.
- `pages`: the Markdown the book's reference pages show, rendered from the modules above, and
  `verification` (the records of where the notebooks ran, checked with pydantic, and their page).
- `emulator`: the emulated TPU, a `tpu` device on the CPU with TorchTPU 0.2.0's documented rules,
  loaded by `import torch` when `TPUREADY_EMULATE_TPU=1` (chapter 1b; CI runs every notebook on it).
- `validate` (one check of calculator arguments and one error family, `InputError`) and
  `accelerator_api` (CUDA-only calls and their `torch.accelerator` spellings) sit at the top,
  for the parts that read them.
"""

__version__ = "0.1.0"
