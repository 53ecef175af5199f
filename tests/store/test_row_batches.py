"""A compare's rows go into the database a table's rows in one INSERT (not one a row, nor one per run of rows that
leave out the same columns), and are stored with every value, defaults included, as the ORM stored them.

`bench/statements.py --uneven --baseline OTHER/server` compares every stored row with another checkout's."""

from __future__ import annotations

import json
import math
import re
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from sqlalchemy import event
from sqlalchemy.engine import Engine
from tensor_debugger.compare.compute.pending import FLUSH_SECONDS

from tests.support.cli_main import main_cli

INSERT = re.compile(r'^\s*INSERT INTO "?(\w+)"?')


@pytest.fixture
def inserts() -> Iterator[Counter[str]]:
    """The INSERT statements this process sends any database, by table (a batch of many rows is one)."""
    counts: Counter[str] = Counter()

    def count(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        found = INSERT.match(statement)
        if found:
            counts[found.group(1)] += 1

    event.listen(Engine, "before_cursor_execute", count)
    try:
        yield counts
    finally:
        event.remove(Engine, "before_cursor_execute", count)


def runs(folder: Path) -> tuple[Path, Path]:
    """Two runs of 12 tensors: the first layer's bit-identical (they share arrays), one tensor each side lacks,
    one of another shape, a NaN-only tensor (no finite statistics: None among the values), a file with no tensor
    and one that is no PyTorch file (problems)."""
    generator = torch.Generator().manual_seed(3)
    a, b = folder / "reference", folder / "candidate"
    a.mkdir()
    b.mkdir()
    for layer in range(3):
        for stage in ("attn", "mlp", "out"):
            values = torch.randn(6, 4, generator=generator)
            torch.save(values, a / f"{layer}_{stage}.pth")
            torch.save(values if layer == 0 else values + 0.01, b / f"{layer}_{stage}.pth")
    torch.save(torch.full((3,), float("nan")), a / "3_nan.pth")
    torch.save(torch.full((3,), float("nan")), b / "3_nan.pth")
    torch.save(torch.zeros(5, 5), b / "1_mlp.pth")  # another shape
    (b / "2_out.pth").unlink()
    torch.save(torch.ones(2), b / "logits.pth")
    torch.save({"step": 3, "note": "text"}, b / "meta.pth")  # an int (a tensor) and a str (not one)
    (b / "broken.pth").write_bytes(b"not a pickle")
    return a, b


def rows(database: Path, table: str) -> list[dict[str, Any]]:
    connection = sqlite3.connect(database)
    connection.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in connection.execute(f"SELECT * FROM {table} ORDER BY id")]  # noqa: S608
    finally:
        connection.close()


def test_a_compares_rows_go_in_one_insert_a_table_with_their_defaults(tmp_path: Path, inserts: Counter[str]) -> None:
    a, b = runs(tmp_path)
    data = tmp_path / "data"
    started = time.monotonic()
    done = main_cli("--data-dir", str(data), "compare", str(a), str(b), "--json", "--in-process")
    took = time.monotonic() - started
    answer = json.loads(done.stdout)
    assert done.returncode == 2, done.stderr  # problems in the candidate's files
    assert answer["unmatched"] == {"a": ["2_out"], "b": ["logits", "meta.step"]}
    # one INSERT a run (each run's tensors), a plan (pairs, unmatched), a run's problems; results: one a flush (the
    # first at once, then at most one each FLUSH_SECONDS while the compare runs, and the last), never one a pair
    assert inserts["tensors"] == 2
    assert inserts["pairs"] == 1
    assert inserts["unmatched"] == 1
    assert inserts["problems"] == 1
    stored = len(rows(data / "metadata.sqlite3", "comparison_results"))
    assert 1 <= inserts["comparison_results"] <= min(stored, 2 + math.ceil(took / FLUSH_SECONDS)), (inserts, took)

    database = data / "metadata.sqlite3"
    tensors = rows(database, "tensors")
    assert len(tensors) == 10 + 11  # the candidate's: 8 of the layers', 3_nan, logits and meta.pth's int
    for t in tensors:  # what the ORM stored for what a row left to the defaults
        assert t["has_values"] == 1
        assert t["key_path"] == ('["step"]' if t["name"] == "meta.step" else "[]")
        assert t["module_path"] is None and t["place"] is None and t["source"] is None
    nan = [t for t in tensors if t["name"] == "3_nan"]
    assert [(t["min"], t["max"], t["nan_count"], t["inf_count"]) for t in nan] == [(None, None, 3, 0)] * 2
    # the first layer's tensors are the same bytes in both runs: both rows name one array
    by_name: dict[str, set[str]] = {}
    for t in tensors:
        if t["name"].startswith("0_"):
            by_name.setdefault(t["name"], set()).add(t["store_key"])
    assert by_name and all(len(keys) == 1 for keys in by_name.values())

    pairs = rows(database, "pairs")
    assert [p["position"] for p in pairs] == list(range(len(pairs)))
    incomparable = [p for p in pairs if p["name"] == "1_mlp"]
    assert [(p["status"], p["alignment"], p["result_id"]) for p in incomparable] == [("incomparable", "null", None)]
    assert all(p["alignment_overridden"] == 0 and p["error"] is None for p in pairs)
    assert all(p["result_id"] is not None for p in pairs if p["status"] in ("pass", "fail"))
    unmatched = rows(database, "unmatched")
    assert [(u["name"], u["allowed"], u["before_position"] is None) for u in unmatched] == [
        ("2_out", 0, False),
        ("logits", 0, True),
        ("meta.step", 0, True),
    ]
    problems = rows(database, "problems")
    assert sorted((Path(p["file"]).name, p["ignored"], p["note"]) for p in problems) == [
        ("broken.pth", 0, 0),
        ("meta.pth[note]", 1, 0),
    ]
    results = rows(database, "comparison_results")
    assert len(results) == len({p["result_id"] for p in pairs if p["result_id"] is not None})
    assert all(r["profiles"] == "null" and r["created_at"] is not None for r in results)
