"""The parts one process works with, built from Settings: database, array store, ingestor and its queue."""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sqlalchemy import Engine
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.compare.compute.computation import Computation, LocalComputation
from tensor_debugger.compare.compute.early_uploads import EarlyUploads
from tensor_debugger.compare.compute.sent_pairs import child_lockstep
from tensor_debugger.compare.compute.worker import ComparisonWorker
from tensor_debugger.compare.context import CompareContext, open_context
from tensor_debugger.compare.reports.pair_rows import StatsCache
from tensor_debugger.ingest import staging
from tensor_debugger.ingest.recovery import RecoveryReport, TakeOver, recover, remove_dead_ingests
from tensor_debugger.ingest.runs import Ingestor
from tensor_debugger.settings import Settings
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.claims import Claims
from tensor_debugger.store.database import (
    create_db_engine,
    database_outage,
    database_setting_problem,
    make_sessionmaker,
    upgrade_database,
)
from tensor_debugger.store.identity import pair
from tensor_debugger.store.models import RunRecord
from tensor_debugger.store.sign_outs import SignOuts

if TYPE_CHECKING:
    from tensor_debugger.compare.actions import SessionActions
    from tensor_debugger.ingest.queue import IngestQueue

log = logging.getLogger(__name__)


@dataclass
class Services:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Any]
    store: ArrayStore
    claims: Claims  # this process's claims on pending pairs and runs it ingests, renewed by a heartbeat
    ingestor: Ingestor
    context: CompareContext  # what planning, computing and reports of pairs work with
    compute: Computation  # computes pending pairs: here, or on the Dask cluster the settings name
    recovery: RecoveryReport
    stats: StatsCache = field(init=False, default_factory=StatsCache)  # decoded results, for the pages and the API
    worker: ComparisonWorker = field(init=False)  # computes pending pairs in the background once the server starts it
    sign_outs: SignOuts = field(init=False)  # browser sessions signed out (web/auth.py)
    early: EarlyUploads = field(init=False)  # their pairs compared while they ingest
    taking_over: bool = field(init=False, default=False)  # a server: takes over uploads whose ingest died

    def __post_init__(self) -> None:
        self.worker = ComparisonWorker(self.compute, self.settings.compare_idle_seconds)
        self.sign_outs = SignOuts(self.sessions)
        self.early = EarlyUploads(self.context)
        # not fields: the web framework reads the fields' types, and theirs are imported on first use
        self._actions: SessionActions | None = None
        self._ingests: IngestQueue | None = None
        self._made = threading.RLock()  # the queue is handed `plan`, which makes the actions
        self.claims.start(also=self.remove_dead_ingests)

    @property
    def actions(self) -> SessionActions:
        """What users do to sessions and pairs, one call per action. Made on first use: `compare` plans and reports
        through the pipeline, which imports the planning and the reports while its runs ingest
        (`compare/pipeline.py`), not at start-up."""
        with self._made:
            if self._actions is None:
                from tensor_debugger.compare.actions import SessionActions

                self._actions = SessionActions(self.sessions, self.context, self.worker.wake)
            return self._actions

    @property
    def ingests(self) -> IngestQueue:
        """Uploads ingested in the background, in child processes (threads and children start on demand). Made on
        first use, a server's: a command that ingests in its own threads (`compare`, `ingest`) imports none of the
        queue's and the children's machinery (multiprocessing and its process pools)."""
        with self._made:
            if self._ingests is None:
                from tensor_debugger.ingest.child import ChildIngests
                from tensor_debugger.ingest.queue import IngestQueue

                at_once = self.settings.ingest_workers
                # started by a server's first ingest; an upload's reference and candidate ingest at once in one of
                # them, their pairs compared from the blocks as they are read (compare/compute/sent_pairs.py)
                children = ChildIngests(self.settings, self.ingestor, at_once, child_lockstep)
                # with a Dask cluster the pairs are computed by its workers once planned, not here while their runs
                # ingest
                watcher = None if self.compute.remote else self.early
                self._ingests = IngestQueue(self.ingestor, self.plan, at_once, children, watcher)
            return self._ingests

    def remove_dead_ingests(self) -> None:
        """Remove the runs of ingests that died meanwhile (another replica's, whose lease expired); a server takes
        over those of accepted uploads (`take_over_uploads`)."""
        remove_dead_ingests(
            self.sessions, self.store, self.ingestor.live_runs, self.claims, self.ingestor.resumable, self._take_over()
        )

    def take_over_uploads(self) -> None:
        """From now on (a server, once started), ingest the accepted uploads whose ingest died (this server's last
        process, a replica killed) from their staged files: at once, then on the claims' heartbeat."""
        self.taking_over = True
        try:
            self.remove_dead_ingests()
        except Exception:  # the database or the store did not answer: the heartbeat tries again
            log.exception("taking over the uploads whose ingest died failed")

    def _take_over(self) -> TakeOver | None:
        if not self.taking_over:
            return None

        from tensor_debugger.ingest.queue import IngestJob

        def take_over(db: DbSession, run: RunRecord) -> Callable[[], object]:
            pending, inputs = self.ingestor.take_over(db, run)
            log.warning("run %s's ingest died; this process ingests it again from its staged files", run.id)
            done = functools.partial(self.ingestor.release_staged, inputs)
            return functools.partial(self.ingests.submit, IngestJob(pending, inputs, True, done))

        return take_over

    def plan(self, session_id: int) -> None:
        """Pair the session's runs again (after an ingest or a user's override) and let the worker know: what
        `actions.plan` does, without importing the actions (the reports and hand pairing they use: about 0.1 s of
        CPU, which a process's first capture paid after its forward, when it paired its session). The planning
        itself is imported here, on first use: `compare` imports it while its runs ingest (compare/pipeline.py)."""
        from tensor_debugger.compare.planning.plan import plan_session

        plan_session(self.context, session_id)
        self.worker.wake()

    def sweep(self) -> None:
        """Remove what processes killed meanwhile left behind: their runs still "ingesting" (arrays and all) and
        their staging folders. A server calls it every `staging_sweep_seconds`."""
        self.recovery = recover(
            self.sessions, self.store, self.ingestor.live_runs, self.claims, self.ingestor.resumable, self._take_over()
        )
        staging.sweep(self.settings.staging_dir, self.ingestor.staged_folders())

    def close(self) -> None:
        with self._made:
            ingests = self._ingests
        if ingests is not None:
            ingests.close()
        self.early.close()
        self.claims.stop()
        self.compute.close()
        self.context.close()
        self.engine.dispose()


def open_services(settings: Settings, environ: Mapping[str, str] | None = None, writes: bool = True) -> Services:
    """Migrate the database to the newest schema, check that it and the array store are one pair (StorePairingError
    where not, before anything is deleted: store/identity.py), clean up after killed ingests, and hand back the
    parts. An s3:// array store reads the AWS variables from `environ` (this process's environment unless given).
    `writes` False (a command that only reads): a new pair is checked, not marked as one."""
    store, engine, sessions = open_pair(settings, environ, writes)
    claims = Claims(sessions, settings.claim_seconds, outage_max_seconds=settings.outage_retry_seconds)
    kernel = settings.statistics_kernel()  # this engine's statistics path: its comparisons' and its ingests'
    ingestor = Ingestor(settings, sessions, store, claims, kernel)
    report = recover(sessions, store, ingestor.live_runs, claims, ingestor.resumable)  # uploads: left for a server
    staging.sweep(settings.staging_dir, ingestor.staged_folders())
    context = open_context(sessions, store, settings.threads, claims, settings.top, kernel)
    compute = computation(settings, context)
    return Services(settings, engine, sessions, store, claims, ingestor, context, compute, report)


def computation(settings: Settings, context: CompareContext) -> Computation:
    """Where this process's pending pairs are computed, chosen once: by the workers of the Dask cluster the settings
    name (`distributed` imported only then), else by the context's threads."""
    if settings.dask_scheduler:
        from tensor_debugger.compare.compute.dask_pairs import DaskComputation

        return DaskComputation(settings, context)
    return LocalComputation(context)


def open_pair(
    settings: Settings, environ: Mapping[str, str] | None = None, writes: bool = True
) -> tuple[ArrayStore, Engine, sessionmaker[Any]]:
    """The array store and the database, migrated to the newest schema, once they are known to be one pair."""
    try:  # a URL that cannot be used stops here, before anything is created
        make_url(settings.database_url).get_dialect()
    except (ArgumentError, ImportError, ValueError) as exc:  # ValueError: a port that is not a number
        raise database_setting_problem(exc, settings.database_url) or exc from None
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # first: a store that cannot be used stops here, doing nothing
    store = ArrayStore(settings.store_url, environ, settings.direct_writes, settings.store_retry_seconds)
    try:
        engine = create_db_engine(settings.database_url)
    except (ArgumentError, ImportError) as exc:  # a driver that is not installed
        raise database_setting_problem(exc, settings.database_url) or exc from None
    try:
        upgrade_database(engine)
        sessions = make_sessionmaker(engine)
        pair(sessions, store, settings.database_url, writes)
    except BaseException as exc:
        engine.dispose()
        outage = database_outage(exc, settings.database_url)  # a database that does not answer: said in one line
        if outage is not None:
            raise outage from exc
        raise
    return store, engine, sessions


def check_pair(settings: Settings, environ: Mapping[str, str] | None = None) -> None:
    """What `open_services` does first (migrate, pair the database with the store), then let go: `serve` does it
    before it listens, so that a store that cannot be used, or is not the database's, is said in one line."""
    open_pair(settings, environ)[1].dispose()
