# Two commands for a new user: `make run` and `make test`. Both install what is missing first.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# A CPU build of torch; an unpinned torch would pull gigabytes of CUDA packages.
TORCH ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000

.PHONY: run test install install-test browser cross bench lint

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml server/build_hooks.py server/tensor_debugger/engine/fused_stats.c server/tensor_debugger/compare/chunk_loop.c
	$(BIN)/python -m pip install "$(TORCH)"
	$(BIN)/python -m pip install -e .
	touch $@

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/python -m pip install -e ".[test]"
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test browser cross

# Debian's Chromium for the browser tests (Playwright cannot download its own browsers here).
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; }

# Debian's aarch64 cross compiler and emulator, for the test that builds and runs the kernel for aarch64 (skipped
# without them, so a machine without apt-get, or where it fails, still installs).
CROSS_PACKAGES := gcc-aarch64-linux-gnu qemu-user libc6-arm64-cross
cross:
	@{ command -v aarch64-linux-gnu-gcc && command -v qemu-aarch64 && test -d /usr/aarch64-linux-gnu/lib; } \
	  >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  { command -v apt-get >/dev/null 2>&1 && $$SUDO apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $(CROSS_PACKAGES); } || \
	  echo "$(CROSS_PACKAGES) not installed: the aarch64 kernel test will be skipped"; }

run: install
	$(BIN)/tensor-debugger serve --host $(HOST) --port $(PORT)

test: install-test
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python bench/ingest.py --size-gib 1

lint: install-test
	$(BIN)/ruff check server tests bench
	$(BIN)/mypy
