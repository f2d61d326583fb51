# `make test` and `make demo` work on a fresh clone: they build the virtualenv themselves.
# torch is installed first and pinned to the CPU build so nothing pulls a CUDA build.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export MPIR_CVAR_ENABLE_HEAVY_YIELD := 1

.PHONY: test demo lint bench torture clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	touch $(STAMP)

# Tests compile the numba kernels with bounds checks (an index past an array raises
# instead of writing over memory), cached apart from the unchecked kernels everything
# else runs.
test: $(STAMP)
	$(PY) -m ruff check streamgnn tests benchmarks
	NUMBA_BOUNDSCHECK=1 NUMBA_CACHE_DIR=$(CURDIR)/.numba-checked $(PY) -m pytest -q

torture: $(STAMP)
	STREAMGNN_TORTURE_KILLS=30 STREAMGNN_TORTURE_BATCHES=100 \
		$(PY) -m pytest -q -s tests/test_torture.py tests/test_faults.py

lint: $(STAMP)
	$(PY) -m ruff check streamgnn tests benchmarks

demo: $(STAMP)
	$(VENV)/bin/streamgnn demo

bench: $(STAMP)
	$(PY) benchmarks/foundation.py

clean:
	rm -rf $(VENV) artifacts .pytest_cache .hypothesis .numba-checked
