# `make run` and `make test` work on a fresh machine: they create .venv and install
# everything the project needs from PyPI. The venv gets the serving path plus the
# tools (demo, replay), Spark and test extras; `pip install .` alone is what a
# broker node runs.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint typecheck clean kafka fuzz

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[tools,spark,test]'
	touch $(STAMP)

# The real Kafka broker the broker tests, `sidecar demo --broker` and the broker benchmark
# run (tests/kafka/pom.xml): fetched from Maven Central once, rebuilt when its files change.
# Java (which Spark needs too) is installed here, by the targets that need it, not by
# `make run`, whose demo needs none.
KAFKA_STAMP := tests/kafka/target/.fetched
$(KAFKA_STAMP): scripts/ensure-kafka.sh tests/kafka/pom.xml $(shell find tests/kafka/src -type f)
	sh scripts/ensure-kafka.sh

kafka: $(KAFKA_STAMP)

run: $(STAMP)
	$(BIN)/sidecar demo

lint: $(STAMP)
	$(BIN)/ruff check

typecheck: $(STAMP)
	$(BIN)/mypy

# Three pytest processes side by side (scripts/pytest-split.sh says which tests go
# where); `$(BIN)/pytest` alone runs the same suite one test after another.
test: $(STAMP) $(KAFKA_STAMP) lint typecheck
	sh scripts/pytest-split.sh $(BIN)/pytest

# The parsers that take what a client sends (SigV4, Range and preconditions,
# aws-chunked, slot headers, the index snapshot) under many more hypothesis
# examples than `make test` gives them (tests/fuzz; the seeds in
# tests/fuzz/corpus are replayed either way). FUZZ_EXAMPLES=N per property
# (default 20000); failures found are remembered in test-artifacts/hypothesis.
fuzz: $(STAMP)
	HYPOTHESIS_PROFILE=fuzz $(BIN)/pytest tests/fuzz -q

clean:
	rm -rf $(VENV) $(BUILD_VENV) build dist *.egg-info

# The wheel and sdist a broker node installs (README.md, deploy/README.md), e.g.
# dist/kafka_cold_sidecar-0.1.0-py3-none-any.whl. Built by PyPA's `build` in a
# small venv of its own, so no dev extras, Java or Spark are needed for it.
# DIST=DIR puts them elsewhere; only earlier builds of this package are removed there.
DIST ?= dist
BUILD_VENV := .venv-build
.PHONY: dist
$(BUILD_VENV)/.installed:
	$(PYTHON) -m venv $(BUILD_VENV)
	$(BUILD_VENV)/bin/pip install --quiet build
	touch $@

dist: $(BUILD_VENV)/.installed
	rm -f $(DIST)/kafka_cold_sidecar-*
	$(BUILD_VENV)/bin/python -m build --outdir $(DIST) .

# The benchmark harness (bench/): installs nginx-light and wrk from Debian if missing,
# writes a 1 GiB data set under bench/data/, runs every scenario and writes
# bench/results/*.json and BENCHMARKS.md. `python -m bench --quick` checks it in ~1 min.
.PHONY: bench
bench: $(STAMP) $(KAFKA_STAMP)
	bash bench/install-deps.sh
	$(BIN)/python -m bench

# docs/CONFIG.md is generated from the OPTIONS table in sidecar/config/options.py; a test
# fails when it is stale. Run this after adding or changing an option. The
# renderer needs only the standard library, so no venv is required.
.PHONY: config-docs
config-docs:
	mkdir -p docs
	$(PYTHON) -m sidecar.config.reference > docs/CONFIG.md.tmp
	mv docs/CONFIG.md.tmp docs/CONFIG.md

# The chaos soak (tests/soak/): a real sidecar with its cache on a loop-mounted
# disk, under Kafka-like load while it is killed, its origin misbehaves and its
# disk fills up, gets damaged and fails; every byte served is checked. Needs
# root (the loop device). 20 minutes; `make soak SOAK_ARGS="--minutes 2"` for a
# short run. Not part of `make test`.
.PHONY: soak
soak: $(STAMP)
	sh scripts/ensure-disk-tools.sh
	$(BIN)/python -m tests.soak $(SOAK_ARGS)
