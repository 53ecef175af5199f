"""Render the session page of a 2,000-pair session and report server time and bytes sent, then load it in
headless Chromium and report the load time (navigation start to the load event) and the DOM's size. Then the
same for the pair page of a 64 x 256 pair (its heatmap covers the whole 64 x 256 slice).

    python bench/pages.py                 # 2,002 pairs (154 layers x 13 stages)
    python bench/pages.py --layers 40     # quicker
    python bench/pages.py --pair-only     # the pair page alone
    python bench/pages.py --pair-only --baseline /elsewhere/server   # and another checkout's, side by side
    python bench/pages.py --graph-only    # the model graph of a traced 154-layer tiny Llama (2,008 modules)
    python bench/pages.py --graph-only --baseline /elsewhere/server    # and another checkout's, side by side

The session is built with the library (seeded synthetic dumps, a planted divergence), its pairs computed, then
the real server is started on a loopback port and the page is requested repeatedly. Timings are wall times of
whole requests on loopback, so they bound the server's time from above. Targets: under 300 ms on the server;
in the browser, under 1 s to the load event with under 15,000 elements (issue 17).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
from tensor_debugger.compare.planning.plan import plan_session

REPO = Path(__file__).resolve().parent.parent
CLI = Path(sys.executable).parent / "tensor-debugger"


def build_session(data: Path, layers: int) -> int:
    from tensor_debugger.demo.synthetic import Plant, write_dump
    from tensor_debugger.ingest.inputs import InputFile
    from tensor_debugger.services import open_services
    from tensor_debugger.settings import Settings

    dumps = data.parent / "dumps"
    write_dump(dumps / "ref", layers, seed=1)
    write_dump(dumps / "cand", layers, seed=1, plant=Plant(layers // 2, "post_attn", (3, 3), 0.5))
    services = open_services(Settings(data_dir=data, demo=False))
    try:
        services.ingestor.ingest("bench pages", "reference", [InputFile(dumps / "ref", "ref")])
        result = services.ingestor.ingest("bench pages", "candidate", [InputFile(dumps / "cand", "cand")])
        plan_session(services.context, result.session_id)
        services.compute(result.session_id)
        return result.session_id
    finally:
        services.close()
        shutil.rmtree(dumps, ignore_errors=True)


def build_pair_session(data: Path) -> int:
    """A session of one 64 x 256 pair whose candidate differs everywhere a little and at one spot a lot."""
    import torch
    from tensor_debugger.ingest.inputs import InputFile
    from tensor_debugger.services import open_services
    from tensor_debugger.settings import Settings

    files = data.parent / "pair-files"
    files.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(7)
    reference = torch.randn(64, 256, generator=generator)
    candidate = reference + 1e-4 * torch.randn(64, 256, generator=generator)
    candidate[40, 200] += 0.5
    torch.save({"model.layers.17.self_attn.o_proj": reference}, files / "ref.pth")
    torch.save({"model.layers.17.self_attn.o_proj": candidate}, files / "cand.pth")
    services = open_services(Settings(data_dir=data, demo=False))
    try:
        services.ingestor.ingest("bench pair page", "reference", [InputFile(files / "ref.pth", "ref.pth")])
        result = services.ingestor.ingest("bench pair page", "candidate", [InputFile(files / "cand.pth", "cand.pth")])
        plan_session(services.context, result.session_id)
        services.compute(result.session_id)
        return result.session_id
    finally:
        services.close()


def pair_page(client: httpx.Client, base: str, session_id: int, requests: int) -> dict[str, str]:
    """The pair page of the 64 x 256 pair: server time and bytes of the page and of its heatmap (and of the cells'
    values the page fetches after its load, where it does), then its load in Chromium (the load event waits for
    the heatmap, an <object> or an <img>). Figures as text with their units, by what they measure."""
    from playwright.sync_api import sync_playwright

    pair_id = client.get(f"{base}/api/sessions/{session_id}/pairs").json()["pairs"][0]["id"]
    url = f"{base}/pairs/{pair_id}"
    page = client.get(url)
    figures = {"page, server p50": f"{timed(client, url, requests)[0]:.0f} ms", "page HTML": kb(len(page.content))}
    heat = re.search(r'(?:src|data)="(/pairs/\d+/heatmap\.[a-z]+\?[^"]+)"', page.text)
    if heat:
        ms, size = timed(client, base + heat.group(1).replace("&amp;", "&"), requests)
        figures["heatmap, server p50"], figures["heatmap size"] = f"{ms:.0f} ms", kb(size)
    values = re.search(r'data-values="(/pairs/\d+/heatmap\.json\?[^"]+)"', page.text)
    if values:
        ms, size = timed(client, base + values.group(1).replace("&amp;", "&"), requests)
        figures["cell values (after load), server p50"], figures["cell values size"] = f"{ms:.0f} ms", kb(size)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"], headless=True
        )
        tab = browser.new_page(viewport={"width": 1440, "height": 900})
        tab.goto(url)
        loads = []
        for _ in range(requests):
            tab.goto(url, wait_until="load")
            loads.append(tab.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd"))
        figures["Chromium load p50 (target < 300 ms)"] = f"{statistics.median(loads):.0f} ms"
        figures["Chromium load max"] = f"{max(loads):.0f} ms"
        elements = tab.evaluate("document.getElementsByTagName('*').length")
        figures["elements"] = f"{elements:,}"
        browser.close()
    return figures


def kb(size: int) -> str:
    return f"{size / 1e3:.1f} kB"


def timed(client: httpx.Client, url: str, requests: int) -> tuple[float, int]:
    """Median ms of `requests` GETs of `url`, and the body's bytes."""
    times, size = [], 0
    for _ in range(requests):
        t0 = time.perf_counter()
        answer = client.get(url)
        answer.raise_for_status()
        times.append((time.perf_counter() - t0) * 1000)
        size = len(answer.content)
    return statistics.median(times), size


def serve(command: list[str], data: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`serve` on a free loopback port (`command` runs the CLI: this checkout's, or a baseline's), once it answers."""
    port = free_port()
    server = subprocess.Popen(
        [*command, "--data-dir", str(data), "serve", "--port", str(port), "--no-demo"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            httpx.get(base + "/api/sessions", timeout=5)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    return server, base


def side_by_side(
    data: Path, baseline: Path | None, measure: Callable[[httpx.Client, str, int], dict[str, str]]
) -> dict[str, dict[str, str]]:
    """`measure` against this checkout's server (and first the baseline's: another checkout's server/ folder, served
    in turn on the same data): its figures by server."""
    commands = {"this checkout": [str(CLI)]}
    if baseline is not None:
        env = f"PYTHONPATH={baseline.resolve()}"
        commands = {"baseline": ["/usr/bin/env", env, sys.executable, "-m", "tensor_debugger"], **commands}
    columns: dict[str, dict[str, str]] = {}
    for label, command in commands.items():
        server, base = serve(command, data)
        try:
            with httpx.Client(timeout=120) as client:
                columns[label] = measure(client, base, server.pid)
        finally:
            server.terminate()
            server.wait(timeout=30)
    return columns


def print_columns(title: str, columns: dict[str, dict[str, str]]) -> None:
    rows = list(dict.fromkeys(key for figures in columns.values() for key in figures))
    print(f"\n| {title} | " + " | ".join(columns) + " |")
    print("| --- |" + " --- |" * len(columns))
    for row in rows:
        print(f"| {row} | " + " | ".join(figures.get(row, "—") for figures in columns.values()) + " |")


def pair_pages(data: Path, session_id: int, requests: int, baseline: Path | None) -> None:
    """The pair page's figures from this checkout (and from the baseline's), side by side."""
    columns = side_by_side(data, baseline, lambda client, base, _: pair_page(client, base, session_id, requests))
    print_columns(f"pair page, 64 x 256, {requests} requests each", columns)


def build_trace_session(data: Path, layers: int) -> int:
    """A Hugging Face debugger trace of a tiny random Llama of `layers` layers (13 modules each), against the same
    model with layer 1's down_proj perturbed, compared as `compare` does."""
    sys.path.insert(0, str(REPO))
    from tensor_debugger.cli.compare_output import compare_request
    from tensor_debugger.compare.pipeline import compare_runs
    from tensor_debugger.services import open_services
    from tensor_debugger.settings import Settings

    from tests.support.traces import PERTURBED, write_trace

    traces = data.parent / "traces"
    reference = write_trace(traces / "eager", layers=layers, prune_layers=False)
    candidate = write_trace(traces / "perturbed", layers=layers, perturb=PERTURBED, prune_layers=False)
    services = open_services(Settings(data_dir=data, demo=False))
    try:
        request = compare_request(reference, candidate, "bench graph", None, None)
        payload = compare_runs(services.ingestor, services.context, services.compute, request, "").payload
        assert payload.session is not None
        return payload.session.id
    finally:
        services.close()


def server_cpu(pid: int) -> float:
    """CPU seconds (user and system) the server process has used so far: on a shared machine, where wall times
    follow the load, what a request costs the server itself."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def graph_page(client: httpx.Client, base: str, pid: int, session_id: int, requests: int) -> dict[str, str]:
    """The model graph page of the traced session, whole and searched: server time (wall and the server's CPU) and
    bytes, then Chromium's load time (navigation start to the load event, after the page's script built the open
    boxes), the part of it after the first byte, and the DOM's size."""
    from playwright.sync_api import sync_playwright

    figures: dict[str, str] = {}
    for view, path in (("graph", "graph"), ("graph ?q=down_proj", "graph?q=down_proj")):
        url = f"{base}/sessions/{session_id}/{path}"
        page = client.get(url)
        page.raise_for_status()
        modules = re.search(r'aria-label="Module graph \(([\d,]+) modules\)"', page.text)
        figures["modules"] = modules.group(1) if modules else "?"
        cpu = server_cpu(pid)
        figures[f"{view}, server p50 (target < 300 ms)"] = f"{timed(client, url, requests)[0]:.0f} ms"
        figures[f"{view}, server CPU per request"] = f"{1000 * (server_cpu(pid) - cpu) / requests:.0f} ms"
        figures[f"{view}, HTML"] = kb(len(page.content))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"], headless=True
        )
        tab = browser.new_page(viewport={"width": 1440, "height": 900})
        for view, path in (("graph", "graph"), ("graph ?q=down_proj", "graph?q=down_proj")):
            url = f"{base}/sessions/{session_id}/{path}"
            tab.goto(url)  # warm: the static files cached, as a user's second visit
            loads, after = [], []
            for _ in range(requests):
                tab.goto(url, wait_until="load")
                timing = tab.evaluate(
                    "(n => [n.responseStart, n.loadEventEnd])(performance.getEntriesByType('navigation')[0])"
                )
                loads.append(timing[1])
                after.append(timing[1] - timing[0])
            figures[f"{view}, Chromium load p50 (target < 300 ms)"] = f"{statistics.median(loads):.0f} ms"
            figures[f"{view}, Chromium first byte to load, p50"] = f"{statistics.median(after):.0f} ms"
            figures[f"{view}, Chromium load max"] = f"{max(loads):.0f} ms"
            elements = tab.evaluate("document.getElementsByTagName('*').length")
            figures[f"{view}, elements"] = f"{elements:,}"
            figures[f"{view}, boxes in the DOM"] = f"{tab.locator('.gnode').count():,}"
        browser.close()
    return figures


def graph_pages(data: Path, session_id: int, requests: int, baseline: Path | None) -> None:
    """The model graph page's figures from this checkout (and from the baseline's, served in turn on the same
    data), side by side."""
    columns = side_by_side(
        data, baseline, lambda client, base, pid: graph_page(client, base, pid, session_id, requests)
    )
    print_columns(f"model graph, {requests} requests each", columns)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def browser_load(url: str, repeats: int) -> None:
    """The page in headless Chromium (Debian's, as the tests use): time to the load event, elements in the DOM."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium", args=["--no-sandbox", "--disable-gpu"], headless=True
        )
        for view, query in (("grouped by layer", ""), ("ungrouped", "?group=none")):
            page = browser.new_page(viewport={"width": 1440, "height": 900})
            page.goto(url + query)  # warm: the static files cached, as a user's second visit
            times = []
            for _ in range(repeats):
                page.goto(url + query)
                times.append(page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd"))
            count = page.evaluate("document.getElementsByTagName('*').length")
            nodes = page.evaluate(
                "document.createTreeWalker(document, NodeFilter.SHOW_ALL).currentNode && "
                "(() => { let n = 0; const w = document.createTreeWalker(document, 0xFFFFFFFF); "
                "while (w.nextNode()) n++; return n; })()"
            )
            print(
                f"session page in Chromium, {view}: load p50 {statistics.median(times):.0f} ms, "
                f"max {max(times):.0f} ms over {repeats} loads (target under 1,000 ms); "
                f"{count:,} elements, {nodes:,} nodes with text (target under 15,000)"
            )
            page.close()
        browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=154, help="13 pairs per layer (default 154: 2,002 pairs)")
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--pair-only", action="store_true", help="only the pair page of a 64 x 256 pair")
    parser.add_argument("--graph-only", action="store_true", help="only the model graph of a traced tiny Llama")
    parser.add_argument("--graph-layers", type=int, default=154, help="its layers (13 modules each; default 154)")
    parser.add_argument(
        "--graph-data",
        type=Path,
        default=None,
        help="with --graph-only: a data dir whose session 1 is the trace's, built before (e.g. by build_trace_session)",
    )
    parser.add_argument(
        "--baseline", type=Path, default=None, help="another checkout's server/ folder: its pair page or graph too"
    )
    args = parser.parse_args()
    cpu = next(
        (line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")),
        platform.processor(),
    )
    print(f"machine: {cpu}, {os.cpu_count()} cores; Python {platform.python_version()}")
    work = Path(tempfile.mkdtemp(prefix="pages-"))
    server: subprocess.Popen[bytes] | None = None
    try:
        started = time.perf_counter()
        if args.graph_only:
            if args.graph_data is not None:
                graph_pages(args.graph_data, 1, args.requests, args.baseline)
                return 0
            graph_session = build_trace_session(work / "data", args.graph_layers)
            print(f"trace of {args.graph_layers} layers built and compared in {time.perf_counter() - started:.1f} s")
            graph_pages(work / "data", graph_session, args.requests, args.baseline)
            return 0
        session_id = None if args.pair_only else build_session(work / "data", args.layers)
        if session_id is not None:
            print(f"session of {args.layers * 13} pairs built and compared in {time.perf_counter() - started:.1f} s")
        pair_session = build_pair_session(work / "data")
        pair_pages(work / "data", pair_session, args.requests, args.baseline)
        if session_id is None:
            return 0
        port = free_port()
        server = subprocess.Popen(
            [str(CLI), "--data-dir", str(work / "data"), "serve", "--port", str(port), "--no-demo"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(timeout=60) as client:
            for _ in range(200):
                try:
                    client.get(base + "/api/sessions")
                    break
                except httpx.HTTPError:
                    time.sleep(0.1)
            for view, query in (
                ("grouped by layer", ""),
                ("ungrouped, reorderable", "?group=none"),
                ("failing only", "?verdict=fail"),
            ):
                page = client.get(f"{base}/sessions/{session_id}{query}")
                times = []
                for _ in range(args.requests):
                    t0 = time.perf_counter()
                    client.get(f"{base}/sessions/{session_id}{query}").raise_for_status()
                    times.append((time.perf_counter() - t0) * 1000)
                assets = re.findall(r'(?:src|href)="(/static/[^"]+)"', page.text)
                asset_bytes = sum(len(client.get(base + a).content) for a in set(assets))
                print(
                    f"session page, {view}: server p50 {statistics.median(times):.0f} ms, max {max(times):.0f} ms "
                    f"over {args.requests} requests (target under 300 ms); HTML {len(page.content) / 1e3:.0f} kB, "
                    f"script and style {asset_bytes / 1e3:.1f} kB"
                )
            browser_load(f"{base}/sessions/{session_id}", args.requests)
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
