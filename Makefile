# The two set-up commands of the README: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
TSTAMP := $(VENV)/.installed-test

.PHONY: run test lint bench clean spark-demo

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# the hot path's C builds (pyproject.toml's ext-modules) are rebuilt when their sources change
SPEEDUPS := $(wildcard core/*.c protocols/amqp/*.c)

$(STAMP): pyproject.toml $(SPEEDUPS) | $(BIN)/python
	$(BIN)/pip install -q -e .
	touch $@

$(TSTAMP): pyproject.toml $(STAMP)
	$(BIN)/pip install -q -e '.[test,database,spark]'
	$(BIN)/pip install -q -e examples/scow-stomp
	touch $@

run: $(STAMP)
	$(BIN)/scow run

# The suite spends about half its time waiting (on brokers in subprocesses, sockets,
# fsync, JVM starts): one pytest worker per core, at most four (pytest-xdist).
# `make test PYTEST_WORKERS=0` runs it in one process.
PYTEST_WORKERS ?= auto

test: $(TSTAMP)
	$(BIN)/python -m pytest -q -n $(PYTEST_WORKERS) --maxprocesses 4 --durations=15 $(PYTEST_ARGS)

lint: $(TSTAMP)
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy

bench: $(STAMP)
	$(BIN)/python benchmarks/run_perf.py $(BENCH_ARGS)

spark-demo: $(TSTAMP)
	$(BIN)/python examples/spark/demo.py

clean:
	rm -rf $(VENV) data
