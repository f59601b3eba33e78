"""Companion toolkit of the book *TPU-ready PyTorch*.

One subpackage per purpose; import the module you need (`from tpuready.calc import hardware`).
Imports point one way (tests/test_layout.py holds the rule): `calc` and `inspection` read only
`validate`, the audit only `accelerator_api`, `emulator` reads `calc` and `inspection`, `runtime`
reads those and `emulator`, and `pages` reads any part but `runtime`; nothing reads `pages`.
The command line (`python -m tpuready`, `__main__`) reads `audit` and `runtime`.

- `runtime`: what runs the book's code. `device` (one device variable and one seed, chapter 1),
  `launch` (N processes, each rank on the backend and device of its host; Part II), `timing`
  (wait for a result by copying it to the host; chapters 1, 16, 21), `background` (another program
  with a clock, chapter 25), `offline` (the network guard of the tests), `setup_check` (the
  learner's set-up check), `port_check` (a port's launch lines as each rank would run them,
  chapter 9), `tiny_models` (the book's tiny Qwen3 sizes, spelled once), `cpu_roofline` (this
  CPU's measured peak and bandwidth, chapter 21 and the appendix *Measuring this CPU*),
  `tiny_decoder` (chapter 21's tiny decoder and training step, rebuilt by chapter 22),
  `foreign_checkpoint` (a checkpoint as another machine writes it, for chapter 2's exercise),
  `host_launch` (what each host of a TPU slice runs, `python -m tpuready torchrun`, chapter 28).
- `calc`: the book's calculators, pure functions of a chip table. `hardware` (figures with their
  vendor sources), `ici` (collective times on a torus, chapters 8, 11, 14), `plan` (memory, bytes
  and step time of a sharded run, chapter 14), `titan` (a plan as TorchTitan flags, chapter 26),
  `buckets` (padding buckets, chapter 17), `alignment` (MXU tiles, chapter 18), `roofline`
  (chapter 21), `serving` (vLLM's TPU buckets, chapter 23), `inference` (KV cache, chapter 24),
  `comm_bound` (the tokens per chip that keep FSDP compute-bound, chapter 28).
- `inspection`: looking inside a run. `dispatch` (aten operators, chapter 3), `syncs` (host
  syncs and graph breaks, chapters 6 and 7), `compile_trace` (compilations under `TORCH_TRACE`,
  chapter 17), `check` (the book's relative error and a model of bf16 matmul passes,
  chapters 2, 5).
- `audit`: the portability audit (`python -m tpuready audit-source PATH...`, chapter 2) and its
  fixer (`--fix`): `sources` reads files, `syntax` holds the shared readers and tables, `walker`
  walks a file, `rules` holds one check per rule, `report` prints, `fix*` rewrite.
- `pages`: the Markdown the book's reference pages show, rendered from the modules above, and
  `verification` (the records of where the notebooks ran, checked with pydantic, and their page).
- `emulator`: the emulated TPU, a `tpu` device on the CPU with TorchTPU 0.2.0's documented rules,
  loaded by `import torch` when `TPUREADY_EMULATE_TPU=1` (chapter 2; CI runs every notebook on it).
- `validate` (one check of calculator arguments and one error family, `InputError`) and
  `accelerator_api` (CUDA-only calls and their `torch.accelerator` spellings) sit at the top,
  for the parts that read them.
"""

__version__ = "0.1.0"
