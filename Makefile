# Two commands matter on a fresh machine: `make run` and `make test`.
# Everything else (the virtualenv, dependencies, Postgres for the tests) is set up from here.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: run test lint bench proto clean help

help:
	@echo "make run    - start a one-shard server on loopback with a demo worker"
	@echo "make test   - run the whole test suite (unit + integration)"
	@echo "make lint   - ruff and mypy --strict on our sources"
	@echo "make bench  - engine, transport, drain, latency, sharding, durable stores, failover (numbers printed)"
	@echo "make proto  - regenerate proto/cronoq/v1/*_pb2*.py from proto/cronoq/v1/cronoq.proto"

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/python -m cronoq.shard.demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy common shard router bench tests

bench: $(STAMP)
	$(BIN)/python -m bench

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=proto \
		--grpc_python_out=proto proto/cronoq/v1/cronoq.proto

clean:
	rm -rf $(VENV) build *.egg-info common/*.egg-info
