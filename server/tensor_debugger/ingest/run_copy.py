"""A run's files copied into the array store: archives unpacked, each tensor file opened (tensor_files.py) and its
tensors written (writer.py) under the run's prefix. A file that fails is the file's problem, its arrays deleted, and the
run's other files go on; what is not the file's fault (the store, a full disk, a server stopping) stops the run."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

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
from tensor_debugger.ingest.block_readers import BufferPool
from tensor_debugger.ingest.inputs import InputFile, RunTrace, expand_inputs
from tensor_debugger.ingest.outcomes import IngestCancelled, TakenOver
from tensor_debugger.ingest.stored import Stored, StoredListener, stored_name
from tensor_debugger.ingest.taps import RunTap
from tensor_debugger.ingest.tensor_files import open_tensor_file
from tensor_debugger.ingest.writer import PageCacheBudget, TensorWriter, WritePools
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
        pools = WritePools.open(self.settings.threads)
        chunk_bytes = self.settings.chunk_bytes
        buffers = BufferPool(pools.buffers)  # read buffers, shared by the run's files (read one after another)
        budget = PageCacheBudget(self.settings.buffered_run_bytes)  # the run's first bytes through the cache
        try:
            for entry in expansion.entries:
                first = made = len(stored)
                if self.reading is not None:
                    self.reading(run_id, entry.label)
                try:
                    with (
                        open_tensor_file(
                            entry.path, entry.label, buffers, entry.span, entry.packed, scratch=staging
                        ) as opened,
                        TensorWriter(self.store, chunk_bytes, pools, self.kernel, on_bytes, budget) as writer,
                    ):
                        problems.extend(opened.skipped)
                        results = []
                        for leaf in opened.leaves:
                            made += 1
                            name = stored_name(entry, entry.keys + leaf.key_path) if tap is not None else None
                            results.append((leaf, writer.add(f"{run_prefix(run_id)}/{made - 1}", leaf, name, tap)))
                        writer.finish()
                        stored.extend((entry, entry.keys + leaf.key_path, result()) for leaf, result in results)
                        if listener is not None and results:
                            listener.stored(stored[first:])
                        if not opened.leaves and not opened.skipped:
                            problems.append(FileProblem(entry.label, "holds no tensors"))
                        elif not opened.leaves:
                            problems.append(FileProblem(entry.label, "holds no usable tensors"))
                except FileProblem as problem:
                    problems.append(problem)
                    self.drop(run_id, stored, first, made)
                except StoreWriteError as exc:  # the store, not the file: the whole run stops
                    self.drop(run_id, stored, first, made)
                    raise type(exc)(f"the arrays of {entry.label}", exc.reason, entry.label) from exc
                except StoreUnavailableError:  # a read of the store that it did not answer: not the file's fault
                    self.drop(run_id, stored, first, made)
                    raise
                except MemoryError:  # one file's, its memory freed as the error left it: the run's other files go on
                    self.drop(run_id, stored, first, made)
                    problems.append(FileProblem(entry.label, out_of_memory(self.memory_limit)))
                except OSError as exc:  # a file that ends early (a disk that fills stops the whole run)
                    self.drop(run_id, stored, first, made)
                    if is_disk_full(exc):
                        raise DiskFullError(f"the arrays of {entry.label}") from exc
                    problems.append(FileProblem(entry.label, f"could not be read: {exc.strerror or exc}"))
                except (TensorDebuggerError, IngestCancelled, TakenOver, SQLAlchemyError):
                    raise  # not this file's: the run stops, as it would for any of them
                except Exception as exc:  # anything else one file's reading raised: that file fails, named
                    self.drop(run_id, stored, first, made)
                    problems.append(unexpected_problem(entry.label, exc))
                finally:
                    if entry.staged:
                        entry.path.unlink(missing_ok=True)
        finally:
            pools.close()
            if listener is not None:  # before `_finish` shares arrays or `_give_up` deletes them
                listener.settle()
        if progress is not None:
            progress(total, total)
        return stored, problems, expansion.traces

    def drop(
        self,
        run_id: int,
        stored: list[Stored],
        first: int,
        made: int,
    ) -> None:
        """Forget the tensors of a file that failed partway, arrays included: those from `first` on, up to the
        `made` arrays begun (the ones cut short too)."""
        del stored[first:]
        for index in range(first, made):
            delete_arrays(self.store, f"{run_prefix(run_id)}/{index}")
