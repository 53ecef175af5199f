"""A run's files copied into the array store: archives unpacked, each tensor file opened (tensor_files.py) and its
tensors written (writer.py) under the run's prefix. A file that fails is the file's problem, its arrays deleted, and the
run's other files go on; what is not the file's fault (the store, a full disk, a server stopping) stops the run."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from tensor_debugger.engine.fused import Kernel
from tensor_debugger.errors import (
    DiskFullError,
    FileProblem,
    StoreUnavailableError,
    StoreWriteError,
    TensorDebuggerError,
    is_disk_full,
    unexpected_problem,
)
from tensor_debugger.ingest.archives import ArchiveLimits
from tensor_debugger.ingest.block_readers import BufferPool, Leaf
from tensor_debugger.ingest.inputs import InputFile, RunTrace, TensorFileEntry, expand_inputs
from tensor_debugger.ingest.outcomes import IngestCancelled, TakenOver
from tensor_debugger.ingest.stored import Stored, StoredListener, stored_name
from tensor_debugger.ingest.taps import RunTap
from tensor_debugger.ingest.tensor_files import open_tensor_file
from tensor_debugger.ingest.writer import PageCacheBudget, StoredTensor, TensorWriter, WritePools
from tensor_debugger.settings import Settings
from tensor_debugger.store.arrays import ArrayStore, run_prefix

log = logging.getLogger(__name__)

ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes total)


def out_of_memory(limit: int | None) -> str:
    """Why a file could not be read when memory ran out, with the limit the OS set (None: no limit was set)."""
    if limit is None:
        return "ran out of memory reading it"
    return (
        f"needed more than {limit / 2**30:.3g} GiB of memory (TENSOR_DEBUGGER_INGEST_MEMORY, the most one ingest "
        "may take) to read it; refused"
    )


def database_error(error: BaseException) -> bool:
    """Whether `error` is SQLAlchemy's. Looked up, not imported: where no module has imported SQLAlchemy, none of its
    errors can have been raised, and the reading side of an ingest (this module, the readers, the writer) imports
    none of it, so that it could run before the database's side is imported."""
    errors = sys.modules.get("sqlalchemy.exc")
    return errors is not None and isinstance(error, errors.SQLAlchemyError)


def delete_arrays(store: ArrayStore, prefix: str) -> None:
    """Delete the arrays under `prefix` of a run that stops; where the store fails that too (S3 gone), they
    are left for the run's deletion (or, with no row naming them, recovery's) to remove."""
    try:
        store.delete(prefix)
    except (StoreWriteError, StoreUnavailableError):
        log.warning("could not delete %s from the array store; deleting its run removes it", prefix, exc_info=True)


class RunCopy:
    """Copies one run's files; `memory_limit`: the OS's on this process, for the words of a file that ran out of
    it; `reading`: told of each file as it is opened."""

    def __init__(
        self,
        store: ArrayStore,
        settings: Settings,
        limits: ArchiveLimits,
        kernel: Kernel,
        memory_limit: int | None = None,
        reading: Callable[[int, str], None] | None = None,
    ) -> None:
        self.store = store
        self.settings = settings
        self.limits = limits
        self.kernel = kernel  # the statistics path of the tensors' summaries
        self.memory_limit = memory_limit
        self.reading = reading

    def run(
        self,
        run_id: int,
        inputs: list[InputFile],
        staging: Path,
        progress: ProgressCallback | None,
        listener: StoredListener | None = None,
        tap: RunTap | None = None,
    ) -> tuple[list[Stored], list[FileProblem], list[RunTrace]]:
        """Copy the tensors of `inputs` under run `run_id`'s prefix (archives unpacked under `staging`): the
        tensors stored, the files' problems, and the module traces found. `progress` hears of bytes copied of the
        total; `listener`, of each file's stored tensors, and is settled before this returns; `tap`, of each
        tensor's blocks as they are read (ingest/taps.py), and is closed before this returns."""
        try:
            return self._run(run_id, inputs, staging, progress, listener, tap)
        finally:
            if tap is not None:
                tap.close()

    def _run(
        self,
        run_id: int,
        inputs: list[InputFile],
        staging: Path,
        progress: ProgressCallback | None,
        listener: StoredListener | None,
        tap: RunTap | None,
    ) -> tuple[list[Stored], list[FileProblem], list[RunTrace]]:
        expansion = expand_inputs(inputs, staging, self.limits)
        problems = expansion.problems
        total = sum(e.nbytes for e in expansion.entries)
        done = 0
        if progress is not None:
            progress(0, total)  # archives are unpacked: from here on, bytes copied of `total`

        def on_bytes(n: int) -> None:
            nonlocal done
            done += n
            if progress is not None:
                progress(min(done, total), total)

        stored: list[Stored] = []
        pools = WritePools.open(self.settings.threads, beside=tap is not None)  # a tap: read with another run
        buffers = BufferPool(pools.buffers)  # read buffers, shared by the run's files (read one after another)
        budget = PageCacheBudget(self.settings.buffered_run_bytes)  # the run's first bytes through the cache
        # The file before, its last blocks still being written while the next file's are read and handed over:
        # with a file per tensor, waiting for each file's writes stalled an ingest to S3 on its last uploads and on
        # the next array's creation (bench/cluster.py). The writer's window still bounds the blocks in flight.
        earlier: _FileInFlight | None = None
        stopped: BaseException | None = None  # what the file before raised to stop the run
        next_index = 0  # the next array's index under the run's prefix

        def conclude(file: _FileInFlight) -> None:
            """Wait for `file`'s blocks, then close it and record its tensors, or its failure."""
            nonlocal earlier, stopped
            earlier = None
            try:
                try:
                    writer.settle_to(file.mark)
                    done = [(file.entry, file.entry.keys + leaf.key_path, result()) for leaf, result in file.results]
                except BaseException:
                    writer.abandon(file.mark)  # its other blocks: nothing of it is in flight when it is dropped
                    raise
                finally:
                    self._close(file.entry, file.closing)
            except BaseException as exc:
                problems.extend(file.skipped)
                try:
                    self._fail(file.entry, exc, run_id, file.first, file.made, problems)
                except BaseException as raised:
                    stopped = raised
                    raise
                return
            problems.extend(file.skipped)
            stored.extend(done)
            if listener is not None and done:
                listener.stored(done)
            if not file.results and not file.skipped:
                problems.append(FileProblem(file.entry.label, "holds no tensors"))
            elif not file.results:
                problems.append(FileProblem(file.entry.label, "holds no usable tensors"))

        def making_room(oldest: int) -> None:
            if earlier is not None and oldest < earlier.mark:
                conclude(earlier)

        try:
            with (
                ExitStack() as open_files,  # closed after the writer has waited for what is in flight
                TensorWriter(self.store, self.settings.chunk_bytes, pools, self.kernel, on_bytes, budget) as writer,
            ):
                writer.making_room = making_room
                for entry in expansion.entries:
                    first = made = next_index
                    closing = open_files.enter_context(ExitStack())
                    skipped: list[FileProblem] = []
                    if self.reading is not None:
                        self.reading(run_id, entry.label)
                    try:
                        opened = closing.enter_context(
                            open_tensor_file(
                                entry.path, entry.label, buffers, entry.span, entry.packed, scratch=staging
                            )
                        )
                        skipped = list(opened.skipped)
                        results = []
                        for leaf in opened.leaves:
                            made += 1
                            name = stored_name(entry, entry.keys + leaf.key_path) if tap is not None else None
                            results.append((leaf, writer.add(f"{run_prefix(run_id)}/{made - 1}", leaf, name, tap)))
                    except BaseException as exc:
                        if exc is stopped or not isinstance(exc, Exception):
                            raise  # the file before stopped the run (`making_room`), or an interrupt
                        if earlier is not None:
                            conclude(earlier)
                        writer.abandon()  # this file's blocks, the only ones left
                        self._close(entry, closing)
                        problems.extend(skipped)
                        self._fail(entry, exc, run_id, first, made, problems)
                        continue  # the next file takes the indices of this one's arrays
                    if earlier is not None:
                        conclude(earlier)
                    earlier = _FileInFlight(entry, closing, skipped, results, first, made, writer.handed_over)
                    next_index = made
                if earlier is not None:
                    conclude(earlier)
        finally:
            pools.close()
            if listener is not None:  # before `_finish` shares arrays or `_give_up` deletes them
                listener.settle()
        if progress is not None:
            progress(total, total)
        return stored, problems, expansion.traces

    @staticmethod
    def _close(entry: TensorFileEntry, closing: ExitStack) -> None:
        """Close a file once nothing of it is in flight; an extracted one is deleted."""
        try:
            closing.close()
        finally:
            if entry.staged:
                entry.path.unlink(missing_ok=True)

    def _fail(
        self,
        entry: TensorFileEntry,
        exc: BaseException,
        run_id: int,
        first: int,
        made: int,
        problems: list[FileProblem],
    ) -> None:
        """A file that failed, its blocks settled or abandoned and the file closed: its arrays (indices `first` up
        to `made`, the ones cut short too) deleted and its problem recorded where the failure is the file's; raised
        again, as the run's, where it is not."""
        try:
            raise exc
        except FileProblem as problem:
            problems.append(problem)
            self.drop(run_id, first, made)
        except StoreWriteError as error:  # the store, not the file: the whole run stops
            self.drop(run_id, first, made)
            raise type(error)(f"the arrays of {entry.label}", error.reason, entry.label) from error
        except StoreUnavailableError:  # a read of the store that it did not answer: not the file's fault
            self.drop(run_id, first, made)
            raise
        except MemoryError:  # one file's, its memory freed as the error left it: the run's other files go on
            self.drop(run_id, first, made)
            problems.append(FileProblem(entry.label, out_of_memory(self.memory_limit)))
        except OSError as error:  # a file that ends early (a disk that fills stops the whole run)
            self.drop(run_id, first, made)
            if is_disk_full(error):
                raise DiskFullError(f"the arrays of {entry.label}") from error
            problems.append(FileProblem(entry.label, f"could not be read: {error.strerror or error}"))
        except (TensorDebuggerError, IngestCancelled, TakenOver):
            raise  # not this file's: the run stops, as it would for any of them
        except Exception as error:  # anything else one file's reading raised: that file fails, named
            if database_error(error):
                raise  # a listener's write to the database: not this file's either
            self.drop(run_id, first, made)
            problems.append(unexpected_problem(entry.label, error))

    def drop(self, run_id: int, first: int, made: int) -> None:
        """Delete the arrays of a file that failed partway: those from index `first` on, up to the `made` arrays
        begun (the ones cut short too)."""
        for index in range(first, made):
            delete_arrays(self.store, f"{run_prefix(run_id)}/{index}")


@dataclass
class _FileInFlight:
    """A file whose tensors were all handed to the writer, its last blocks perhaps still being written."""

    entry: TensorFileEntry
    closing: ExitStack  # closes the file
    skipped: list[FileProblem]  # its tensors that were not stored, and why
    results: list[tuple[Leaf, Callable[[], StoredTensor]]]
    first: int  # its first array's index under the run's prefix
    made: int  # one past its last array's
    mark: int  # the writer's `handed_over` after its last block
