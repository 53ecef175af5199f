"""Where a recorded run goes: its staging folder, then the local data dir, rank 0's upload or the server."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tensor_debugger.live.call_recorder import Recorder
from tensor_debugger.live.capture_types import CaptureResult
from tensor_debugger.live.ranks import (
    Ranks,
    gather_counts,
    process_ranks,
    rank_folder,
    send_from_rank0,
    shared_staging,
)
from tensor_debugger.live.writer import CaptureWriter, StoreSink

if TYPE_CHECKING:
    from tensor_debugger.ingest.runs import PendingRun
    from tensor_debugger.services import Services
    from tensor_debugger.settings import Settings


class LocalRun:
    """A run of the local data directory that the capture writes into as it goes: begun (status "ingesting") when
    the block opens, made ready from the trace when it ends, removed if it never is.

    The data dir is opened (its database made first where it is new: file syncs, the schema) and the run begun on a
    thread of its own, started here, while the block runs: the first use of the run (`sink`, `finish`) waits for
    it, and raises what opening or beginning raised. A capture with values="full" asks for the sink at once (its
    tensors go into the run's arrays as they come), so its data dir is opened before the block runs, as before;
    with values="summary" nothing is written before the block ends, so the opening overlaps the forward, and a data
    dir that cannot be used is said when the block ends, with nothing stored. The labels and the settings are read
    here, at once: a wrong one is said before the block runs. `new_session`: the run makes its session, refused with
    SessionNameTaken (nothing kept) where one of that name exists (`Ingestor.begin`)."""

    def __init__(
        self,
        session: str,
        run: str,
        data_dir: str | Path | None,
        against: str | None = None,
        role: str | None = None,
        new_session: bool = False,
    ) -> None:
        from tensor_debugger.settings import Settings
        from tensor_debugger.store.catalog import parse_label

        parse_label(session, "session name")
        parse_label(run, "run label")
        settings = Settings.from_environ() if data_dir is None else Settings.from_environ(data_dir=Path(data_dir))
        self.finished = False
        self._opened: tuple[Services, PendingRun, StoreSink] | None = None
        self._failure: BaseException | None = None
        self._opening = threading.Thread(
            target=self._open,
            args=(settings, session, run, against, role, new_session),
            name="capture-open",
            daemon=False,
        )
        self._opening.start()

    def _open(
        self, settings: Settings, session: str, run: str, against: str | None, role: str | None, new_session: bool
    ) -> None:
        """Open the data dir and begin the run (on the opening thread): `_opened`, or `_failure` if either raised."""
        from tensor_debugger.services import open_services
        from tensor_debugger.store.arrays import run_prefix

        try:
            services = open_services(settings)
            try:
                pending = services.ingestor.begin(
                    session, run, [run], role=role, against=against, new_session=new_session
                )
                sink = StoreSink(
                    services.store, run_prefix(pending.run_id), settings.chunk_bytes, services.context.kernel
                )
            except BaseException:
                services.close()
                raise
            self._opened = (services, pending, sink)
        except BaseException as exc:  # raised again, on the capture's thread, by the first use of the run
            self._failure = exc

    def _wait(self) -> tuple[Services, PendingRun, StoreSink]:
        self._opening.join()
        if self._failure is not None:
            raise self._failure
        assert self._opened is not None
        return self._opened

    @property
    def services(self) -> Services:
        return self._wait()[0]

    @property
    def pending(self) -> PendingRun:
        return self._wait()[1]

    @property
    def sink(self) -> StoreSink:
        return self._wait()[2]

    def finish(
        self, tree: tuple[str, dict[str, Any]], folder: Path, files: list[str], result: CaptureResult, pair: bool = True
    ) -> None:
        """Make the run ready: its tensors in call order, named, placed and given the module tree as ingest does
        for the same trace folder (`tree`: its JSON's name and content, read as ingest reads the file, which a
        local run need not write); with `pair`, pair the session's runs again."""
        from tensor_debugger.ingest.inputs import RunTrace, TensorFileEntry
        from tensor_debugger.ingest.traces import trace_of

        label = self.pending.run_label
        name, content = tree
        json_label = f"{label}/{name}"
        trace = trace_of(content, name, json_label, [*files, name])
        index = {file: i for i, file in enumerate(files)}
        key_path: tuple[str, ...] = ("data",)
        stored = [
            (
                TensorFileEntry(
                    folder / t.file,
                    t.relpath(t.file),
                    f"{label}/{t.file}",
                    False,
                    module_path=t.module_path,
                    place=t.place,
                    source=t.source,
                    parameter=t.parameter,
                ),
                key_path,
                self.sink.stored[index[t.file]],
            )
            for t in trace.tensors
            if t.file is not None
        ]
        self.finished = True  # complete_stored removes the run itself if it fails
        self.services.ingestor.complete_stored(self.pending, stored, [RunTrace("", json_label, trace)])
        if pair:
            self.services.plan(self.pending.session_id)
        result.session_id, result.run_id = self.pending.session_id, self.pending.run_id

    def close(self) -> None:
        """Remove the run if it was begun and not made ready, and let go of the data dir (once opened: where
        opening failed, nothing was begun, and what it raised is the first use's to say)."""
        self._opening.join()
        if self._opened is None:
            return
        services, pending, _ = self._opened
        try:
            if not self.finished:
                services.ingestor.cancel(pending)
        finally:
            services.close()


def session_found(server: str | None, session: str, token: str | None, ranks: Ranks | None) -> int | None:
    """The id of the server's session named `session` as a capture through it begins (on the rank that sends the
    run): its run goes into that session, and is not uploaded where it was deleted meanwhile."""
    if server is None or (ranks is not None and ranks.rank != 0):
        return None
    from tensor_debugger.live.upload import session_on

    return session_on(server, session, token)


def staging_folders(staging: str | Path | None) -> tuple[Ranks | None, Path | None, Path]:
    """This process's ranks (inside torch.distributed: its tensors are one shard of the run, ranks.py), the ranks'
    shared staging folder, and the folder its run's files are staged in."""
    ranks = process_ranks()
    shared = shared_staging(ranks, staging) if ranks is not None else None
    folder = rank_folder(shared, ranks) if shared is not None and ranks is not None else None
    return ranks, shared, folder or Path(tempfile.mkdtemp(prefix="capture-", dir=staging))


def release_run(
    writer: CaptureWriter | None, local: LocalRun | None, ranks: Ranks | None, shared: Path | None, folder: Path
) -> None:
    """After storing a run, or failing to: the writer cancelled (where still open), the local run closed, the staged
    files removed (rank 0 removes the ranks' folders once sent)."""
    try:
        if writer is not None:
            writer.close(cancel=True)
    finally:
        if local is not None:
            local.close()
        if shared is None or (ranks is not None and ranks.rank == 0):
            shutil.rmtree(shared or folder, ignore_errors=True)


Place = tuple[Path, "LocalRun | None", "Ranks | None", "Path | None"]  # staging folder, local run, ranks, shared


def send_run(
    recorder: Recorder,
    result: CaptureResult,
    session: str,
    run: str,
    place: Place,
    data_dir: str | Path | None,
    server: str | None,
    token: str | None,
    pair: bool,
    against: str | None = None,
    found: int | None = None,
    role: str | None = None,
    new_session: bool = False,
) -> None:
    """Store a recorded run whose tensors are all written: its module tree, then the run (into the local run, from
    rank 0 for the ranks, or uploaded to the server, compared against the session's run labelled `against` where
    given; into the session of id `found` where the capture found one as it began); its ids into `result`."""
    folder, local, ranks, shared = place
    result.tensors, result.skipped = recorder.count, recorder.skipped
    if local is not None:  # the trace JSON read from memory, not written: nothing else reads its file
        local.finish(recorder.tree(), folder, recorder.files, result, pair)
        return
    recorder.write_tree()
    if ranks is not None and shared is not None:
        result.tensors, result.skipped = gather_counts(ranks, recorder.count, recorder.skipped)
        result.session_id, result.run_id = send_from_rank0(
            ranks, shared, session, run, data_dir, server, token, against, found, role
        )
    else:
        assert server is not None
        from tensor_debugger.live.upload import upload_run

        result.session_id, result.run_id = upload_run(
            server, session, run, folder, token, against, found, role, new_session=new_session
        )
