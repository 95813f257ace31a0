PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test train bench tpu-compile clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

test: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) -m pytest -n 2 --benchmark-disable -q

train: $(STAMP)
	JAX_PLATFORMS=cpu $(VENV)/bin/fastgp train --out runs/$$(date +%Y%m%d-%H%M%S)

bench: $(STAMP)
	mkdir -p benchmarks/results
	JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 $(PY) -m pytest benchmarks -q --benchmark-only \
		--benchmark-json benchmarks/results/bench.json
	JAX_PLATFORMS=cpu $(PY) benchmarks/report.py

tpu-compile: $(STAMP)
	JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 $(PY) benchmarks/tpu_compile.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks
