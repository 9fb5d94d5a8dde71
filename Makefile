# `make run` and `make test` work on a fresh machine: they create .venv and install
# everything the project needs from PyPI.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/sidecar demo

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) typecheck
	$(BIN)/pytest

clean:
	rm -rf $(VENV) build *.egg-info
