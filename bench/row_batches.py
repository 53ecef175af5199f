"""CPU of writing a compare's rows, as ORM objects (one INSERT a row: their ids RETURNING, which SQLite keeps in no
order) against one INSERT of many rows (Core, every column, None as NULL), into a real SQLite file.

    python bench/row_batches.py              # 32 tensor rows a run, 2 runs, 32 pairs, 32 results; 200 repeats

The rows are those of `bench/first_answer.py`'s 2 x 200 MB compare (32 tensors a run, one pair and one result each);
each repeat writes them in new transactions, as an ingest's ending, a plan and a results flush do, and deletes them.
The figure is this process's CPU seconds (time.process_time) per repeat, the median of 5 blocks of repeats taken in
turn (ORM, rows, ORM, rows, ...)."""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, delete, insert
from sqlalchemy.orm import Session, sessionmaker
from tensor_debugger.store.models import ComparisonResultRecord, PairRecord, RunRecord, SessionRecord, TensorRecord
from tensor_debugger.store.models.base import Base


def tensor_row(run_id: int, i: int) -> dict[str, Any]:
    return dict(
        run_id=run_id,
        position=i,
        name=f"{i // 8}_stage{i % 8}",
        source_file=f"/dumps/run{run_id}.zip/{i}.pth",
        key_path=[],
        layer=i // 8,
        stage=f"stage{i % 8}",
        shape=[1525, 1024],
        dtype="float32",
        store_key=f"runs/{run_id}/{i}",
        nbytes=6246400,
        digest=f"blake3:{run_id:02d}{i:062d}",
        numel=1561600,
        min=-4.5,
        max=4.5,
        mean=0.001,
        std=1.0,
        nan_count=0,
        inf_count=0,
        module_path=None,
        place=None,
        source=None,
        has_values=True,
        sketch={"shape": [1525, 1024], "sum": 1.0, "sample_f64": "A" * 2700},
    )


def pair_row(session_id: int, a: int, b: int, i: int) -> dict[str, Any]:
    return dict(
        module_path=None,
        place=None,
        session_id=session_id,
        run_a_id=a,
        run_b_id=b,
        position=i,
        name=f"{i // 8}_stage{i % 8}",
        layer=i // 8,
        stage=f"stage{i % 8}",
        strategy="layer_stage",
        a_name=f"{i // 8}_stage{i % 8}",
        b_name=f"{i // 8}_stage{i % 8}",
        a_tensor_ids=[i + 1],
        b_tensor_ids=[i + 33],
        alignment={"steps": [], "shape_a": [1525, 1024], "shape_b": [1525, 1024]},
        alignment_overridden=False,
        status="pending",
    )


def result_row(n: int, i: int) -> dict[str, Any]:
    return dict(
        cache_key=f"{n:08d}{i:056d}",
        digests_a=[f"blake3:{i:064d}"],
        digests_b=[f"blake3:{i + 1:064d}"],
        alignment_key="same",
        rtol=1.3e-6,
        atol=1e-5,
        stats={"max_abs_diff": 0.004, "mean_abs_diff": 0.0008, "worst": [{"index": [1, 2], "a": 0.1}] * 8},
        profiles=None,
    )


def write(db_sessions: sessionmaker[Session], ids: tuple[int, int, int], n: int, orm: bool) -> None:
    session_id, a, b = ids
    for run_id in (a, b):
        with db_sessions.begin() as db:
            rows = [tensor_row(run_id, i) for i in range(32)]
            if orm:
                db.add_all([TensorRecord(**{k: v for k, v in r.items() if k != "has_values"}) for r in rows])
                db.flush()
            else:
                db.execute(insert(TensorRecord).execution_options(render_nulls=True), rows)
    with db_sessions.begin() as db:
        rows = [pair_row(session_id, a, b, i) for i in range(32)]
        if orm:
            db.add_all([PairRecord(**r) for r in rows])
            db.flush()
        else:
            db.execute(insert(PairRecord).execution_options(render_nulls=True), rows)
    with db_sessions.begin() as db:
        rows = [result_row(n, i) for i in range(32)]
        if orm:
            db.add_all([ComparisonResultRecord(**r) for r in rows])
            db.flush()
        else:
            db.execute(insert(ComparisonResultRecord).execution_options(render_nulls=True), rows)
    with db_sessions.begin() as db:
        for model in (PairRecord, TensorRecord):
            db.execute(delete(model))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        engine = create_engine(f"sqlite:///{Path(folder) / 'bench.sqlite3'}")
        Base.metadata.create_all(engine)
        db_sessions = sessionmaker(engine)
        with db_sessions.begin() as db:
            session = SessionRecord(name="bench")
            db.add(session)
            db.flush()
            runs = [RunRecord(session_id=session.id, label=x, role=x, position=i) for i, x in enumerate("ab")]
            db.add_all(runs)
            db.flush()
            ids = (session.id, runs[0].id, runs[1].id)
        per_repeat: dict[str, list[float]] = {"ORM objects": [], "one INSERT of many rows": []}
        n = 0
        for _ in range(5):
            for name in per_repeat:
                start = time.process_time()
                for _ in range(args.repeats // 5):
                    n += 1
                    write(db_sessions, ids, n, name == "ORM objects")
                per_repeat[name].append((time.process_time() - start) / (args.repeats // 5))
        for name, values in per_repeat.items():
            print(f"{name:26} {statistics.median(values) * 1000:7.2f} ms CPU a compare's rows (median of 5 blocks)")


if __name__ == "__main__":
    main()
