"""What a browser test's own context costs Chromium: the tests' Chromium (tests/support/browser.py's flags), CONTEXTS
contexts one after the other, each a page loading a small static page twice, then closed; the CPU of this process's
whole tree counted by a cgroup v1 cpuacct group of its own (Chromium's renderers, which nobody waits for, included),
and Chromium's processes by kind, sampled every 20 ms.

    .venv/bin/python bench/browser_contexts.py [--contexts 10] [--mode ctx|pages|nav|fresh] [--drop FLAG] [FLAG ...]

`ctx`: a context per round, as each test had; `pages`: one context, a new page per round; `nav`: one page for every
round; `fresh`: one page made as good as new each round (tests/support/browser.py's `ModulePage.fresh`: cookies,
storage and cache cleared, about:blank between), as a module's tests now share it. `--drop` leaves one of the
tests' flags out (e.g. --drop=--disable-gpu), more are added (e.g. --renderer-process-limit=2). A Chromium child
seen only before it names its type counts as "browser". Needs root and /sys/fs/cgroup/cpuacct (as on the
project's VM); the group is removed afterwards."""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from playwright.sync_api import ViewportSize, sync_playwright  # noqa: E402

from tests.support.browser import CHROMIUM, FLAGS, ModulePage  # noqa: E402

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        pass


def chromium_kind(pid: str) -> str | None:
    """A Chromium process's kind ("renderer", "gpu-process", ...; "browser" for the browser), None for others."""
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").split()
    except OSError:
        return None
    if not words or "chromium" not in os.path.basename(words[0]):
        return None
    return next((w[len("--type=") :] for w in words if w.startswith("--type=")), "browser")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--contexts", type=int, default=10)
    parser.add_argument("--mode", choices=("ctx", "pages", "nav", "fresh"), default="ctx")
    parser.add_argument("--drop", action="append", default=[], help="one of the tests' flags to leave out")
    args, extra = parser.parse_known_args()
    flags = [flag for flag in FLAGS if flag not in args.drop] + extra
    site = Path(tempfile.mkdtemp(prefix="browser-contexts-"))
    head = '<!doctype html><title>t</title><link rel="icon" href="data:,">'  # no favicon request
    (site / "index.html").write_text(head + "<h1>a page</h1>" + "<p>text</p>" * 200)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/index.html"
    group = CPUACCT / f"tensor-debugger-browser-contexts-{os.getpid()}"
    group.mkdir()
    kinds: dict[str, str] = {}
    sampling = True

    def sample() -> None:
        while sampling:
            for pid in (group / "cgroup.procs").read_text().split():
                kind = chromium_kind(pid)
                if kind is not None:  # a process seen between its fork and its exec keeps its last kind
                    kinds[pid] = kind
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        (group / "cgroup.procs").write_text(str(os.getpid()))  # this process and what it starts from now on
        sampler.start()
        load = Path("/proc/loadavg").read_text().split()[0]
        start = time.monotonic()
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=flags, headless=True)
            viewport: ViewportSize = {"width": 1440, "height": 900}
            module = ModulePage(browser, viewport) if args.mode == "fresh" else None
            shared = browser.new_context(viewport=viewport) if args.mode in ("pages", "nav") else None
            page = None
            for _ in range(args.contexts):
                if module is not None:
                    page = module.fresh()
                else:
                    context = shared or browser.new_context(viewport=viewport)
                    if page is None or args.mode != "nav":
                        page = context.new_page()
                for address in (url, url + "?again"):
                    page.goto(address)
                    page.wait_for_load_state("load")
                if args.mode == "ctx":
                    context.close()
                elif args.mode == "pages":
                    page.close()
            browser.close()
        wall = time.monotonic() - start
        sampling = False
        sampler.join()
        cpu = int((group / "cpuacct.usage").read_text()) / 1e9
    finally:
        sampling = False
        (CPUACCT / "cgroup.procs").write_text(str(os.getpid()))  # back to the root group, so ours can go
        server.shutdown()
        for _ in range(50):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)
    counts = Counter(kinds.values())
    print(
        f"{args.contexts} x {args.mode}, less {args.drop}, more {extra}: wall {wall:.1f} s, "
        f"CPU of the process tree {cpu:.1f} s, load {load}; Chromium's processes: {dict(sorted(counts.items()))}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
