"""The sessions list (the home page `/`) with N sessions that hold a rerun, each of hundreds to thousands of op pairs:
the server's time and CPU for a first load and for repeat loads, at N = 1, 10, 50.

    python bench/sessions_list.py                          # N = 1, 10, 50; blocks of 24, 96 and 192 layers in turn
    python bench/sessions_list.py --counts 1,10 --layers 12
    PYTHONPATH=/elsewhere/server python bench/sessions_list.py   # another checkout's library and server (a baseline)

One session of each depth is three op-level captures of a seeded `ResidualStack` (demo/models.py) into a data dir:
the reference (float32), its rerun in bfloat16 (role "noise", as find_divergence's precision floor makes one) and a
bfloat16 port (the bug planted in its last block in the second), compared by the library: what find_divergence
stores, without its search. The other sessions are copies of those rows under new ids (`copy_session`: what the list
reads, without capturing again). A session of L layers has about 10 L op pairs of its candidate and as many of its
rerun (24 layers: ~480 in all; 192: ~3,800).

The real server then runs as a process on a loopback port and `/` is requested: "first" is the first load after
the server starts (nothing kept yet: every session judged), "repeat" the median of the next loads. Where this
checkout keeps the judged figures (table session_figures), "judged on every load" empties that table before each
load: the cost every load had before they were kept. The server's CPU seconds come from /proc (wall times follow
the load of a shared machine).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from sqlalchemy import ColumnElement, Engine, func, insert, select
from tensor_debugger import capture
from tensor_debugger.demo.models import ResidualStack
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.database import create_db_engine
from tensor_debugger.store.models import Base, PairRecord, SessionRecord

HIDDEN = 32  # the blocks' width: the pairs' count, not their size, is what the list's cost followed


def capture_session(data: Path, name: str, depth: int, bug: bool) -> int:
    """A session of three op-level captures (reference, its bfloat16 rerun, a bfloat16 port), its pairs computed."""
    x = torch.randn(1, 8, HIDDEN, generator=torch.Generator().manual_seed(1))
    session_id: int | None = None
    for run, model, role in (
        ("reference", ResidualStack(depth, HIDDEN), None),
        ("noise", ResidualStack(depth, HIDDEN).to(torch.bfloat16), "noise"),
        ("candidate", ResidualStack(depth, HIDDEN, bug=bug).to(torch.bfloat16), None),
    ):
        with (
            torch.no_grad(),
            capture(model.eval(), session=name, run=run, role=role, data_dir=data, level="op") as result,
        ):
            model(x)
        session_id = result.session_id
    assert session_id is not None
    services = open_services(Settings.from_environ(data_dir=data))
    try:
        services.compute(session_id)
    finally:
        services.close()
    return session_id


def copy_session(engine: Engine, template: int, name: str) -> int:
    """A copy of session `template`'s rows (its runs, tensors, problems, pairs, unmatched tensors and hand pairings)
    under new ids, as session `name`: what the sessions list reads, in a fraction of a capture's time. The copy's
    tensors name the template's arrays (the list reads none)."""
    t = Base.metadata.tables

    def rows(table: str, where: ColumnElement[bool]) -> list[dict[str, Any]]:
        return [dict(r) for r in c.execute(select(t[table]).where(where).order_by(t[table].c.id)).mappings()]

    def new_ids(table: str, found: list[dict[str, Any]]) -> dict[int, int]:
        start = (c.scalar(select(func.max(t[table].c.id))) or 0) + 1
        return {row["id"]: start + k for k, row in enumerate(found)}

    with engine.begin() as c:
        session = rows("sessions", t["sessions"].c.id == template)
        sid = new_ids("sessions", session)[template]
        c.execute(insert(t["sessions"]), [{**session[0], "id": sid, "name": name}])
        runs = rows("runs", t["runs"].c.session_id == template)
        run = new_ids("runs", runs)
        for r in runs:
            against = r["compared_against_id"]
            r.update(id=run[r["id"]], session_id=sid, compared_against_id=run.get(against, against))
        c.execute(insert(t["runs"]), runs)
        tensors = rows("tensors", t["tensors"].c.run_id.in_(list(run)))
        tensor = new_ids("tensors", tensors)
        c.execute(insert(t["tensors"]), [{**r, "id": tensor[r["id"]], "run_id": run[r["run_id"]]} for r in tensors])
        for table, run_columns, id_lists in (
            ("problems", ("run_id",), ()),
            ("pairs", ("run_a_id", "run_b_id"), ("a_tensor_ids", "b_tensor_ids")),
            ("unmatched", ("run_id", "other_run_id"), ("tensor_ids",)),
            ("pair_overrides", ("run_b_id",), ()),
        ):
            column = t[table].c.run_id if table == "problems" else t[table].c.session_id
            found = rows(table, column.in_(list(run)) if table == "problems" else column == template)
            if not found:
                continue
            ids = new_ids(table, found)
            for r in found:
                r["id"] = ids[r["id"]]
                if "session_id" in r:
                    r["session_id"] = sid
                r.update({k: run[r[k]] for k in run_columns})
                r.update({k: _mapped(r[k], tensor) for k in id_lists})
            c.execute(insert(t[table]), found)
    return sid


def _mapped(ids: list[Any], tensor: dict[int, int]) -> list[Any]:
    """A JSON list of tensor ids (a pair side's shards; None for a missing shard) under the copy's ids."""
    return [tensor[i] if isinstance(i, int) else i for i in ids]


def build(data: Path, first: int, last: int, layers: list[int]) -> int:
    """Sessions `first` to `last - 1` (named "list i"): the first of each depth captured, the others copies of it;
    how many pairs (the rerun's too) they hold."""
    engine = create_db_engine(f"sqlite:///{data / 'metadata.sqlite3'}")
    try:
        for i in range(first, last):
            depth = layers[i % len(layers)]
            if i < len(layers):
                capture_session(data, f"list {i}", depth, bug=i % 2 == 1)
            else:
                with engine.connect() as c:
                    template = c.scalar(select(SessionRecord.id).where(SessionRecord.name == f"list {i % len(layers)}"))
                assert template is not None
                copy_session(engine, template, f"list {i}")
        with engine.connect() as c:
            names = [f"list {i}" for i in range(first, last)]
            ids = select(SessionRecord.id).where(SessionRecord.name.in_(names))
            pairs = c.scalar(select(func.count()).select_from(PairRecord).where(PairRecord.session_id.in_(ids)))
            return int(pairs or 0)
    finally:
        engine.dispose()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def serve(data: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tensor_debugger", "--data-dir", str(data), "serve", "--port", str(port), "--no-demo"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            httpx.get(base + "/api/sessions", timeout=5)
            return server, base
        except httpx.HTTPError:
            time.sleep(0.1)
    server.terminate()
    raise RuntimeError(f"the server on {base} did not answer in 60 s")


def server_cpu(pid: int) -> float:
    """CPU seconds (user and system) the server process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def keeps_figures(data: Path) -> bool:
    with sqlite3.connect(data / "metadata.sqlite3") as db:
        return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'session_figures'").fetchone() is not None


def forget_figures(data: Path) -> None:
    with sqlite3.connect(data / "metadata.sqlite3") as db:
        db.execute("DELETE FROM session_figures")


def load(client: httpx.Client, base: str, pid: int) -> tuple[float, float]:
    """One GET of the home page: wall ms and the server's CPU ms."""
    cpu, t0 = server_cpu(pid), time.perf_counter()
    answer = client.get(base + "/")
    answer.raise_for_status()
    return (time.perf_counter() - t0) * 1000, (server_cpu(pid) - cpu) * 1000


def medians(times: list[tuple[float, float]]) -> str:
    """The median wall and CPU ms of loads."""
    return f"{statistics.median(t[0] for t in times):,.0f} ms ({statistics.median(t[1] for t in times):,.0f} ms CPU)"


def measure(data: Path, repeats: int) -> dict[str, str]:
    server, base = serve(data)
    figures: dict[str, str] = {}
    try:
        with httpx.Client(timeout=600) as client:
            wall, cpu = load(client, base, server.pid)
            figures["first load"] = f"{wall:,.0f} ms ({cpu:,.0f} ms CPU)"
            figures["repeat loads"] = medians([load(client, base, server.pid) for _ in range(repeats)])
            if keeps_figures(data):
                every = []
                for _ in range(repeats):
                    forget_figures(data)
                    every.append(load(client, base, server.pid))
                figures["judged on every load"] = medians(every)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counts", default="1,10,50", help="numbers of sessions listed, ascending (default 1,10,50)")
    parser.add_argument("--layers", default="24,96,192", help="the sessions' depths, in turn (default 24,96,192)")
    parser.add_argument("--repeats", type=int, default=5, help="repeat loads per figure (default 5)")
    parser.add_argument(
        "--data-dir", type=Path, help="build into this new folder and keep it (default: a temporary one)"
    )
    args = parser.parse_args()
    counts = [int(c) for c in args.counts.split(",")]
    layers = [int(n) for n in args.layers.split(",")]
    import tensor_debugger

    print(f"{platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs")
    print(f"library: {Path(tensor_debugger.__file__).parent}; load {os.getloadavg()[0]:.1f}")
    data = args.data_dir or Path(tempfile.mkdtemp(prefix="sessions-list-"))
    try:
        built, pairs = 0, 0
        print("\n| sessions | op pairs | build s | first load | repeat loads | judged on every load |")
        print("| --- | --- | --- | --- | --- | --- |")
        for n in counts:
            t0 = time.perf_counter()
            pairs += build(data, built, n, layers)
            took, built = time.perf_counter() - t0, n
            figures = measure(data, args.repeats)
            print(
                f"| {n} | {pairs:,} | {took:.0f} | {figures['first load']} | {figures['repeat loads']} | "
                f"{figures.get('judged on every load', '—')} |",
                flush=True,
            )
        print(f"load after: {os.getloadavg()[0]:.1f}")
    finally:
        if args.data_dir is None:
            shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
