# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed

.PHONY: test lint typecheck unit bench demo clean

# The virtualenv is rebuilt when pyproject.toml changes.
$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(INSTALLED)
	$(BIN)/mypy

test: lint typecheck
	$(BIN)/python -m pytest

unit: $(INSTALLED)
	$(BIN)/python -m pytest tests/unit

bench: $(INSTALLED)
	$(BIN)/python -m tests.benchmarks --out var/bench

demo: $(INSTALLED)
	$(BIN)/python deploy/local/demo.py

clean:
	rm -rf $(VENV) var .mypy_cache .ruff_cache .pytest_cache
