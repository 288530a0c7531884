# The two entry points of the README. Both create .venv and install what they need,
# so they work on a fresh machine. TORCH_SPEC pins the CPU build that is available
# locally; users bring their own torch (the package itself requires torch>=2.4 only
# for the runtime extra).
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean bench

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[test,ray]"
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/ccoverlap plan

# ruff and mypy first: a lint or type error fails in seconds, before the suite's minutes
# (mypy checks the whole package, every function annotated: pyproject's [tool.mypy])
lint: $(STAMP)
	$(PY) -m ruff check ccoverlap tests benchmarks
	$(PY) -m mypy

test: lint
	$(PY) -m pytest

# overlapped collective+GEMM schedules timed side by side on gloo (CPU), 4 local ranks
bench: $(STAMP)
	$(VENV)/bin/ccoverlap bench --m 8192 --n 128 --k 1024 --nproc 4

clean:
	rm -rf $(VENV) build *.egg-info
