# Every target does its own set-up: a clean clone with nothing but Python 3.11+ works.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: dev test check demo bench bench-matrix bench-overhead soak fmt clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

dev: $(STAMP)

test: $(STAMP)
	$(BIN)/python -m pytest -q

check: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy proxy routing diag

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

demo: $(STAMP)
	$(BIN)/kvroute demo

bench: $(STAMP)
	$(BIN)/kvroute bench
	$(BIN)/python -m bench.gateways
	$(BIN)/python -m bench.warmrag
	$(BIN)/python -m bench.pd

bench-matrix: $(STAMP)
	$(BIN)/kvroute bench --matrix

bench-overhead: $(STAMP)
	$(BIN)/kvroute bench overhead

soak: $(STAMP)
	$(BIN)/python -m bench.labs.soak --minutes 10

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
