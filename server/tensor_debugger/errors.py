"""The project's one error hierarchy; the HTTP layer maps these to status codes in one place."""

from __future__ import annotations


class TensorDebuggerError(Exception):
    """Base of every error this project raises on purpose."""


class InvalidInputError(TensorDebuggerError, ValueError):
    """A request or argument that cannot be used as given."""


class NotFoundError(TensorDebuggerError, LookupError):
    """A session, run or tensor that does not exist."""


class ConflictError(TensorDebuggerError):
    """A name already taken, or an operation that clashes with the current state."""


class FileProblem(TensorDebuggerError):
    """One input file that could not be used. `file` names it as the user gave it."""

    def __init__(self, file: str, reason: str) -> None:
        super().__init__(f"{file}: {reason}")
        self.file = file
        self.reason = reason


class UnsafeArchiveError(FileProblem):
    """An archive that tries to escape its folder, link elsewhere or expand beyond the limits."""


class NothingUsableError(TensorDebuggerError):
    """An ingest that found no tensor at all; `problems` says why for each file."""

    def __init__(self, problems: list[FileProblem]) -> None:
        detail = "; ".join(f"{p.file}: {p.reason}" for p in problems) or "no input files"
        super().__init__(f"no tensors found ({detail})")
        self.problems = problems


class StoreUnavailableError(TensorDebuggerError):
    """The array store the settings name cannot be used: a missing bucket, refused credentials, an endpoint that
    does not answer. The message names the setting to change."""
