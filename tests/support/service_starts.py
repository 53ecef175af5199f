"""The run's PostgreSQL cluster, SeaweedFS server and Dask cluster (tests/support/postgres.py, s3.py,
dask_cluster.py) started together, each in a thread of its own, the first time a test asks for one of them: every
one of the three that some collected test needs, so that the run waits for the slowest start instead of the sum of
the three (about 4 s instead of 12 s on a loaded machine). A run that needs none starts none. Each is shared by the
run's pytest workers (tests/support/run_services.py): a worker takes those another has recorded, waits for those
another is starting, and starts the rest."""

from __future__ import annotations

from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.support.dask_cluster import start_dask
from tests.support.postgres import PostgresCluster, start_cluster
from tests.support.run_services import Service, forget, lock, record, recorded, shared
from tests.support.s3 import SeaweedS3, launch_seaweed

SERVICES = ("postgres", "s3", "dask_cluster")  # the fixtures of tests/conftest.py that return them
# a test parametrized (indirect) with these values asks for a service through request.getfixturevalue
INDIRECT = {
    "database_url": ("postgresql", "postgres"),
    "store_url": ("s3", "s3"),
    "dask_scheduler": ("dask", "dask_cluster"),
}


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
    """Starts (or finds) the services of the run in threads and hands each out; `close` waits for starts under way,
    so that what they started is recorded for the controller to stop."""

    def __init__(self, needed: set[str], folder: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._needed = needed
        self._folder = folder  # the run's services folder (tests/support/run_services.py)
        self._factory = tmp_path_factory
        self._pool = ThreadPoolExecutor(len(SERVICES), thread_name_prefix="service-start")
        self._futures: dict[str, Future[Service]] = {}

    def take(self, name: str) -> Service:
        """The started service `name` (waiting for its start), or why there is none; starts it and the run's other
        needed services first if none has started yet."""
        if name not in self._futures:
            self._start_all({name} | self._needed)
        return self._futures[name].result()

    def _start_all(self, names: set[str]) -> None:
        if "postgres" in names and "postgres" not in self._futures:
            self._futures["postgres"] = self._pool.submit(shared, self._folder, "postgres", _migrated_cluster)
        seaweed: Service = "not launched"
        if ("s3" in names or "dask_cluster" in names) and "s3" not in self._futures:
            seaweed, self._futures["s3"] = self._seaweed()
        if "dask_cluster" in names and "dask_cluster" not in self._futures:
            logs = self._factory.mktemp("dask")  # made here: the factory is not for threads
            # the S3 server's AWS variables; none where there is no SeaweedFS here (the workers then read arrays
            # in folders only)
            environ = seaweed.environ if isinstance(seaweed, SeaweedS3) else {}

            def dask() -> Service:
                return start_dask(logs, workers=2, environ=environ, dashboard=True)

            self._futures["dask_cluster"] = self._pool.submit(shared, self._folder, "dask_cluster", dask)

    def _seaweed(self) -> tuple[Service, Future[Service]]:
        """The run's SeaweedFS, and its start: the recorded one; else one launched here (its ports known at once, for
        the Dask workers' environment), recorded at once (the controller stops it however the run ends) and handed
        out once it answers, its lock held until then."""
        held = lock(self._folder, "s3")
        found = recorded(self._folder, "s3")
        if found is not None:
            held.close()
            done: Future[Service] = Future()
            done.set_result(found)
            return found, done
        try:
            launched = record(self._folder, "s3", launch_seaweed(self._factory.mktemp("seaweedfs")))
        except BaseException:
            held.close()
            raise

        def ready() -> Service:
            with held:
                if isinstance(launched, SeaweedS3):
                    try:
                        launched.wait_ready()  # kills it if it never answers
                    except BaseException:
                        forget(self._folder, "s3")
                        raise
                return launched

        return launched, self._pool.submit(ready)

    def close(self) -> None:
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
