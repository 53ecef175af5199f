"""A cluster's first start: replicas started together on an empty PostgreSQL database and an empty S3 prefix end
with one schema, one database id and the store's marker naming it, and all of them up (migrations take an advisory
lock: without it, all but one failed creating the same tables). Two rounds here; bench/first_start.py runs more."""

from __future__ import annotations

from pathlib import Path

from tensor_debugger.resources import resource_dir
from tensor_debugger.store.database import head_revision

from tests.support.first_start import start_replicas_at_once
from tests.support.postgres import PostgresCluster
from tests.support.s3 import SeaweedS3

REPLICAS = 4


def test_replicas_starting_together_on_an_empty_database_all_come_up(
    tmp_path: Path, postgres: PostgresCluster, s3: SeaweedS3
) -> None:
    head = head_revision(resource_dir("migrations") / "versions")
    for round_ in range(2):
        database_url = postgres.create_database("first_start", migrated=False)
        env = {"TENSOR_DEBUGGER_STORE_URL": s3.new_url(), **s3.environ}
        result = start_replicas_at_once(tmp_path / f"round{round_}", database_url, env, REPLICAS)
        assert result.exits == [] and result.answered == REPLICAS, result
        assert result.versions == [head]
        assert len(result.database_ids) == 1 and result.marker == result.database_ids[0]
