PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: test train bench clean

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
	JAX_PLATFORMS=cpu $(PY) -m pytest benchmarks -q --benchmark-only

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .benchmarks
