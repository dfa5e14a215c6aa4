# Two commands a newcomer needs: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The CPU build of PyTorch is installed only where the environment has no torch yet; an existing torch
# (seen through --system-site-packages, or already in .venv) is left alone. Override for another build,
# e.g. `make demo TORCH_SPEC="torch==2.13.0 --index-url <your CUDA index>"`.
TORCH_SPEC ?= torch==2.13.0
OUT ?= runs/demo

.PHONY: demo test install clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed

demo: $(VENV)/.installed
	$(VENV)/bin/entropy-rft demo --out $(OUT)

test: $(VENV)/.installed
	$(PY) -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
