# The two commands: `make run` and `make test`. Both go through `make install`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed

.PHONY: install run test lint bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/appliance serve

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

test: install lint
	$(BIN)/python -m pytest -q

bench: install
	$(BIN)/python -m pytest bench -q --benchmark-enable --benchmark-only

clean:
	rm -rf $(VENV) .pytest_cache .benchmarks .mypy_cache .ruff_cache
