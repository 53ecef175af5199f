"""The project's one error hierarchy; the HTTP layer maps these to status codes in one place."""

from __future__ import annotations

import errno

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class TensorDebuggerError(Exception):
    """Base of every error this project raises on purpose."""


class InvalidInputError(TensorDebuggerError, ValueError):
    """A request or argument that cannot be used as given."""


class TooLargeError(InvalidInputError):
    """A request body, field or value larger than the limit for it."""


class TooManyWrongTokens(TensorDebuggerError):
    """A client address that presented too many wrong tokens lately, or a wrong token presented too often
    (web/sign_in_limits.py): it may try again in `retry_after` seconds. A right token is never refused so."""

    def __init__(self, retry_after: int, why: str = "from this address") -> None:
        super().__init__(f"too many wrong tokens {why}: try again in {retry_after} s")
        self.retry_after = retry_after


class NotFoundError(TensorDebuggerError, LookupError):
    """A session, run or tensor that does not exist."""


class ConflictError(TensorDebuggerError):
    """A name already taken, or an operation that clashes with the current state."""


class SessionNameTaken(ConflictError):
    """A run that was to make a new session found one of that name (another command made it meanwhile)."""


class FileProblem(TensorDebuggerError):
    """One input file that could not be used. `file` names it as the user gave it. Its tensors, if it held any,
    are missing from the run: a comparison of the run is incomplete (`ignored` is False). `note`: a note about the
    run (CaptureNote), not about a file."""

    ignored = False
    note = False

    def __init__(self, file: str, reason: str) -> None:
        super().__init__(f"{file}: {reason}")
        self.file = file
        self.reason = reason

    def __reduce__(self) -> tuple[type[FileProblem], tuple[str, str]]:  # sent back by a child process
        return type(self), (self.file, self.reason)


SECOND_TENSOR_OF_A_NAME = "a second tensor named "
"""How the problem of a run holding two tensors of one name begins (`ingest/run_rows.tensor_rows`): both files were
read; which of the two the other run's tensor of that name stands for is a guess."""


def is_second_tensor(reason: str) -> bool:
    """Whether a file's problem is a second tensor of a name its run already had (SECOND_TENSOR_OF_A_NAME): the
    file was read, and nothing of it is missing."""
    return reason.startswith(SECOND_TENSOR_OF_A_NAME)


def unexpected_problem(file: str, exc: BaseException) -> FileProblem:
    """A file whose reading raised an error no reader expected: named, with the error's type and first line, so that
    the run's other files go on and the user learns which file and why, never a traceback."""
    lines = str(exc).strip().splitlines()
    message = f": {lines[0][:300]}" if lines else ""
    return FileProblem(file, f"could not be read ({type(exc).__name__}{message})")


class NotATensor(FileProblem):
    """A file or a value that holds no tensor (a config.json beside the weights, a step counter in a state dict):
    named, and otherwise ignored; nothing is missing from the run for it."""

    ignored = True


class CaptureNote(FileProblem):
    """What a live capture could not see (the ops of a module that ran compiled), said on its run: a note, not a
    file missing from it."""

    ignored = True
    note = True


class UnsafeArchiveError(FileProblem):
    """An archive that tries to escape its folder, link elsewhere or expand beyond the limits."""


class NothingUsableError(TensorDebuggerError):
    """An ingest that found no tensor at all; `problems` says why for each file."""

    def __init__(self, problems: list[FileProblem]) -> None:
        # what each file held, or why it could not be read, is in `problems`: said once, a line each, beside this
        files = sorted({p.file for p in problems})
        where = (
            f" in {files[0]}"
            if len(files) == 1
            else f" in any of {len(files)} input files"
            if files
            else " (no input files)"
        )
        super().__init__(f"no tensors found{where}")
        self.problems = problems

    def __reduce__(self) -> tuple[type[NothingUsableError], tuple[list[FileProblem]]]:
        return type(self), (self.problems,)


class DiskFullError(TensorDebuggerError):
    """The disk (or the quota) holding the data directory is full: nothing about the input is wrong."""

    def __init__(self, where: str) -> None:
        super().__init__(f"out of disk space writing {where}; free some space and try again")
        self.where = where

    def __reduce__(self) -> tuple[type[DiskFullError], tuple[str]]:
        return type(self), (self.where,)


def is_disk_full(exc: BaseException) -> bool:
    """An OSError saying there is no space left (ENOSPC, EDQUOT), SQLite's "database or disk is full", or an error
    raised because of either."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DiskFullError):
            return True
        if isinstance(current, OSError) and current.errno in NO_SPACE:
            return True
        if "database or disk is full" in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False


class StoreUnavailableError(TensorDebuggerError):
    """The array store the settings name cannot be used: a missing bucket, refused credentials, an endpoint that
    does not answer. The message names the setting to change."""


class DatabaseUnavailableError(TensorDebuggerError):
    """The metadata database did not answer (a restart, the network): nothing about the request is wrong, and the
    same request may succeed once it is back. The message names the database (its password hidden)."""


class DatabaseSettingError(TensorDebuggerError):
    """The metadata database's URL (TENSOR_DEBUGGER_DATABASE_URL) cannot be used as given: not a URL, or a database
    or driver this installation lacks. The message names the URL (its password hidden) and the cause."""


class StoreReadError(StoreUnavailableError, OSError):
    """The array store did not answer a read (its endpoint down, the network, refused credentials): nothing is known
    to be wrong with the data, and the same read may succeed once the store answers again."""


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` says the array store or the database did not answer (this error or one it was raised from):
    what retrying later mends, never a verdict on the data."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, StoreUnavailableError | DatabaseUnavailableError | StoreOutageError):
            return True
        current = current.__cause__ or current.__context__
    return False


class StoreWriteError(TensorDebuggerError):
    """The array store failed a write or a deletion (S3: access denied, the bucket removed, the endpoint gone) of
    `where` (while ingesting `file`, when known): nothing about the input is wrong."""

    failed = "failed"  # in the message: what the store did

    def __init__(self, where: str, reason: str, file: str = "") -> None:
        super().__init__(f"the array store {self.failed} writing {where}: {reason}")
        self.where = where
        self.reason = reason
        self.file = file

    def __reduce__(self) -> tuple[type[StoreWriteError], tuple[str, str, str]]:  # sent back by a child process
        return type(self), (self.where, self.reason, self.file)


class StoreOutageError(StoreWriteError):
    """A write or deletion the array store did not answer (its endpoint down, the network, a busy server): unlike
    a refusal (access denied, the bucket removed), the same write may succeed once it answers again."""

    failed = "did not answer"


class IngestPostponed(TensorDebuggerError):
    """An ingest that met an outage (errors.is_outage): its run stays "ingesting", its staged files kept, and it is
    tried again from them once the database and the array store answer. `reason` says which did not answer."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    def __reduce__(self) -> tuple[type[IngestPostponed], tuple[str]]:  # sent back by a child process
        return type(self), (self.reason,)


class StorePairingError(StoreUnavailableError):
    """The metadata database and the array store are not one pair (store/identity.py): a process given them would
    misread the store or, recovering, delete what another database stored. Raised at start, before anything is
    written or deleted; the message names both and the fix."""


class NoDaskWorkerError(TensorDebuggerError):
    """The Dask scheduler a computation sends its pairs to has had no worker for longer than
    TENSOR_DEBUGGER_DASK_NO_WORKER_SECONDS (all of them killed, none started): the computation stops, its pairs not
    computed stay pending (for the next computation, once a worker is back), and the message names the scheduler."""
