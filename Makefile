# Two commands for a new user: `make run` and `make test`. Both install what is missing first.
# `make ci` is the full check CI runs (.ci/run runs its four steps by name): lint, the suite's two tiers on the newest
# dependencies (`make test`, `make test-slow`), and the whole suite again on the lowest versions pyproject.toml
# declares (`make test-lowest`).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A CPU build of torch; an unpinned torch would pull gigabytes of CUDA packages.
TORCH ?= torch==2.13.0
# Where torch comes from: `make install TORCH_INDEX=URL` installs it from that index only (pip's --index-url; pip's
# find-links still count). Left empty: PyTorch's CPU index where it answers within TORCH_INDEX_WAIT seconds, else
# pip's own index (PyPI, or what pip.conf names), whose torch for Linux is the CUDA build.
TORCH_INDEX ?=
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu
TORCH_INDEX_WAIT ?= 5
# the index torch is installed from, said on the way: TORCH_INDEX, else the CPU index if it answers, else none
define torch_index
INDEX="$(TORCH_INDEX)"; \
if [ -z "$$INDEX" ]; then \
  if $(1) -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=float(sys.argv[2]))' \
    "$(TORCH_CPU_INDEX)" "$(TORCH_INDEX_WAIT)" 2>/dev/null; then INDEX="$(TORCH_CPU_INDEX)"; \
  else echo "$(TORCH_CPU_INDEX) did not answer within $(TORCH_INDEX_WAIT) s: torch from pip's default index"; fi; \
fi
endef
HOST ?= 127.0.0.1
PORT ?= 8000

# A second environment for `make test-lowest`: the same torch, then every other direct dependency at its declared
# lower bound (constraints-lowest.txt, which tests/test_dependencies.py keeps equal to pyproject.toml's bounds);
# what those pull in comes newest, as for a user who pins nothing.
LOWEST ?= .venv-lowest
# what the install compiles: a change to one rebuilds the package
BUILT_FROM := server/build_hooks.py server/tensor_debugger/engine/kernel_structs.h server/tensor_debugger/engine/fused_stats.c server/tensor_debugger/compare/compute/chunk_loop.c
LOWEST_BIN := $(LOWEST)/bin

.PHONY: run test test-slow test-all screenshots install install-test browser cross postgres bench bench-first-start fuzz lint test-lowest ci

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml $(BUILT_FROM)
	@$(call torch_index,$(BIN)/python); \
	set -x; $(BIN)/python -m pip install $${INDEX:+--index-url "$$INDEX"} "$(TORCH)"
	$(BIN)/python -m pip install -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/python -m pip install -e ".[test]"
	touch $@

$(LOWEST_BIN)/python:
	$(PYTHON) -m venv $(LOWEST)
	$(LOWEST_BIN)/python -m pip install --upgrade pip

# torch first, so that no resolver picks one; -c holds the rest at the lowest versions.
$(LOWEST)/.installed-test: $(LOWEST_BIN)/python pyproject.toml constraints-lowest.txt $(BUILT_FROM)
	@$(call torch_index,$(LOWEST_BIN)/python); \
	set -x; $(LOWEST_BIN)/python -m pip install $${INDEX:+--index-url "$$INDEX"} "$(TORCH)"
	$(LOWEST_BIN)/python -m pip install -c constraints-lowest.txt -e ".[test]"
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test browser cross postgres

# Debian's Chromium for the browser tests (Playwright cannot download its own browsers here).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; }

# Debian's aarch64 cross compiler and emulator, for the test that builds and runs the kernel for aarch64 (skipped
# without them, so a machine without apt-get, or where it fails, still installs). For the chunk loop there, C-Blosc2
# for aarch64: the blosc2 wheel for manylinux aarch64 (the version installed here), unpacked into $(CROSS_BLOSC2)
# (its part of that test is skipped without it, say offline).
CROSS_PACKAGES := gcc-aarch64-linux-gnu qemu-user libc6-arm64-cross
CROSS_BLOSC2 := $(VENV)/cross/blosc2
cross: $(BIN)/python
	@{ command -v aarch64-linux-gnu-gcc && command -v qemu-aarch64 && test -d /usr/aarch64-linux-gnu/lib; } \
	  >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  { command -v apt-get >/dev/null 2>&1 && $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(CROSS_PACKAGES); } || \
	  echo "$(CROSS_PACKAGES) not installed: the aarch64 kernel test will be skipped"; }
	@{ test -f $(CROSS_BLOSC2)/include/blosc2.h && test -f $(CROSS_BLOSC2)/lib/libblosc2.a; } || { \
	  WANT=$$($(BIN)/python -c 'from importlib.metadata import version; print("blosc2==" + version("blosc2"))' \
	    2>/dev/null || echo "blosc2>=4"); \
	  rm -rf $(VENV)/cross && \
	  $(BIN)/python -m pip download -q --retries 1 --timeout 15 "$$WANT" --no-deps --only-binary=:all: \
	    --platform manylinux_2_28_aarch64 --python-version 3.11 -d $(VENV)/cross && \
	  $(BIN)/python -m zipfile -e $(VENV)/cross/blosc2-*.whl $(VENV)/cross && \
	  test -f $(CROSS_BLOSC2)/include/blosc2.h && test -f $(CROSS_BLOSC2)/lib/libblosc2.a; } || \
	  echo "no blosc2 wheel for aarch64 in $(VENV)/cross (offline?): the aarch64 chunk-loop test will be skipped"

# Debian's PostgreSQL server, for the tests that run on both metadata databases (each run starts a private cluster
# with initdb and pg_ctl in a temporary folder: tests/support/postgres.py); skipped, saying why, without it.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v initdb >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  { command -v apt-get >/dev/null 2>&1 && $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql; } || \
	  echo "postgresql not installed: the tests on PostgreSQL will be skipped"; }

# exec: the server is make's child, so a SIGTERM to it (a clean stop, exit 0) ends `make run` without an error line
run: install
	exec $(BIN)/tensor-debugger serve --host $(HOST) --port $(PORT)

# Two workers (pytest-xdist): most tests wait part of the time on a server, a browser or a subprocess, so two
# workers keep two cores busy. Each worker starts its own shared servers (and PostgreSQL, S3 and Dask when its tests
# need them), so more workers than cores only add start-ups: `make test PYTEST_WORKERS=` runs in one process.
# worksteal: a worker that runs out takes half of what the other has left, so the run does not end on one worker
# with a queue while the other idles; the files come slowest first by the last run's times (tests/support/slow_first.py).
PYTEST_WORKERS ?= -n 2 --dist worksteal

# The suite in two tiers (tests/support/tiers.py): `make test` the quick one, about 1,300 tests in 2.5 minutes;
# `make test-slow` the rest: lint, packaging, the browser, PostgreSQL, S3 and Dask, the servers of their own, the
# answers on unseen models; `make test-all` both in one run. CI runs both tiers (`make ci`).
test: install-test
	$(BIN)/python -m pytest $(PYTEST_WORKERS) -m "not slow"

test-slow: install-test
	$(BIN)/python -m pytest $(PYTEST_WORKERS) -m slow

test-all: install-test
	$(BIN)/python -m pytest $(PYTEST_WORKERS)

# The browser tests again, each writing its screenshots of the pages into test-artifacts/ (a person looks at them
# before a page change is called done; `make test` takes none: no test reads them, and they cost Chromium CPU).
screenshots: install-test
	TEST_SCREENSHOTS=1 $(BIN)/python -m pytest $(PYTEST_WORKERS) -m browser

# The whole suite, browser tests included (Playwright's lowest version counts), tests/test_lint.py too: mypy --strict
# reads each library's own type annotations, so it is clean on the lowest versions as on the newest (numpy 2.0's
# ndarray has no default type arguments: arrays are annotated NDArray[Any]).
test-lowest: $(LOWEST)/.installed-test browser postgres
	$(LOWEST_BIN)/python -m pytest $(PYTEST_WORKERS)

ci: lint test test-slow test-lowest

bench: install
	$(BIN)/python bench/ingest.py --size-gib 1

# a cluster's first start, 10 rounds of 4 replicas on an empty PostgreSQL database and S3 prefix
bench-first-start: install-test postgres
	$(BIN)/python bench/first_start.py --rounds 10 --replicas 4

# Schemathesis over every operation of a real server, as tests/web/test_api_fuzzing.py runs it in the suite (its
# checks, and the state-dependent 400s its operations declare), with FUZZ_EXAMPLES generated requests per operation
# and mode instead of 5; it prints how many requests each mode sent and how many failed.
FUZZ_EXAMPLES ?= 50
fuzz: install-test
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) $(BIN)/python -m pytest -n 0 -s --durations=0 tests/web/test_api_fuzzing.py

lint: install-test
	$(BIN)/ruff check server tests bench
	$(BIN)/ruff format --check server tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# The whole suite on Python 3.13 with the newest release of every dependency (zarr 3.2 and later need 3.12), in a
# Debian trixie root file system made with debootstrap in PY313_ROOT on first use and reused after. Needs root.
# Arguments for pytest: `make test-py313 PY313_ARGS=tests/engine`.
PY313_ROOT ?= /opt/td-py313
PY313_ARGS ?=
.PHONY: test-py313
test-py313:
	PY313_ROOT=$(PY313_ROOT) PYTEST_WORKERS="$(PYTEST_WORKERS)" .ci/test-py313 $(PY313_ARGS)
