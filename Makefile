# The two commands: `make run` and `make test`. Both go through `make install`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: install system-deps run test soak lint bench clean

# Debian packages the tests use: kcat (a real Kafka client) and systemd-analyze (unit verification).
SYSTEM_TOOLS := kcat:kcat systemd-analyze:systemd

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,spark,bench]'
	touch $(STAMP)

system-deps:
	@missing=""; for pair in $(SYSTEM_TOOLS); do tool=$${pair%%:*}; pkg=$${pair#*:}; \
	    command -v $$tool >/dev/null 2>&1 || missing="$$missing $$pkg"; done; \
	if [ -n "$$missing" ]; then \
	    echo "installing Debian packages:$$missing"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

install: system-deps $(STAMP)

run: install
	$(BIN)/appliance serve

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

# Modules are handed to the two workers in collection order, the longest first (tests/conftest.py).
# The suite starts hundreds of Python processes (`appliance serve`, the CLI, Spark's workers): the sources
# are byte-compiled once first, and bytecode writing stays on (an empty PYTHONDONTWRITEBYTECODE is unset),
# so no process compiles them again, and pytest keeps its rewritten test modules.
# Then two short real workloads (a compacted topic cleaned while send() runs; a consumer group formed,
# committing) fill numba's cache (`cache=True`, beside the sources) in one process at a time, so the first
# tests of a fresh clone do not each compile the writers', the cleaner's and the readers' kernels at once
# (a first group of two formed in a fresh clone took 6.7 s, 4.0 s with the cache filled; under the suite's
# load, past tests' limits). Their figures are not kept; a failure there is the suite's to report.
test: install lint
	$(BIN)/python -m compileall -q appliance ipc storage bench tests
	-PYTHONDONTWRITEBYTECODE= $(BIN)/appliance bench cleaner --pairs 1 --records 100000 \
	    --dirty-records 200000 --keys 1000 >/dev/null
	-PYTHONDONTWRITEBYTECODE= $(BIN)/appliance bench groups --members 2 --partitions 4 --rounds 1 \
	    --commits 20 --records 2000 --pairs 1 >/dev/null
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

# The fault campaigns at their long size (dozens to hundreds of kills each; tests/support/campaign.py).
soak: install
	APPLIANCE_SOAK=1 $(BIN)/python -m pytest -q -m campaign --timeout 3600

# The pytest-benchmark suites, the standard matrix and the cost-growth runs; writes bench/results/<date>.json,
# docs/img/*.png and the generated tables of docs/performance.md (see bench/run_matrix.py).
bench: install
	$(BIN)/python -m bench.run_matrix

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks .mypy_cache .ruff_cache
