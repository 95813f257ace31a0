# The suite runs at both ends of the supported JAX range (docs/development.md, "Supported JAX"):
# the oldest, pyproject.toml's floor pinned by .ci/oldest.txt, in .venv from PYTHON; the newest,
# whatever the index gives the newest Python, in .venv-newest from NEWEST_PYTHON (else python3.13
# or python3.12 on PATH, else pyenv's: .ci/newest-python).
PYTHON ?= python3
NEWEST_PYTHON ?=
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
NEWEST_VENV := .venv-newest
NEWEST_STAMP := $(NEWEST_VENV)/.installed
LINT_PATHS := fastgp kernels benchmarks tests
# mypy checks the installed layout (kernels/ as fastgp/kernels) and tests/ through a tree of links
# here, with the benchmarks/ package that tests import (benchmarks.zoo.critics, ...) beside them.
TYPECHECK := build/typecheck
PYTEST := -m pytest -n 2 --dist worksteal --benchmark-disable -q

.PHONY: test test-newest check test-isa test-isa-newest lint mutants train bench tpu-compile \
	tpu-capacity clean

$(STAMP): pyproject.toml .ci/oldest.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[dev]" -c .ci/oldest.txt
	touch $(STAMP)

$(NEWEST_STAMP): pyproject.toml
	"$$(NEWEST_PYTHON="$(NEWEST_PYTHON)" .ci/newest-python)" -m venv $(NEWEST_VENV)
	$(NEWEST_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(NEWEST_VENV)/bin/python -m pip install --quiet -e ".[dev]"
	$(NEWEST_VENV)/bin/python -c "import jax, jaxlib, sys; print('newest end: Python', \
		sys.version.split()[0], 'JAX', jax.__version__, 'jaxlib', jaxlib.__version__)"
	touch $(NEWEST_STAMP)

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	rm -rf $(TYPECHECK)/fastgp
	mkdir -p $(TYPECHECK)/fastgp
	ln -s $(CURDIR)/fastgp/*.py $(CURDIR)/fastgp/py.typed $(CURDIR)/fastgp/train $(CURDIR)/fastgp/_penalty $(CURDIR)/fastgp/_attention $(CURDIR)/fastgp/_approximate $(CURDIR)/fastgp/_measure $(CURDIR)/fastgp/_gpu $(TYPECHECK)/fastgp/
	ln -s $(CURDIR)/kernels $(TYPECHECK)/fastgp/kernels
	ln -sfn $(CURDIR)/tests $(TYPECHECK)/tests
	ln -sfn $(CURDIR)/benchmarks $(TYPECHECK)/benchmarks
	cd $(TYPECHECK) && $(abspath $(VENV))/bin/mypy --config-file $(CURDIR)/pyproject.toml

# The whole suite on the oldest supported JAX (test) and on the newest (test-newest).
test: lint
	JAX_PLATFORMS=cpu $(PY) $(PYTEST)

test-newest: $(NEWEST_STAMP)
	JAX_PLATFORMS=cpu $(NEWEST_VENV)/bin/python $(PYTEST)

# The fast subset: everything but the end-to-end runs and the TPU compilations (`-m slow`, `-m aot`).
check: lint
	JAX_PLATFORMS=cpu $(PY) $(PYTEST) -m "not slow and not aot"

# The numerically deep files again with another float32 rounding: XLA:CPU's code capped at SSE4.2
# and Eigen's matmuls one-threaded (other reduction orders, as on an AVX2-only CPU), so that a
# float32 bound which holds on this machine alone fails here; see docs/development.md.
ISA_TESTS := tests/attention/test_attention_penalty.py tests/attention/test_attention.py \
	tests/attention/test_attention_backends.py tests/penalty/test_second_order.py \
	tests/penalty/test_penalty.py tests/approximate/test_approximate.py
ISA_FLAGS := XLA_FLAGS="--xla_cpu_max_isa=SSE4_2 --xla_cpu_multi_thread_eigen=false"
test-isa: $(STAMP)
	$(ISA_FLAGS) JAX_PLATFORMS=cpu $(PY) $(PYTEST) $(ISA_TESTS)

test-isa-newest: $(NEWEST_STAMP)
	$(ISA_FLAGS) JAX_PLATFORMS=cpu $(NEWEST_VENV)/bin/python $(PYTEST) $(ISA_TESTS)

# Mutation testing, apart from test and check: each mutant of tests/mutants/mutants.py planted in a
# scratch copy of the tracked files, its tests run there -> tests/mutants/report.md (all of them;
# ONLY="name ..." runs some and writes no report).
mutants: $(STAMP)
	JAX_PLATFORMS=cpu $(PY) tests/mutants/run.py $(if $(ONLY),--only $(ONLY))

train: $(STAMP)
	JAX_PLATFORMS=cpu $(VENV)/bin/fastgp train --out runs/$$(date +%Y%m%d-%H%M%S)

# The pytest-benchmark suites of benchmarks/suites/ -> benchmarks/results/suites/bench.{json,md,png}
# and, from the critic zoo's groups, benchmarks/results/zoo/zoo_cpu.md.
bench: $(STAMP)
	mkdir -p benchmarks/results/suites
	JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 $(PY) -m pytest benchmarks -q --benchmark-only \
		--benchmark-json benchmarks/results/suites/bench.json
	JAX_PLATFORMS=cpu $(PY) -m benchmarks.suites.report

# Compiles for TPU chips from this host: minutes per program. The zoo's programs and capacity
# search keep what they compiled in benchmarks/results/zoo/ (zoo_tpu.json,
# zoo_capacity_compiles.json) and reuse it; delete those files to measure again.
tpu-compile: $(STAMP)
	JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 $(PY) -m benchmarks.tpu.compile
	JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 $(PY) -m benchmarks.zoo.tpu programs

tpu-capacity: $(STAMP)
	JAX_PLATFORMS=cpu ALLOW_MULTIPLE_LIBTPU_LOAD=1 $(PY) -m benchmarks.zoo.tpu capacity

clean:
	rm -rf $(VENV) $(NEWEST_VENV) .pytest_cache .hypothesis .benchmarks .ruff_cache $(TYPECHECK)
