"""The stacks a representative set of tests (the API's, the CLI's and the pairs') runs on, for
`pytest.mark.parametrize(BACKEND_FIXTURES, BACKENDS, indirect=True)`: the embedded default, SQLite with arrays in
a folder and pairs computed in the process; and the cluster, PostgreSQL with arrays in S3 (SeaweedFS) and pairs
computed by Dask workers, one of each for the whole run (tests/conftest.py). Each part alone has tests of its own
(tests/support/postgres.py's DATABASES, tests/support/s3.py's STORES, tests/compare/test_dask.py)."""

from __future__ import annotations

import pytest

BACKEND_FIXTURES = ("database_url", "store_url", "dask_scheduler")
BACKENDS = [
    pytest.param("sqlite", "files", "", id="sqlite-files"),
    pytest.param("postgresql", "s3", "dask", id="postgresql-s3-dask"),
]
