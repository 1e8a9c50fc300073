# The one entry point: `make demo`, `make test`, `make bench`, `make lint`.
# Installs what is missing (redis-server via apt-get, a .venv with the dev tools), builds once in release mode.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: all deps redis-server valgrind venv build test test-rust test-python demo bench bench-quick lint soak-faults \
	lint-types fmt package package-check clean

all: build

redis-server:
	@command -v redis-server >/dev/null && command -v redis-cli >/dev/null && command -v redis-benchmark >/dev/null || { \
	  echo "installing redis-server and redis-tools with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-tools >/dev/null; }
	@command -v openssl >/dev/null || { \
	  echo "installing openssl (the TLS tests make their certificates with it) with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssl >/dev/null; }

# benchmarks/server_work.py counts the server's instructions with valgrind's callgrind.
valgrind:
	@command -v valgrind >/dev/null && command -v callgrind_control >/dev/null || { \
	  echo "installing valgrind with apt-get"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null; }

$(VENV)/.deps: requirements-dev.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt
	@touch $@

venv: $(VENV)/.deps

deps: redis-server valgrind venv

build: venv
	$(VENV)/bin/maturin develop --release -q

test-rust: redis-server
	cargo test --no-default-features -q

# Four pytest workers (pytest-xdist) on two cores: most tests wait on leases, sleeps and other
# processes rather than compute (two workers kept the cores about a quarter busy), so four take
# about 5.3 min where two took 9.5. Each worker has its own redis-server (the session fixture);
# PYTEST_WORKERS=0 runs in one process.
PYTEST_WORKERS ?= 4

# --durations: the slowest tests are listed at the end, to keep the run within its budget.
test-python: deps build
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --durations=15

test: deps build test-rust test-python

# The fault soak of issue 13: every fault kind at once for REDMUTEX_SOAK_SECONDS (default 150).
soak-faults: deps build
	$(PY) -m pytest -q -s -m soak tests/test_soak_faults.py

demo: deps build
	$(PY) -m redmutex demo

# The lock scenarios against the peers, then the cache stampede, the scale-out set-ups and asyncio.
bench: deps build
	$(PY) benchmarks/run.py
	$(PY) benchmarks/bench_cache.py
	$(PY) benchmarks/bench_scale.py
	$(PY) benchmarks/bench_aio.py --json benchmarks/results/aio-latest.json
	$(PY) benchmarks/bench_multilock.py
	$(PY) benchmarks/server_work.py

bench-quick: deps build
	$(PY) benchmarks/run.py --quick
	$(PY) benchmarks/bench_cache.py --quick
	$(PY) benchmarks/bench_scale.py --quick
	$(PY) benchmarks/bench_aio.py --quick
	$(PY) benchmarks/bench_multilock.py --quick
	$(PY) benchmarks/server_work.py

lint: venv
	cargo fmt --check
	cargo clippy -q --all-targets -- -D warnings
	cargo clippy -q --all-targets --no-default-features -- -D warnings
	$(VENV)/bin/ruff check python tests examples benchmarks scripts
	$(VENV)/bin/ruff format --check python tests examples benchmarks scripts
	$(MAKE) --no-print-directory lint-types

# Types: mypy --strict on the package and the examples; stubtest compares _core.pyi with the
# built extension (hence `build`); a typed user of every public API (tests/typing/user_module.py)
# passes mypy --strict and pyright (strict, offline: the PyPI package bundles it); the docs'
# API page is the one scripts/gen_api_docs.py makes from the docstrings.
lint-types: venv build
	$(PY) -m mypy --strict python/redmutex examples scripts
	$(PY) -m mypy.stubtest redmutex._core
	$(PY) -m mypy --strict tests/typing/user_module.py
	$(VENV)/bin/pyright --pythonpath $(PY) tests/typing/user_module.py
	$(PY) -m pytest -q tests/test_typing.py

fmt: venv
	cargo fmt
	$(VENV)/bin/ruff format python tests examples benchmarks scripts

# Release artifacts in dist/: the abi3 wheel (one wheel for every CPython >= 3.10) and the sdist.
# The wheel is linked by zig (the `ziglang` package) against glibc 2.17, so it is tagged
# manylinux2014 and installs on Ubuntu 20.04, Debian 11, RHEL 8 and Amazon Linux 2 and newer.
package: venv
	rm -rf dist
	$(VENV)/bin/maturin build --release --zig --compatibility manylinux2014 --out dist
	$(VENV)/bin/maturin sdist --out dist

# Installs the wheel, the sdist and `pip install .` into fresh venvs and uses each (slow: the
# sdist and `.` are compiled again, reusing this checkout's cargo target dir for dependencies).
package-check: package redis-server
	CARGO_TARGET_DIR=$(CURDIR)/target $(PYTHON) .ci/package-check dist

clean:
	rm -rf target $(VENV)

# Issue 13 item 2 soak: 2,000 release-vs-cancel races per kind (Lock fair/unfair, Semaphore,
# both RWLock sides), each checked in Redis; `make test` runs 200 per kind.
.PHONY: soak-aio-cancel
soak-aio-cancel: deps build
	REDMUTEX_AIO_CANCEL_RACES=2000 REDMUTEX_AIO_CANCEL_SECONDS=600 $(PY) -m pytest -q -s tests/test_aio_cancel.py
