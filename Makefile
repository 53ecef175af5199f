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

run: install
	$(BIN)/tensor-debugger serve --host $(HOST) --port $(PORT)

test: install-test
	$(BIN)/python -m pytest

bench: install
	$(BIN)/python bench/ingest.py --size-gib 1

lint: install-test
	$(BIN)/ruff check server tests bench
	$(BIN)/mypy
