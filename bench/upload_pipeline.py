"""Time to the first pair result of an upload, against the time to ingest it: the server compares each pair as soon
as both its tensors are stored, while the rest of the runs ingest.

    python bench/upload_pipeline.py                      # 2 x 200 MB of float32 .pth, 32 files per run, in zips

The two runs of `bench/first_answer.py` (the candidate differs from layer 1 on) are uploaded together, with
`?wait=false`, to `tensor-debugger serve` on a new data dir (started, and its ingest processes started by a small
upload, before the clock starts), which ingests both at once in its child processes. The clock starts as the upload
begins; `/api/sessions/{id}/progress` is polled every 10 ms for: the first pair result (a pair compared while
ingesting, or a pair of the plan with a verdict), both runs ingested (ready), and every pair with a verdict.
Nothing asserts on timings.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from first_answer import PYTHON, serving
from harness import child_env, machine_line, run_child, zipped

POLL = 0.01  # seconds between two looks at the progress


def one_upload(url: str, name: str, a: Path, b: Path) -> dict[str, float]:
    """Upload the two runs and time, from the upload's start, what the progress shows."""
    marks: dict[str, float] = {}
    start = time.perf_counter()
    with a.open("rb") as fa, b.open("rb") as fb:
        response = httpx.post(
            f"{url}/api/sessions?wait=false",
            data={"name": name},
            files=[("reference", (a.name, fa)), ("candidate", (b.name, fb))],
            timeout=600,
        )
    if response.status_code != 202:
        sys.exit(f"the upload was refused: {response.status_code} {response.text[:2000]}")
    marks["upload sent"] = time.perf_counter() - start
    session_id = response.json()["session"]["id"]
    while True:
        progress: dict[str, Any] = httpx.get(f"{url}/api/sessions/{session_id}/progress", timeout=60).json()
        now = time.perf_counter() - start
        if progress["early"]["compared"] or progress["pairs"]["done"]:
            marks.setdefault("first pair result", now)
        if all(run["status"] == "ready" for run in progress["runs"]):
            marks.setdefault("both runs ingested", now)
        if progress["stage"] == "done":
            marks.setdefault("every pair's verdict", now)
            break
        if any(run["status"] == "failed" for run in progress["runs"]):
            sys.exit(f"a run failed: {progress}")
        time.sleep(POLL)
    pairs = httpx.get(f"{url}/api/sessions/{session_id}/pairs", timeout=60).json()
    if pairs["first_divergence"] is None:
        sys.exit("no first divergence found: the candidate differs from layer 1 on")
    return marks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=200, help="MB of float32 per run")
    parser.add_argument("--files", type=int, default=32, help=".pth files per run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=None, help="where to write (default: a temporary folder)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="upload-pipeline-", dir=args.workdir))
    env = child_env()
    first_answer = Path(__file__).with_name("first_answer.py")
    try:
        run_child(
            [str(PYTHON), str(first_answer), "--write-runs", str(work / "dump"), str(args.size_mb), str(args.files)],
            env,
        )
        a, b = zipped(work / "dump" / "reference"), zipped(work / "dump" / "candidate")
        run_child([str(PYTHON), str(first_answer), "--write-runs", str(work / "small"), "1", "9"], env)
        small = zipped(work / "small" / "reference"), zipped(work / "small" / "candidate")
        _, _, versions = run_child([str(PYTHON), "-c", "import torch; print(f'torch {torch.__version__}')"], env)
        print(machine_line(versions.strip()))
        print(
            f"an upload of two runs of {args.files} float32 .pth files, {args.size_mb} MB each, in zips; "
            f"{args.rounds} rounds"
        )
        rounds: list[dict[str, float]] = []
        for round_index in range(args.rounds):
            data = work / f"data-{round_index}"
            with serving(data, env) as url:
                one_upload(url, "warm-up", *small)  # the server's ingest processes start
                rounds.append(one_upload(url, "upload pipeline", a, b))
            shutil.rmtree(data, ignore_errors=True)
        print(f"{os.getloadavg()[0]:.1f} load average (1 minute) at the end")
        print(f"{'seconds from the upload start':30} {'median s':>9} {'min s':>7} {'max s':>7} {'x ingested':>11}")
        ingested = statistics.median(r["both runs ingested"] for r in rounds)
        for name in ("upload sent", "first pair result", "both runs ingested", "every pair's verdict"):
            values = [r[name] for r in rounds]
            median = statistics.median(values)
            print(f"{name:30} {median:9.2f} {min(values):7.2f} {max(values):7.2f} {median / ingested:11.2f}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
