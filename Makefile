# Two commands do everything on a fresh machine: `make run` and `make test`.
# Each creates .venv and installs what it needs when missing.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.dsv4kit-installed
# The CPU build of torch lies on local disk for this version; an unpinned torch pulls CUDA.
TORCH  ?= torch==2.13.0
ARCH   ?= sm_90a
JOBS   ?= 2

.PHONY: run test lint lab gallery clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[test,notebooks]"
	touch $(STAMP)

run: $(STAMP)
	$(VENV)/bin/dsv4kit warmup --preset flash --arch $(ARCH)
	$(VENV)/bin/dsv4kit coverage --preset flash --arch $(ARCH) --trace all

# Tests and notebooks run in parallel worker processes (pytest-xdist; CI has 2 cores): each
# worker is its own process, so kernel caches, monitors and registries never mix. One torch
# thread per worker: JOBS workers already fill the cores, and a machine whose CPU count is
# larger than its CPU quota would otherwise oversubscribe every worker.
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(TEST_ENV) $(PY) -m pytest -q -n $(JOBS) tests

lint: $(STAMP)
	$(VENV)/bin/ruff check .

lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/

# Every notebook executed on this CPU, one HTML page each with its figures, and an index page.
gallery: $(STAMP)
	$(TEST_ENV) $(PY) -m dsv4kit.viz.gallery --out build/gallery notebooks/*.ipynb

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
