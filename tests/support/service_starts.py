"""The run's PostgreSQL cluster, SeaweedFS server and Dask cluster (tests/support/postgres.py, s3.py,
dask_cluster.py) started together, each in a thread of its own, the first time a test asks for one of them: every
one of the three that some collected test needs, so that the run waits for the slowest start instead of the sum of
the three (about 4 s instead of 12 s on a loaded machine). A run that needs none starts none."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

import pytest

from tests.support.dask_cluster import DaskCluster, start_dask
from tests.support.postgres import PostgresCluster, start_cluster
from tests.support.s3 import SeaweedS3, launch_seaweed

SERVICES = ("postgres", "s3", "dask_cluster")  # the fixtures of tests/conftest.py that return them
# a test parametrized (indirect) with these values asks for a service through request.getfixturevalue
INDIRECT = {
    "database_url": ("postgresql", "postgres"),
    "store_url": ("s3", "s3"),
    "dask_scheduler": ("dask", "dask_cluster"),
}

Service = PostgresCluster | SeaweedS3 | DaskCluster | str  # str: why it cannot start here (a skip)


class _Stoppable(Protocol):
    def stop(self) -> None: ...


def needed_services(items: Iterable[pytest.Item]) -> set[str]:
    """The services that the tests `items` ask for, by fixture name or through an indirect parameter; the Dask
    cluster's workers are given the S3 server's address, so it needs that too."""
    found: set[str] = set()
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        found |= names & set(SERVICES)
        found |= {service for fixture, (value, service) in INDIRECT.items() if params.get(fixture) == value}
    return found | ({"s3"} if "dask_cluster" in found else set())


class ServiceStarts:
    """Starts the services of the run in threads and hands each out once; `stop_unused` stops those started but never
    asked for (a run stopped early by -x, say)."""

    def __init__(self, needed: set[str], tmp_path_factory: pytest.TempPathFactory) -> None:
        self._needed = needed
        self._factory = tmp_path_factory
        self._pool = ThreadPoolExecutor(len(SERVICES), thread_name_prefix="service-start")
        self._futures: dict[str, Future[Service]] = {}
        self._handed: set[str] = set()
        self._seaweed: SeaweedS3 | str = "not launched"

    def take(self, name: str) -> Service:
        """The started service `name` (waiting for its start), or why there is none; starts it and the run's other
        needed services first if none has started yet."""
        if name not in self._futures:
            self._start_all({name} | self._needed)
        self._handed.add(name)
        return self._futures[name].result()

    def _start_all(self, names: set[str]) -> None:
        if "postgres" in names and "postgres" not in self._futures:
            self._futures["postgres"] = self._pool.submit(_migrated_cluster)
        if ("s3" in names or "dask_cluster" in names) and "s3" not in self._futures:
            self._seaweed = launch_seaweed(self._factory.mktemp("seaweedfs"))  # its ports known, not answering yet
            self._futures["s3"] = self._pool.submit(_ready, self._seaweed)
        if "dask_cluster" in names and "dask_cluster" not in self._futures:
            logs = self._factory.mktemp("dask")  # made here: the factory is not for threads
            # the S3 server's AWS variables; none where there is no SeaweedFS here (the workers then read arrays
            # in folders only)
            environ = self._seaweed.environ if isinstance(self._seaweed, SeaweedS3) else {}

            def dask() -> Service:
                return start_dask(logs, workers=2, environ=environ, dashboard=True)

            self._futures["dask_cluster"] = self._pool.submit(dask)

    def stop_unused(self) -> None:
        for name, future in self._futures.items():
            if name in self._handed:
                continue
            try:
                started = future.result()
            except Exception:  # noqa: BLE001 (its start failed: nothing to stop)
                continue
            if not isinstance(started, str):
                stoppable: _Stoppable = started
                stoppable.stop()
        self._pool.shutdown()


def _migrated_cluster() -> Service:
    """A started cluster whose migrated template is made (most tests on PostgreSQL ask for a migrated database)."""
    started = start_cluster()
    if isinstance(started, PostgresCluster):
        try:
            started.migrate_template()
        except BaseException:
            started.stop()
            raise
    return started


def _ready(launched: SeaweedS3 | str) -> Service:
    if isinstance(launched, SeaweedS3):
        launched.wait_ready()
    return launched
