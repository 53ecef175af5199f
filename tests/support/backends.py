"""The metadata databases and array stores a representative set of tests runs on, for
`pytest.mark.parametrize(("database_url", "store_url"), BACKENDS, indirect=True)`: each database with the arrays
in a folder, and S3 with SQLite (the database and the store are independent parts: both at once would test
nothing either does not test alone, at the cost of one more run of each test)."""

from __future__ import annotations

import pytest

BACKENDS = [
    pytest.param("sqlite", "files", id="sqlite-files"),
    pytest.param("postgresql", "files", id="postgresql-files"),
    pytest.param("sqlite", "s3", id="sqlite-s3"),
]
