"""Pages and slices under concurrent load, on an idle server and while two 200 MB uploads ingest.

    python bench/load.py                        # concurrency 16, two uploads of 200 MB
    python bench/load.py --concurrency 8 --upload-mb 100 --idle-seconds 5

The real server runs in a child process on a loopback port with its demo session (a reference and a candidate,
their pairs computed). `--concurrency` client threads each loop over the session page, pair pages and slice
requests (`/api/pairs/N/slice`), first for `--idle-seconds` on the idle server, then from the moment two uploads
(each a zip of eight .pth files of random float32, `--upload-mb` in all) are sent until both runs are ingested.
Each phase prints requests, errors (non-200 answers and failures) and the latency percentiles of whole requests
on loopback, in milliseconds. Nothing here asserts on timings; the numbers are for reading (target: p99 under
150 ms while ingesting).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from harness import child_env, machine_line

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Phase:
    name: str
    latencies_ms: list[float] = field(default_factory=list)
    errors: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def line(self, seconds: float) -> str:
        done = sorted(self.latencies_ms)
        if not done:
            return f"{self.name:<16} no request answered, {self.errors} errors"
        p50 = statistics.median(done)
        p99 = done[min(len(done) - 1, int(len(done) * 0.99))]
        return (
            f"{self.name:<16} {len(done):>6} requests in {seconds:5.1f} s, {self.errors} errors, "
            f"p50 {p50:6.1f} ms, p99 {p99:6.1f} ms, max {done[-1]:6.1f} ms"
        )


def write_upload(path: Path, megabytes: int, seed: int) -> None:
    """A zip (stored) of eight .pth files of random float32, `megabytes` MB in all."""
    import torch

    folder = path.with_suffix("")
    folder.mkdir()
    generator = torch.Generator().manual_seed(seed)
    rows = megabytes * 1_000_000 // 8 // (4 * 1024)
    for layer in range(8):
        torch.save(torch.randn((rows, 1024), generator=generator), folder / f"{layer}_post_mlp.pth")
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        for file in sorted(folder.iterdir()):
            z.write(file, file.name)
    shutil.rmtree(folder)


def targets(client: httpx.Client, url: str) -> list[str]:
    """The demo session's page, its pair pages, and a 16 x 16 slice of each pair."""
    sessions = client.get(url + "/api/sessions").json()
    session_id = sessions[0]["id"]
    deadline = time.monotonic() + 120
    while True:
        report = client.get(f"{url}/api/sessions/{session_id}/pairs").json()
        if report["progress"]["total"] and not report["progress"]["pending"]:
            break
        if time.monotonic() > deadline:
            sys.exit("the demo session's pairs were not computed within 120 s")
        time.sleep(0.2)
    paths = [f"/sessions/{session_id}"]
    for pair in report["pairs"][:12]:
        shape = pair.get("aligned_shape")
        paths.append(f"/pairs/{pair['id']}")
        if shape and len(shape) >= 2:
            index = ",".join(["0"] * (len(shape) - 2) + [":", ":"])
            paths.append(f"/api/pairs/{pair['id']}/slice?index={index}&start=0,0&count=16,16")
    return paths


def hammer(url: str, paths: list[str], phase: Phase, stop: threading.Event, offset: int) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        n = offset
        while not stop.is_set():
            path = paths[n % len(paths)]
            n += 1
            start = time.perf_counter()
            try:
                ok = client.get(path).status_code == 200
            except httpx.HTTPError:
                ok = False
            took = (time.perf_counter() - start) * 1000
            with phase.lock:
                if ok:
                    phase.latencies_ms.append(took)
                else:
                    phase.errors += 1


def run_phase(url: str, paths: list[str], phase: Phase, concurrency: int, until: threading.Event) -> float:
    stop = threading.Event()
    threads = [
        threading.Thread(target=hammer, args=(url, paths, phase, stop, i), daemon=True) for i in range(concurrency)
    ]
    start = time.perf_counter()
    for t in threads:
        t.start()
    until.wait()
    stop.set()
    for t in threads:
        t.join()
    return time.perf_counter() - start


def send_uploads(url: str, uploads: list[Path], done: threading.Event) -> None:
    """Send each upload (?wait=false) at once, then wait until every run is ready."""
    with httpx.Client(base_url=url, timeout=600) as client:
        session_ids = []

        def send(n: int, path: Path) -> None:
            with open(path, "rb") as f:
                answer = client.post(
                    "/api/sessions",
                    params={"wait": "false"},
                    data={"name": f"load {n}"},
                    files=[("reference", (path.name, f))],
                )
            answer.raise_for_status()
            session_ids.append(answer.json()["session"]["id"])

        senders = [threading.Thread(target=send, args=(n, p)) for n, p in enumerate(uploads)]
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        while True:
            runs = [r for s in session_ids for r in client.get(f"/api/sessions/{s}").json()["runs"]]
            if len(runs) == len(uploads) and all(r["status"] != "ingesting" for r in runs):
                break
            time.sleep(0.1)
        if len(session_ids) != len(uploads) or any(r["status"] != "ready" for r in runs):
            print(f"warning: not every upload was ingested: {runs}")
    done.set()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--upload-mb", type=int, default=200, help="size of each of the two uploads (MB)")
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--workdir", type=Path, default=None, help="where to put the data (default: a temp dir)")
    args = parser.parse_args()

    import torch

    print(machine_line(f"torch {torch.__version__}, httpx {httpx.__version__}"))
    root = Path(tempfile.mkdtemp(prefix="load-", dir=args.workdir))
    server: subprocess.Popen[bytes] | None = None
    try:
        uploads = [root / f"upload{n}.zip" for n in range(2)]
        for n, path in enumerate(uploads):
            write_upload(path, args.upload_mb, seed=n)
        with socket_port() as port:
            pass
        url = f"http://127.0.0.1:{port}"
        cli = [sys.executable, "-m", "tensor_debugger", "--data-dir", str(root / "data"), "serve", "--port", str(port)]
        log = open(root / "server.log", "wb")
        server = subprocess.Popen(cli, stdout=log, stderr=subprocess.STDOUT, env=child_env(), cwd=REPO)
        with httpx.Client(timeout=30) as client:
            deadline = time.monotonic() + 120
            while True:
                try:
                    if client.get(url + "/api/sessions").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    sys.exit(f"the server did not start; its log: {root / 'server.log'}")
                time.sleep(0.1)
            paths = targets(client, url)
        print(f"{len(paths)} URLs (session page, pair pages, 16 x 16 slices), concurrency {args.concurrency}")

        idle = Phase("idle server")
        timer = threading.Event()
        threading.Timer(args.idle_seconds, timer.set).start()
        print(idle.line(run_phase(url, paths, idle, args.concurrency, timer)))

        busy = Phase(f"2 x {args.upload_mb} MB ingest")
        done = threading.Event()
        threading.Thread(target=send_uploads, args=(url, uploads, done), daemon=True).start()
        print(busy.line(run_phase(url, paths, busy, args.concurrency, done)))
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)
        shutil.rmtree(root, ignore_errors=True)
    return 0


class socket_port:  # noqa: N801 (a context manager read as a phrase)
    """A free loopback port."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
