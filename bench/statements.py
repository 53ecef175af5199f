"""The SQL statements `tensor-debugger compare A B` sends to its database, by verb and table, and the rows stored.

    python bench/statements.py                              # 2 x 200 MB of float32 .pth in zips (first_answer's)
    python bench/statements.py --size-mb 20 --baseline /elsewhere/server   # also another checkout's, then compare
    python bench/statements.py --dump rows.json             # write every row of every table (to diff by hand)
    python bench/statements.py --uneven --baseline ...      # with unmatched tensors and an incomparable pair

Writes the two runs `bench/first_answer.py` writes, then runs the CLI's cold compare (`--data-dir NEW compare A B
--json`) in a child whose Python starts with a `sitecustomize` (on PYTHONPATH, inherited by the ingest children)
that counts every statement SQLAlchemy hands the DB-API cursor (`before_cursor_execute` on every Engine): one line
per verb and table, the cursor calls, the rows they carried (an executemany's parameter sets, or a multi-VALUES
INSERT's rows) and how many were executemany. An INSERT of N rows that takes more than one call was split into
batches (SQLAlchemy's insertmanyvalues starts a new batch wherever a row's set of keys differs from the one before).

Then every row of every table in the data dir's SQLite file is read back; with `--baseline`, the same is done with
the package found there, and the two databases are compared column by column, row by row (rows in primary-key
order; the columns that hold a clock time or a random id are compared by whether they are NULL only, and named).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sqlite3
import sys
import tempfile
from collections import Counter
from pathlib import Path

from harness import child_env, run_child

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv" / "bin" / "python"
HERE = Path(__file__).resolve().parent

SITECUSTOMIZE = r"""
import atexit, json, os, re, traceback
from collections import Counter

_counts = Counter()
_path = os.environ.get("STATEMENTS_OUT")
_where = os.environ.get("STATEMENTS_WHERE") == "1"


def _install():
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    pattern = re.compile(r"^\s*(INSERT INTO|UPDATE|DELETE FROM|SELECT .*? FROM|SELECT|PRAGMA|[A-Z]+)\s*\"?(\w*)", re.S)

    @event.listens_for(Engine, "before_cursor_execute")
    def _count(conn, cursor, statement, parameters, context, executemany):
        found = pattern.match(statement)
        verb = found.group(1).split()[0] if found else statement[:10]
        table = found.group(2) if found and verb in ("INSERT", "UPDATE", "DELETE", "SELECT") else ""
        if verb == "INSERT" and " VALUES " in statement:
            groups = statement.count("), (") + 1  # insertmanyvalues: one call, many VALUES groups
        else:
            groups = 1
        nested = isinstance(parameters, (list, tuple)) and bool(parameters)
        nested = nested and isinstance(parameters[0], (list, tuple, dict))
        rows = len(parameters) if executemany and nested else groups  # a real executemany, or one (batched) call
        if _where and verb in ("INSERT", "UPDATE", "DELETE"):
            frames = [f for f in traceback.extract_stack() if "/tensor_debugger/" in f.filename]
            if frames:
                f = frames[-1]
                table = f"{table} @{f.filename.split('/tensor_debugger/', 1)[1]}:{f.lineno}"
        _counts[(verb, table, "calls")] += 1
        _counts[(verb, table, "rows")] += rows
        _counts[(verb, table, "executemany")] += int(bool(executemany))


if _path:
    try:
        _install()
    except ImportError:
        pass

    @atexit.register
    def _dump():
        if _counts:
            with open(f"{_path}.{os.getpid()}", "w") as f:
                json.dump([[*k, v] for k, v in _counts.items()], f)
"""

VOLATILE = re.compile(
    r"(_at|_time|time|uuid|token|pid|host|_ns|seconds|elapsed|took|claimed_by|claimed_until|database_id)$", re.I
)


def count(
    server: Path | None, work: Path, a: Path, b: Path, env: dict[str, str], label: str, where: str
) -> tuple[Counter[tuple[str, str, str]], Path]:
    hooks = work / f"hooks-{label}"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    out = work / f"counts-{label}"
    data = work / f"data-{label}"
    paths = [str(hooks)] + ([str(server)] if server is not None else [])
    child = {**env, "PYTHONPATH": os.pathsep.join(paths), "STATEMENTS_OUT": str(out), "STATEMENTS_WHERE": where}
    # exit 1: the runs diverged (first_answer's do); 2: some files had problems (--uneven's)
    command = [str(PYTHON), "-m", "tensor_debugger", "--data-dir", str(data), "compare", str(a), str(b), "--json"]
    run_child(command, child, ok=frozenset({0, 1, 2}))
    counts: Counter[tuple[str, str, str]] = Counter()
    for part in work.glob(f"counts-{label}.*"):
        for verb, table, what, n in json.loads(part.read_text()):
            counts[(verb, table, what)] += n
    return counts, data


def show(counts: Counter[tuple[str, str, str]], title: str) -> None:
    print(f"\n{title}: statements by verb and table (cursor calls, rows, of them executemany)")
    keys = sorted({(v, t) for v, t, _ in counts}, key=lambda k: (k[0] != "INSERT", k[0] != "UPDATE", k))
    total = 0
    for verb, table in keys:
        calls = counts[(verb, table, "calls")]
        total += calls
        print(
            f"  {verb:8} {table or '-':48} {calls:6} calls {counts[(verb, table, 'rows')]:7} rows "
            f"{counts[(verb, table, 'executemany')]:5} executemany"
        )
    print(f"  all: {total} calls")


def database(data: Path) -> Path:
    found = sorted(p for p in data.rglob("*") if p.is_file() and p.suffix in (".db", ".sqlite", ".sqlite3"))
    if not found:
        sys.exit(f"no SQLite file under {data}")
    return found[0]


def rows(path: Path) -> dict[str, tuple[list[str], list[tuple[object, ...]]]]:
    """Every table's columns and rows, in primary-key (else rowid) order."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [r[0] for r in connection.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")]
        found = {}
        for table in tables:
            info = connection.execute(f'PRAGMA table_info("{table}")').fetchall()
            columns = [c[1] for c in info]
            keys = [c[1] for c in sorted(info, key=lambda c: c[5]) if c[5]] or ["rowid"]
            order = ", ".join(f'"{k}"' if k != "rowid" else k for k in keys)
            found[table] = (columns, connection.execute(f'SELECT * FROM "{table}" ORDER BY {order}').fetchall())
        return found
    finally:
        connection.close()


UNEVEN = r"""
import sys, torch
from pathlib import Path
b = Path(sys.argv[1])
(b / "3_post_mlp.pth").unlink()
torch.save(torch.ones(4), b / "logits_extra.pth")
torch.save({"step": 3, "note": "no tensor"}, b / "meta.pth")  # a problem row (a file without a tensor)
(b / "broken.pth").write_bytes(b"not a pickle")  # and another
torch.save(torch.zeros(3, 5), b / "2_query.pth")
"""

RUN_COLUMNS = {"run_id", "run_a_id", "run_b_id", "other_run_id", "compared_against_id"}


def canonical(tables: dict[str, tuple[list[str], list[tuple[object, ...]]]]) -> dict[str, list[tuple[object, ...]]]:
    """Each table's rows with what depends on the order the two runs' ingests (concurrent) happened to finish in
    put in terms of the runs' labels: run ids, `runs/<id>/` in store keys, a tensor's id as its run and name, a
    comparison result's id as its digests; the rows then sorted. Clock times and random ids are kept by whether
    they are NULL only (VOLATILE)."""
    runs = {row[0]: row[tables["runs"][0].index("label")] for row in tables["runs"][1]}
    key = re.compile(r"runs/(\d+)/")
    columns = tables["tensors"][0]
    at = {c: columns.index(c) for c in ("id", "run_id", "name", "digest", "store_key")}
    tensors = {r[at["id"]]: (runs.get(r[at["run_id"]]), r[at["name"]]) for r in tables["tensors"][1]}
    keys_of: dict[object, set[object]] = {}
    for r in tables["tensors"][1]:
        keys_of.setdefault(r[at["digest"]], set()).add(r[at["store_key"]])

    def value(table: str, column: str, v: object, row: dict[str, object]) -> object:
        if column in RUN_COLUMNS or (table == "runs" and column == "id"):
            return ("run", runs.get(v, v)) if v is not None else None
        if table == "tensors" and column == "id":
            return ("tensor", runs.get(row["run_id"]), row["name"])
        if table == "comparison_results" and column == "id" or table == "pairs" and column == "result_id":
            return "result" if v is not None else None
        if VOLATILE.search(column):
            return "(set)" if v is not None else None
        if column.endswith("tensor_ids") and isinstance(v, str):
            return [tensors.get(i, i) for i in json.loads(v)]
        if table == "tensors" and column == "store_key" and isinstance(v, str):
            # which run's copy of a tensor both runs hold is kept is whichever finished first: the key's tail, and
            # how many keys the rows of its digest name (1: shared), are what must stay
            return (key.sub("runs/*/", v), len(keys_of[row["digest"]]))
        if isinstance(v, str):
            return key.sub(lambda m: f"runs/{runs.get(int(m.group(1)), m.group(1))}/", v)
        return v

    found = {}
    for table, (columns, rows) in tables.items():
        made = []
        for r in rows:
            named = dict(zip(columns, r, strict=True))
            made.append(tuple(value(table, c, v, named) for c, v in named.items()))
        found[table] = sorted(made, key=repr)
    return found


def compare(before: Path, after: Path) -> bool:
    old_tables, new_tables = rows(before), rows(after)
    same = True
    if set(old_tables) != set(new_tables):
        print(f"tables differ: {sorted(old_tables)} before, {sorted(new_tables)} after")
        return False
    old, new = canonical(old_tables), canonical(new_tables)
    values = 0
    for table in sorted(old):
        columns = old_tables[table][0]
        if columns != new_tables[table][0]:
            print(f"{table}: columns differ: {columns} vs {new_tables[table][0]}")
            same = False
            continue
        if len(old[table]) != len(new[table]):
            print(f"{table}: {len(old[table])} rows before, {len(new[table])} after")
            same = False
            continue
        values += len(old[table]) * len(columns)
        for i, (x, y) in enumerate(zip(old[table], new[table], strict=True)):
            for column, u, v in zip(columns, x, y, strict=True):
                if u != v or type(u) is not type(v):
                    print(f"{table} row {i} {column}: {str(u)[:200]!r} before, {str(v)[:200]!r} after")
                    same = False
    print(
        f"\nrows compared: {sum(len(t) for t in new.values())} rows in {len(new)} tables, {values} values; "
        f"{'all the same' if same else 'DIFFERENT'} (run ids as the runs' labels; clock times and random ids "
        f"by whether they are NULL)"
    )
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=200, help="MB of float32 per run")
    parser.add_argument("--files", type=int, default=32, help=".pth files per run")
    parser.add_argument("--form", choices=("archives", "folders"), default="archives")
    parser.add_argument("--baseline", type=Path, default=None, help="another checkout's server/ folder, compared")
    parser.add_argument("--uneven", action="store_true", help="runs with unmatched tensors and a shape changed")
    parser.add_argument("--where", action="store_true", help="by the line of tensor_debugger that wrote, too")
    parser.add_argument("--dump", type=Path, default=None, help="write every table's rows here as JSON")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="statements-"))
    env = child_env()
    try:
        writer = HERE / "first_answer.py"
        run_child(
            [str(PYTHON), str(writer), "--write-runs", str(work / "dump"), str(args.size_mb), str(args.files)],
            env,
        )
        a, b = work / "dump" / "reference", work / "dump" / "candidate"
        if args.uneven:  # unmatched tensors, an incomparable pair, problems
            run_child([str(PYTHON), "-c", UNEVEN, str(b)], env)
        if args.form == "archives":
            sys.path.insert(0, str(HERE))
            from harness import zipped

            a, b = zipped(a), zipped(b)
        counts, data = count(None, work, a, b, env, "this", str(int(args.where)))
        show(counts, f"this checkout ({ROOT / 'server'})")
        if args.dump is not None:
            tables = rows(database(data))
            dumped = {t: [c, [list(map(repr, r)) for r in rs]] for t, (c, rs) in tables.items()}
            args.dump.write_text(json.dumps(dumped))
        if args.baseline is not None:
            base, base_data = count(args.baseline.resolve(), work, a, b, env, "baseline", str(int(args.where)))
            show(base, f"baseline ({args.baseline})")
            print(f"\nbefore: {database(base_data)}\nafter: {database(data)}")
            if not compare(database(base_data), database(data)):
                sys.exit(1)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
