"""Reports of sessions, runs, tensors and problems: typed, frozen structures that the API serves as JSON (and
documents in its OpenAPI schema), the CLI prints and the pages show. One place for all three."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from tensor_debugger.errors import FileProblem
from tensor_debugger.store.models import ProblemRecord, RunRecord, SessionRecord, TensorRecord
from tensor_debugger.store.problem_report import ProblemReport as ProblemReport  # served by the API here too


class RunStatus(enum.StrEnum):
    """A run's row: visible once "ready"; "failed" when nothing usable was found (its problems say why)."""

    INGESTING = "ingesting"
    READY = "ready"
    FAILED = "failed"


class RunRole(enum.StrEnum):
    """The session's first run is the reference; every other run is a candidate compared with it, or with the run it
    names (`RunReport.compared_against`)."""

    REFERENCE = "reference"
    CANDIDATE = "candidate"
    NOISE = "noise"  # a rerun of the reference: the noise floor each candidate's error is judged against


class PairStatus(enum.StrEnum):
    PENDING = "pending"  # not compared yet
    PASS = "pass"
    FAIL = "fail"
    INCOMPARABLE = "incomparable"  # no alignment makes the shapes comparable
    ERROR = "error"  # comparing it failed; `error` says why


class PairingStrategy(enum.StrEnum):
    """How a pair was found (engine.pairing's strategies, strongest first; `explore` pairs every two tensors of one
    run). A pair's `strategy` text starts with one of these: fuzzy pairs add their score ("fuzzy 0.95"), a parameter
    pair made through one side's `**kwargs` says so ("parameter through **kwargs"), and one made by position
    ("parameter by position")."""

    MANUAL = "manual"
    LAYER_STAGE = "layer_stage"
    NAME = "name"
    MODULE = "module"
    PARAMETER = "parameter"
    KEY = "key"
    NORMALIZED = "normalized"
    FUZZY = "fuzzy"
    SHAPE = "shape"
    EXPLORE = "explore"


_STRATEGIES = frozenset(str(s) for s in PairingStrategy)


def parse_strategy(text: str) -> str:
    """A stored pair's strategy text, checked: its first word must be a PairingStrategy (ValueError otherwise)."""
    first = text.split(" ", 1)[0]
    if first not in _STRATEGIES:  # a set's lookup: this runs for every pair of every report
        raise ValueError(f"{first!r} is not a valid PairingStrategy")
    return text


def iso(moment: datetime) -> str:
    """ISO 8601 with the zone; SQLite hands back naive datetimes, which are stored as UTC."""
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).isoformat()


def problem_reports(problems: Sequence[FileProblem | ProblemRecord]) -> list[ProblemReport]:
    return [ProblemReport.of(p) for p in problems]


@dataclass(frozen=True)
class RunReport:
    id: int
    label: str
    role: RunRole
    position: int
    status: RunStatus
    sources: list[str]
    tensors: int
    total_bytes: int
    created_at: str
    # the id of the run of the session this one is compared against (its pairs' side "a"); null: the session's
    # reference (the reference itself and its reruns are compared against it, or nothing)
    compared_against: int | None

    @classmethod
    def of(cls, run: RunRecord) -> RunReport:
        return RunReport(*run_fields(run))


RunFields = tuple[int, str, RunRole, int, RunStatus, list[str], int, int, str, int | None]


def run_fields(run: RunRecord) -> RunFields:
    """RunReport's fields of `run`, in order: what every report of a run (RunWithProblems, RunDetail) begins with."""
    return (
        run.id,
        run.label,
        RunRole(run.role),
        run.position,
        RunStatus(run.status),
        list(run.sources),
        run.tensor_count,
        run.total_bytes,
        iso(run.created_at),
        run.compared_against_id,
    )


@dataclass(frozen=True)
class RunWithProblems(RunReport):
    """A run with the problems of its files."""

    problems: list[ProblemReport]

    @classmethod
    def of(cls, run: RunRecord) -> RunWithProblems:
        return RunWithProblems(*run_fields(run), problem_reports(run.problems))


@dataclass(frozen=True)
class Tolerances:
    """The session's own tolerances; None: torch.testing's default for each pair's dtypes."""

    rtol: float | None
    atol: float | None
    ulp: int | None  # set: an element passes within this many ULPs of the pair's lower-precision dtype instead


@dataclass(frozen=True)
class SessionReport:
    """`strategies`: the chain of pairing strategies in the order tried (null: the default chain); `name_pattern`:
    the regular expression giving layer, stage (and rank) from names (null: none)."""

    id: int
    name: str
    notes: str
    created_at: str
    tolerances: Tolerances
    runs: list[RunReport]
    strategies: list[str] | None
    name_pattern: str | None
    allow_unmatched: list[str]  # globs of reference tensor names that may have no partner (`--allow-unmatched`)
    dims: dict[str, str] | None  # names of the tensors' aligned dimensions by name glob (null: none)

    @classmethod
    def of(cls, session: SessionRecord) -> SessionReport:
        return SessionReport(*_session_head(session), [RunReport.of(r) for r in session.runs], *_rules(session))


@dataclass(frozen=True)
class SessionDetail:
    """A session whose runs have their problems."""

    id: int
    name: str
    notes: str
    created_at: str
    tolerances: Tolerances
    runs: list[RunWithProblems]
    strategies: list[str] | None  # as in SessionReport
    name_pattern: str | None
    allow_unmatched: list[str]
    dims: dict[str, str] | None

    @classmethod
    def of(cls, session: SessionRecord) -> SessionDetail:
        return SessionDetail(*_session_head(session), [RunWithProblems.of(r) for r in session.runs], *_rules(session))


def _session_head(session: SessionRecord) -> tuple[int, str, str, str, Tolerances]:
    """The fields SessionReport and SessionDetail begin with (their runs come next, then `_rules`)."""
    return (
        session.id,
        session.name,
        session.notes,
        iso(session.created_at),
        Tolerances(session.rtol, session.atol, session.ulp),
    )


def _rules(
    session: SessionRecord,
) -> tuple[list[str] | None, str | None, list[str], dict[str, str] | None]:
    """The pairing strategies (None: the default chain), name pattern, globs of reference tensors allowed to have no
    partner and dimension names that SessionReport and SessionDetail end with."""
    return (
        [str(s) for s in session.strategies] if session.strategies else None,
        session.name_pattern,
        [str(g) for g in session.allow_unmatched or []],
        session.dims,
    )


@dataclass(frozen=True)
class TensorStats:
    """A tensor's summary statistics (min, max, mean and std are None where they do not apply)."""

    numel: int
    min: float | None
    max: float | None
    mean: float | None
    std: float | None
    nan: int
    inf: int


@dataclass(frozen=True)
class TensorReport:
    id: int
    run_id: int
    name: str
    source_file: str
    key_path: list[str | int]
    layer: int | None
    stage: str | None
    shape: list[int]
    dtype: str
    nbytes: int
    digest: str
    stats: TensorStats

    @classmethod
    def of(cls, tensor: TensorRecord) -> TensorReport:
        return cls(
            tensor.id,
            tensor.run_id,
            tensor.name,
            tensor.source_file,
            list(tensor.key_path),
            tensor.layer,
            tensor.stage,
            list(tensor.shape),
            tensor.dtype,
            tensor.nbytes,
            tensor.digest,
            TensorStats(
                tensor.numel, tensor.min, tensor.max, tensor.mean, tensor.std, tensor.nan_count, tensor.inf_count
            ),
        )
