"""A cluster's first start, many times: replicas of `serve` started at once on an empty PostgreSQL database and an
empty S3 prefix (a private PostgreSQL cluster and SeaweedFS server on loopback, as the tests start them).

    python bench/first_start.py                  # 10 rounds of 4 replicas
    python bench/first_start.py --rounds 20 --replicas 8

Each round must end with every replica up, one schema (the newest revision), one database id and the store's marker
naming it; the script prints each round and exits 1 if any round did not. Without the migration lock all but one
replica of a round failed (UniqueViolation on pg_type_typname_nsp_index). Timings are wall seconds until the last
replica answered, on this machine, for orientation only.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from harness import machine_line

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support: the same servers the tests start

from tensor_debugger.resources import resource_dir  # noqa: E402
from tensor_debugger.store.database import head_revision  # noqa: E402

from tests.support.first_start import start_replicas_at_once  # noqa: E402
from tests.support.postgres import start_cluster  # noqa: E402
from tests.support.s3 import start_seaweed  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--replicas", type=int, default=4)
    args = parser.parse_args()
    print(machine_line("PostgreSQL and SeaweedFS on loopback"))
    head = head_revision(resource_dir("migrations") / "versions")
    root = Path(tempfile.mkdtemp(prefix="first-start-"))
    postgres = start_cluster()
    s3 = start_seaweed(root / "s3")
    if isinstance(postgres, str) or isinstance(s3, str):
        print(f"cannot run: {postgres if isinstance(postgres, str) else s3}", file=sys.stderr)
        return 2
    failed = 0
    try:
        for round_ in range(args.rounds):
            database_url = postgres.create_database("first_start", migrated=False)
            env = {"TENSOR_DEBUGGER_STORE_URL": s3.new_url(), **s3.environ}
            result = start_replicas_at_once(root / f"round{round_}", database_url, env, args.replicas)
            ok = (
                not result.exits
                and result.answered == args.replicas
                and result.versions == [head]
                and len(result.database_ids) == 1
                and result.marker == result.database_ids[0]
            )
            failed += not ok
            print(
                f"round {round_ + 1}: {result.answered}/{args.replicas} up in {result.seconds:.1f} s, "
                f"schema {result.versions}, database ids {len(result.database_ids)}, marker "
                f"{'matches' if result.database_ids[:1] == [result.marker] else 'differs'}"
                + ("" if ok else f"  FAILED {result.exits}"),
                flush=True,
            )
    finally:
        s3.stop()
        postgres.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"{args.rounds - failed} of {args.rounds} rounds: every replica up, one schema, one id")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
