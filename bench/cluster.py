"""Benchmark of the cluster stack (PostgreSQL, S3 on SeaweedFS, Dask) against the local path, on the same data.

    python bench/cluster.py                         # 2 runs of 4 x 16 MiB float32 tensors; 1, 2 and 4 workers
    python bench/cluster.py --tensors 8 --tensor-mib 64 --dask-workers 1,2,4,8,16
    python bench/cluster.py --database sqlite       # no PostgreSQL binaries: the S3 rows on a SQLite file

It starts what it measures on loopback, as the tests do (tests/support: a private PostgreSQL cluster, a SeaweedFS
server, a Dask scheduler and worker processes of one thread each) and stops it at the end. Two runs are written
(the candidate differs from the reference in one value of each tensor), then:

- ingest: the real CLI ingests both runs into SQLite and a folder, and into PostgreSQL and S3: input MB/s, the
  S3 row's as a share of the local row's ("of local"), the CLI's CPU seconds and SeaweedFS's meanwhile;
- compare: the pairs of that session are computed in this process on SQLite and a folder (the local path: the
  compiled chunk loop, `Settings.threads` threads), on PostgreSQL and S3 in this process, and on PostgreSQL and S3
  by 1, 2 and 4 Dask workers (a fresh cluster for each count; the workers open the store and fetch the chunk
  objects themselves); before each, the results are deleted and the pairs made pending again; each is computed
  twice (the first time, Dask workers import the package and open the database and the store): MB/s of input
  (both sides) and its share of the local row's, the CPU seconds of this process (for the Dask rows, only what
  the client does), of SeaweedFS and of the Dask scheduler and workers the second time, and the verdicts, the
  same on every row;
- slices: windows of 64 and 64 x 64 values read at random places of one stored tensor from S3 and from the folder
  (`ArrayStore.reader`, as a slice request does): p50 and p99.

The last line gives each S3 row's MB/s as a share of the local row's, side by side. SeaweedFS's CPU seconds say
how much of the machine the S3 server itself took: on a machine of few cores it competes with the rows it serves.
`--s3-cores N` takes that competition out, as a deployment with S3 on other hosts has none: SeaweedFS and
PostgreSQL (every thread of theirs, and what they start later) run on the last N of this process's cores, and this
process, the CLI it runs and the Dask cluster on the others, for the local rows as well as the S3 rows. The line
"cores:" says which cores each side had. Without it nothing is pinned. `--unsigned-payload` gives the S3 rows'
processes `AWS_UNSIGNED_PAYLOAD=true` (no SHA-256 of each upload's body, on either side).

`--database sqlite` keeps the S3 rows' metadata in a SQLite file of their data dir instead of PostgreSQL (the rows
say "SQLite + S3"), for a machine without PostgreSQL's binaries: the Dask workers run on this machine and open the
same file. The store's share of the time is the same; the database holds only the rows.

On loopback the figures are this machine's CPU cost of each path, not a network's. With 2 cores the Dask rows show
the overhead and the shape of scaling more than any speed-up: 4 workers share the 2 cores with the scheduler,
PostgreSQL and SeaweedFS. A machine with more cores (the 16-core GPU machine) gives a fuller table. Nothing here
asserts on timings.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import psutil
from harness import child_env, machine_line, run_child_cpu, worker_counts
from s3_store import slice_latencies, write_run

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the same servers the tests start

from tests.support.dask_cluster import start_dask  # noqa: E402
from tests.support.postgres import PostgresCluster, start_cluster  # noqa: E402
from tests.support.s3 import SeaweedS3, start_seaweed  # noqa: E402

CLI = ROOT / ".venv" / "bin" / "tensor-debugger"


def cli_command() -> list[str]:
    """The CLI: the checkout's virtual environment's, else this interpreter's `-m tensor_debugger` (a machine where
    the packages are on PYTHONPATH, not in .venv)."""
    return [str(CLI)] if CLI.exists() else [sys.executable, "-m", "tensor_debugger"]


MB = 1e6


def cpu_seconds(pids: Sequence[int]) -> float:
    """User and system CPU seconds of the processes `pids` and their children so far (0 for one that is gone)."""
    total = 0.0
    for pid in pids:
        try:
            process = psutil.Process(pid)
            for each in (process, *process.children(recursive=True)):
                times = each.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def pin(pids: Sequence[int], cores: set[int]) -> None:
    """Run the processes `pids`, every thread of theirs and their children's, on `cores` only (a thread started
    later inherits its parent thread's cores)."""
    for pid in pids:
        try:
            process = psutil.Process(pid)
            processes = [process, *process.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for each in processes:
            try:
                threads = [thread.id for thread in each.threads()]
            except psutil.NoSuchProcess:
                continue
            for thread in threads:
                with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                    os.sched_setaffinity(thread, cores)


def split_cores(server_cores: int) -> tuple[set[int], set[int]]:
    """(this side's cores, the servers' cores): the last `server_cores` of this process's for the servers."""
    available = sorted(os.sched_getaffinity(0))
    if not 0 < server_cores < len(available):
        sys.exit(f"--s3-cores {server_cores}: give 1 to {len(available) - 1} of this process's cores {available}")
    return set(available[:-server_cores]), set(available[-server_cores:])


def postmaster_pid(cluster: PostgresCluster) -> int:
    """The PostgreSQL server's process id (pg_ctl starts it apart from this process), from its postmaster.pid."""
    return int((cluster.root / "data" / "postmaster.pid").read_text().split()[0])


def ingest(
    data: Path, env: dict[str, str], runs: tuple[Path, Path], weed: Callable[[], float]
) -> tuple[int, float, float, float]:
    """The session id, wall seconds and the CLI's CPU seconds of ingesting both runs with the CLI, one after the
    other, and SeaweedFS's CPU seconds meanwhile (`weed`: its CPU seconds so far)."""
    total = cli_cpu = 0.0
    session = 0
    weed_before = weed()
    for label, path in zip(("reference", "candidate"), runs, strict=True):
        command = [
            *cli_command(),
            "--data-dir",
            str(data),
            "ingest",
            "--session",
            "bench",
            "--run",
            label,
            str(path),
            "--json",
        ]
        wall, _, cpu, out = run_child_cpu(command, env)
        total += wall
        cli_cpu += cpu
        session = int(json.loads(out)["session"]["id"])
    return session, total, cli_cpu, weed() - weed_before


def compare(
    data: Path, stack: dict[str, str], session_id: int, others: Callable[[], tuple[float, float]], scheduler: str = ""
) -> tuple[float, float, float, float, float, list[str]]:
    """Wall seconds of computing the session's pairs afresh (results deleted first), the first time and again
    (Dask workers then have their imports, database connections and store open), this process's CPU seconds the
    second time, SeaweedFS's and the Dask cluster's then (`others`: their CPU seconds so far), and the verdicts."""
    from sqlalchemy import delete, update
    from tensor_debugger.compare.reports.pair_reports import session_pairs
    from tensor_debugger.services import open_services
    from tensor_debugger.settings import Settings
    from tensor_debugger.store.models import ComparisonResultRecord, PairRecord

    settings = Settings(
        data_dir=data,
        demo=False,
        database_url=stack.get("TENSOR_DEBUGGER_DATABASE_URL", ""),
        store_url=stack.get("TENSOR_DEBUGGER_STORE_URL", ""),
        dask_scheduler=scheduler,
    )
    services = open_services(settings, {k: v for k, v in stack.items() if k.startswith("AWS_")})
    try:
        services.plan(session_id)
        walls, cpu, weed, dask = [], 0.0, 0.0, 0.0
        for _ in range(2):
            with services.sessions.begin() as db:
                db.execute(update(PairRecord).values(status="pending", result_id=None, error=None))
                db.execute(delete(ComparisonResultRecord))
            start, cpu, (weed, dask) = time.perf_counter(), time.process_time(), others()
            services.compute(session_id)
            walls.append(time.perf_counter() - start)
            cpu = time.process_time() - cpu
            weed, dask = (after - before for after, before in zip(others(), (weed, dask), strict=True))
        with services.sessions() as db:
            verdicts = [str(p.status) for p in session_pairs(db, session_id).pairs]
    finally:
        services.close()
    return walls[0], walls[1], cpu, weed, dask, verdicts


def table(rows: list[tuple[str, ...]]) -> None:
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + " --- |" * len(rows[0]))
    for row in rows[1:]:
        print("| " + " | ".join(row) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tensors", type=int, default=4, help="tensors per run")
    parser.add_argument("--tensor-mib", type=int, default=16, help="MiB per tensor (float32, rows x 4096)")
    parser.add_argument("--dask-workers", type=worker_counts, default=[1, 2, 4], help="Dask worker counts: 1,2,4")
    parser.add_argument("--windows", type=int, default=200, help="slice windows read per size")
    parser.add_argument("--workdir", type=Path, default=ROOT / "bench-data" / "cluster")
    parser.add_argument(
        "--s3-cores",
        type=int,
        default=0,
        help="pin SeaweedFS and PostgreSQL to this many cores and everything measured to the others (0: no pinning)",
    )
    parser.add_argument(
        "--database",
        choices=("postgresql", "sqlite"),
        default="postgresql",
        help="the S3 rows' database: a private PostgreSQL cluster (default) or a SQLite file, for a machine without "
        "PostgreSQL's binaries (the Dask workers, on this machine, open the same file)",
    )
    parser.add_argument(
        "--unsigned-payload",
        action="store_true",
        help="AWS_UNSIGNED_PAYLOAD=true for the S3 rows: requests signed without a hash of their bodies",
    )
    args = parser.parse_args()
    pinned = split_cores(args.s3_cores) if args.s3_cores else None
    if pinned is not None:  # before any thread starts: every thread and child of this process inherits it
        os.sched_setaffinity(0, pinned[0])
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    signed = "; S3 requests signed without a hash of their bodies" if args.unsigned_payload else ""
    print(machine_line(f"{args.tensors} x {args.tensor_mib} MiB float32 per run; servers on loopback{signed}"))
    runs = (args.workdir / "reference", args.workdir / "candidate")
    size = write_run(runs[0], args.tensors, args.tensor_mib, 0.0)
    write_run(runs[1], args.tensors, args.tensor_mib, 0.5)
    postgres: PostgresCluster | str | None = start_cluster() if args.database == "postgresql" else None
    s3: SeaweedS3 | str = start_seaweed(args.workdir / "seaweedfs")
    try:
        if isinstance(postgres, str) or isinstance(s3, str):
            sys.exit(f"cannot start the stack: {postgres if isinstance(postgres, str) else s3}")
        local: dict[str, str] = {}
        cluster = {"TENSOR_DEBUGGER_STORE_URL": s3.new_url()}
        if postgres is not None:  # else the data dir's SQLite file
            cluster["TENSOR_DEBUGGER_DATABASE_URL"] = postgres.create_database()
        aws = {**s3.environ, **({"AWS_UNSIGNED_PAYLOAD": "true"} if args.unsigned_payload else {})}
        cluster.update(aws)
        weed_pid = s3.process.pid
        servers = "SeaweedFS and PostgreSQL" if postgres is not None else "SeaweedFS"
        s3_name = "PostgreSQL + S3" if postgres is not None else "SQLite + S3"
        if pinned is not None:
            pin([weed_pid, *([postmaster_pid(postgres)] if postgres is not None else [])], pinned[1])
            print(
                f"cores: this process, the CLI and the Dask cluster on {sorted(pinned[0])}; "
                f"{servers} on {sorted(pinned[1])}"
            )
        else:
            print(f"cores: not pinned: every process shares cores {sorted(os.sched_getaffinity(0))}")

        def weed() -> float:
            return cpu_seconds([weed_pid])

        sessions: dict[str, int] = {}
        ingested: list[tuple[str, ...]] = [
            ("ingest both runs (CLI)", "MB/s of input", "of local", "seconds", "CPU s CLI", "CPU s SeaweedFS")
        ]
        stacks = {
            "SQLite + folder": (args.workdir / "data-local", local),
            s3_name: (args.workdir / "data-cluster", cluster),
        }
        ingest_rates: list[float] = []
        for name, (data, stack) in stacks.items():
            sessions[name], wall, cli_cpu, weed_cpu = ingest(data, {**child_env(), **stack}, runs, weed)
            ingest_rates.append(2 * size / MB / wall)
            ratio = f"{ingest_rates[-1] / ingest_rates[0]:.0%}"
            ingested.append(
                (name, f"{ingest_rates[-1]:.1f}", ratio, f"{wall:.2f}", f"{cli_cpu:.2f}", f"{weed_cpu:.2f}")
            )
        compared: list[tuple[str, ...]] = [
            (
                "compare (the same session)",
                "MB/s of input",
                "of local",
                "seconds",
                "CPU s here",
                "CPU s SeaweedFS",
                "CPU s Dask",
                "first time: s",
                "verdicts",
            )
        ]
        expected: list[str] | None = None
        local_rate = 0.0
        ratios: dict[str, float] = {"ingest": ingest_rates[1] / ingest_rates[0]}

        def row(
            label: str, first: float, wall: float, cpu: float, weed_cpu: float, dask_cpu: float, verdicts: list[str]
        ) -> None:
            nonlocal expected, local_rate
            expected = expected or verdicts
            same = "same" if verdicts == expected else f"DIFFERENT: {verdicts}"
            rate = 2 * size / MB / wall
            local_rate = local_rate or rate
            ratios[label] = rate / local_rate
            compared.append(
                (
                    label,
                    f"{rate:.1f}",
                    f"{rate / local_rate:.0%}",
                    f"{wall:.2f}",
                    f"{cpu:.2f}",
                    f"{weed_cpu:.2f}",
                    f"{dask_cpu:.2f}" if dask_cpu else "",
                    f"{first:.2f}",
                    same,
                )
            )

        def stack_cpu(dask_pids: Sequence[int] = ()) -> Callable[[], tuple[float, float]]:
            return lambda: (weed(), cpu_seconds(dask_pids))

        data, cluster_data = stacks["SQLite + folder"][0], stacks[s3_name][0]
        row("local: SQLite + folder, in process", *compare(data, local, sessions["SQLite + folder"], stack_cpu()))
        row(f"{s3_name}, in process", *compare(cluster_data, cluster, sessions[s3_name], stack_cpu()))
        for workers in args.dask_workers:
            dask = start_dask(args.workdir / f"dask-{workers}", workers, aws)
            try:
                label = f"{s3_name}, {workers} Dask worker{'s' if workers > 1 else ''}"
                others = stack_cpu([p.pid for p in dask.processes])
                row(label, *compare(cluster_data, cluster, sessions[s3_name], others, dask.address))
            finally:
                dask.stop()
        sliced: list[tuple[str, ...]] = [("slice from", "64 p50", "64 p99", "64x64 p50", "64x64 p99")]
        for name, url, environ in (
            ("folder", (data / "arrays").resolve().as_uri(), {}),
            ("S3", cluster["TENSOR_DEBUGGER_STORE_URL"], aws),
        ):
            found: dict[str, Any] = slice_latencies(url, environ, args.windows)
            sliced.append((name, *(f"{found[k]:.2f} ms" for k in ("64 p50", "64 p99", "64x64 p50", "64x64 p99"))))
        for rows in (ingested, compared, sliced):
            print()
            table(rows)
        print("\nS3 against local (MB/s): " + ", ".join(f"{k}: {v:.0%}" for k, v in ratios.items() if v != 1.0))
        print(f"\nverdicts: {expected}")
    finally:
        for server in (postgres, s3):
            if server is not None and not isinstance(server, str):
                server.stop()
        if os.environ.get("KEEP_BENCH_DATA") is None:
            shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
