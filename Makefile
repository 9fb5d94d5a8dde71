# `make run` and `make test` work on a fresh machine: they create .venv and install
# everything the project needs from PyPI.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck clean

$(STAMP): pyproject.toml scripts/ensure-java.sh
	sh scripts/ensure-java.sh
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

# The benchmark harness (bench/): installs nginx-light and wrk from Debian if missing,
# writes a 1 GiB data set under bench/data/, runs every scenario and writes
# bench/results/*.json and BENCHMARKS.md. `python -m bench --quick` checks it in ~1 min.
.PHONY: bench
bench: $(STAMP)
	bash bench/install-deps.sh
	$(BIN)/python -m bench
