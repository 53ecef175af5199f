"""What `tensor-debugger compare` and `ingest` say, typed: the JSON `--json` prints (a stable contract for scripts,
narrower than the API's; the README documents its fields), the table the command prints from it, and the answer a
server sends the command that handed it the work (the warm path: `cli/warm.py`, `web/controllers/local.py`).
`contract.py` fills a CompareReport from the session's reports.

Light on purpose (msgspec and the standard library): the command line that finds a server running imports this and
not the database or the array store. Fields left UNSET are left out of the JSON (a culprit is a module's or a
stage's; `error` only where nothing could be compared)."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from tensor_debugger.compare.reports.summary_reports import SummaryReport
from tensor_debugger.compare.reports.where_reports import WhereEntry
from tensor_debugger.errors import is_second_tensor
from tensor_debugger.store.problem_report import ProblemReport

Number = float | int | str  # engine.metrics's: NaN and infinities travel as "nan", "inf", "-inf"


class SessionLink(msgspec.Struct, frozen=True):
    """The session a compare stored, and its page."""

    id: int
    name: str
    url: str


class SideSummary(msgspec.Struct, frozen=True):
    """One run's tensor of a pair. `source`: a captured op's caller, "<file>:<line>" (capture with level="op")."""

    name: str
    shape: list[int]
    dtype: str
    source: str | None


class WorstValue(msgspec.Struct, frozen=True):
    """One of a pair's largest differences: where (in aligned coordinates), both values and |a - b|."""

    index: list[int]
    a: Number  # a complex value as text
    b: Number
    abs_diff: Number


class StatsSummary(msgspec.Struct, frozen=True):
    """A compared pair's statistics, those the contract keeps (compare/reports/pair_stats.py has them all)."""

    max_abs_diff: Number
    mean_abs_diff: Number | None  # None (with mse, cosine): a pair of 0 elements has no such figure
    max_rel_diff: Number
    mean_rel_diff: Number
    mse: Number | None
    cosine: Number | None
    mismatched: int
    numel: int
    argmax: list[int] | None
    nan_a: int
    nan_b: int
    inf_a: int
    inf_b: int
    worst: list[WorstValue]


class Replicas(msgspec.Struct, frozen=True):
    """One side's shards are whole copies, each compared: the ranks whose copy differs (null: not known)."""

    ranks: int
    side: str
    differing: list[int] | None


class ReferenceRows(msgspec.Struct, frozen=True):
    """The reference rows a pair's alignment compared where it cut some away (the candidate has fewer): `kept` of
    its `rows` along `axis`; the others were compared with nothing, so the pair is never a pass."""

    kept: int
    rows: int
    axis: int


class ComparedPair(msgspec.Struct, frozen=True):
    name: str
    layer: int | None
    stage: str | None
    status: str  # a PairStatus
    alignment: str
    strategy: str
    a: SideSummary
    b: SideSummary
    stats: StatsSummary | None
    error: str | None
    module_path: str | None
    place: str | None
    # the verdict on summaries, where element values are not available: a trace's (use_repr=True) or a capture's
    # with values="summary" (engine/summary_compare.py), as stored with the result
    summary: SummaryReport | None
    candidate: str  # the label of the candidate run
    rule: str  # what judged the verdict: "tolerance", or "noise" (a rerun of the reference's floor)
    noise_max_abs_diff: Number | None  # that floor: the reference's rerun's max |diff| here
    replicas: Replicas | None
    # a failing pair's aligned dimensions that confine its error ([]: everywhere); null for any other pair
    where: list[WhereEntry] | None
    # two captured ops of one name and shape paired by content, or by position ambiguously: how, in words
    pairing_note: str | None = None
    # where its alignment cut reference rows away: the rows compared of them; null where the whole reference faced
    # the candidate
    reference_rows: ReferenceRows | None = None

    @property
    def compared_in_part(self) -> bool:
        """Some of its reference rows compared, the others cut away: not compared whole, not compared at all."""
        return self.reference_rows is not None and self.stats is not None

    @property
    def on_summary(self) -> bool:
        """Judged on summaries alone (a capture with values="summary")."""
        return self.summary is not None and self.summary.on_summary


class Unmatched(msgspec.Struct, frozen=True):
    """Tensors without partner: the reference's (`a`) and the candidates' (`b`)."""

    a: list[str]
    b: list[str]


class RunNotComparedSummary(msgspec.Struct, frozen=True):
    """A run none of whose tensors was compared: the run it is compared against (`against`, null where it was
    removed) failed, is not ready yet or was removed (`why`)."""

    run: str
    against: str | None
    why: str


class RunCoverageSummary(msgspec.Struct, frozen=True):
    """What one candidate run compared of the run it is compared against (`against`): `tensors`, that run's tensors
    it was asked to record; `compared`, of them those compared; `not_asked`, that run's tensors outside what it was
    asked to record (a capture of some modules only), not counted in `tensors`."""

    run: str
    against: str
    tensors: int
    compared: int
    not_asked: int


class OutOfStepSummary(msgspec.Struct, frozen=True):
    """A pair of captured ops out of step (`name`, the pair's), not compared, and why in plain words."""

    name: str
    why: str


class CoverageSummary(msgspec.Struct, frozen=True):
    """How much of the reference was compared (compare/reports/coverage.py)."""

    reference_tensors: int
    compared: int
    unmatched: list[str]  # reference tensors without partner, not allowed by the user
    allowed_unmatched: list[str]
    not_compared: list[str]  # pairs that errored or are incomparable
    runs_not_compared: list[RunNotComparedSummary] = []
    runs: list[RunCoverageSummary] = []  # each candidate run's own coverage
    out_of_step: list[OutOfStepSummary] = []  # pairs of ops out of step: not compared


class CrossedOps(msgspec.Struct, frozen=True):
    """Two ops before a first divergence, in its module call, that their contents paired across call indices: the
    candidate's `candidate` (its `getitem#2`) holds what the reference's `reference` (its `getitem#1`) holds; each
    with the line that called it ("" where none was recorded)."""

    reference: str
    reference_source: str
    candidate: str
    candidate_source: str


class LoweredFirst(msgspec.Struct, frozen=True):
    """Where a candidate's lower precision begins: `name`, the first of its recorded tensors in `dtype` (a less
    precise float dtype) where the reference's is not, and the line that made it ("" where none was recorded)."""

    name: str
    source: str
    dtype: str


class RecordedEarly(msgspec.Struct, frozen=True):
    """A tensor the candidate recorded just before its first divergence that pairs by name with one the reference
    records only after it (a norm called before the rotary where the reference calls it after): the candidate's
    tensor and line, and its partner's line ("" where none was recorded)."""

    candidate: str
    candidate_source: str
    reference_source: str


class HeldBefore(msgspec.Struct, frozen=True):
    """The reference's tensor `reference` recorded before a first divergence that holds, bit for bit, what the
    candidate's tensor there (`candidate`) holds (content hashes equal; the candidate's not one value throughout),
    with its line ("" where none was recorded): a cache given the keys before their rotary holds the reference's
    keys as the rotary got them."""

    candidate: str
    reference: str
    reference_source: str


class ModelCheck(enum.StrEnum):
    """What only `find_divergence`, which holds the two models, can check of a session's first divergence."""

    # whether the module diverges by its own doing or by its inputs' difference within tolerance grown past it:
    # the candidate's module called again on the reference's inputs to it
    GROWN = "grown"
    STATE = "parameters and buffers"  # whether the module's parameters or buffers differ (no capture stores them)
    FLOOR = "precision floor"  # whether the difference is beyond the rounding to the candidate's lower precision


class DivergenceSummary(msgspec.Struct, frozen=True):
    """A candidate's first divergence. `unmatched_before`: the reference tensors without partner (not allowed by the
    user) before it in execution order; `where`: the dimensions and index ranges its error is confined to; `basis`
    "summary" where the verdict rests on summaries, said in `summary_reason`; null: on element values."""

    name: str
    layer: int | None
    stage: str | None
    where: list[WhereEntry] | None
    unmatched_before: list[str]
    basis: str | None
    summary_reason: str | None
    # the candidate's tensors without partner recorded between the pair before it and it, "name (file:line)": an op
    # the candidate runs and the reference does not, where the divergence may have begun
    candidate_only_before: list[str] = []
    # the first pair before it whose values differ at all though within tolerance, "name (file:line)": where a
    # difference too small to fail began; null where none did
    first_changed: str | None = None
    # false where no execution order is known (a failing pair without a stage or module: a state dict's weights):
    # then it is the first failing pair listed, not the first to fail, and nothing is said of what came before it
    in_execution_order: bool = True
    # true where that pair was judged on summaries alone: its values differ (content hashes), and its summaries found
    # nothing outside tolerance, which does not say every element is within it
    first_changed_on_summaries: bool = False
    # where in_execution_order is false because the failing stages of its layer have no known order (names not in
    # the transformer stage order, sorted by name), why; null otherwise
    order_note: str | None = None
    # where its partner was guessed, the strategy ("shape", "fuzzy 0.86") and the candidate's tensor; null where
    # names, module paths, parameters or the user paired it
    paired_by: str | None = None
    candidate_name: str | None = None
    # where it is a module's input and a side has no `source` (the line that passed it), why; null otherwise
    source_note: str | None = None
    # ops before it in its module call that paired by content across call indices (two slices swapped in use);
    # [] where none did, or no op capture recorded them
    crossed_before: list[CrossedOps] = []
    # where the candidate's lower precision begins; null where its recorded tensors are in no less precise float
    # dtype than the reference's, or no capture recorded their order
    lowered_first: LoweredFirst | None = None
    # the candidate's tensors just before it that pair with tensors the reference records only after it; [] where
    # none does, or no op capture recorded them
    candidate_early_before: list[RecordedEarly] = []
    # the reference's tensor before it holding what the candidate's holds there; null where none does
    candidate_holds: HeldBefore | None = None
    # what find_divergence can check of it that the session cannot (it needs the models); [] where nothing applies
    find_divergence_checks: list[ModelCheck] = []
    # whether every one of the models' own outputs paired with a bit-identical one: the divergence does not reach them
    outputs_agree: bool = False
    # the pairs before it in execution order that were not compared (incomparable, errored), each "name (why)": the
    # divergence may have begun in one of them; [] where none, or no execution order is known
    not_compared_before: list[str] = []
    # how many of its candidate's pairs before it passed on a use_repr=True trace's printed statistics only (mean,
    # std, min and max): the divergence may have begun in one of them, unseen in the digits printed
    statistics_before: int = 0


class NextCaptureSummary(msgspec.Struct, frozen=True):
    """The capture with full values that settles a divergence found from summaries (`python`, a snippet)."""

    modules: list[str]
    values: str
    level: str
    python: str


class Culprit(msgspec.Struct, frozen=True, kw_only=True):
    """A module whose added error stands out (`module_path`), or in a plain dump a stage (`name`, `layer`, `stage`,
    `previous`): the one kind's fields are left out of the other's JSON."""

    module_path: str | UnsetType = UNSET
    name: str | UnsetType = UNSET
    layer: int | None | UnsetType = UNSET
    stage: str | None | UnsetType = UNSET
    previous: str | None | UnsetType = UNSET
    added_error: Number
    input_error: Number
    output_error: Number
    # a stage's pair whose partner was guessed: the strategy ("shape", "fuzzy 0.86") and the candidate's tensor
    paired_by: str | None | UnsetType = UNSET
    candidate_name: str | None | UnsetType = UNSET

    @property
    def label(self) -> str:
        """How the tables name it: the module's path, or the stage's tensor."""
        return self.module_path if isinstance(self.module_path, str) else str(self.name)


class CompareReport(msgspec.Struct, frozen=True, kw_only=True):
    """`tensor-debugger compare --json`: the README's "JSON output" documents each field."""

    session: SessionLink | None
    pairs: list[ComparedPair]
    unmatched: Unmatched
    # comparing, diverged, incomplete (not everything was compared) or no_divergence (compare/reports/coverage.py)
    verdict: str
    coverage: CoverageSummary | None
    first_divergence: DivergenceSummary | None  # the first candidate's
    # "summary" where any pair was judged on a capture's summaries alone; "statistics" where none was, and any on a
    # use_repr=True trace's printed statistics; "values" otherwise (every verdict on element values)
    basis: str
    pairs_on_summaries: int
    pairs_on_statistics: int = 0  # the pairs judged on a use_repr=True trace's printed statistics
    # where no pair diverged: the first pair in execution order that passed on summaries though its content hashes
    # differ (its values differ; its summaries found nothing outside tolerance), which `next_capture` settles
    first_changed: str | None = None
    next_capture: NextCaptureSummary | None
    first_divergences: dict[str, DivergenceSummary | None]  # each candidate's, by its label
    culprits: list[Culprit]
    # "even", "stands out", "too few" (error added, none stands out, fewer than 3 ranked), or null (nothing ranked)
    error_growth: str | None
    culprit_note: str | None
    problems: list[ProblemReport]
    error: str | UnsetType = UNSET  # what made the input unusable (exit code 2)

    def pair_named(self, name: str) -> ComparedPair:
        return next(p for p in self.pairs if p.name == name)


class IngestedSession(msgspec.Struct, frozen=True):
    id: int
    name: str


class IngestedRun(msgspec.Struct, frozen=True):
    id: int
    label: str
    tensors: int


class IngestReport(msgspec.Struct, frozen=True, kw_only=True):
    """`tensor-debugger ingest --json`: the session and the run stored, the problems; `error` when nothing was."""

    session: IngestedSession | None
    run: IngestedRun | None
    problems: list[ProblemReport]
    error: str | UnsetType = UNSET


class ReadOnce(msgspec.Struct, frozen=True):
    """How a compare that ingested a reference and a candidate at once read their pairs (compute/lockstep.py):
    `in_memory` pairs from the blocks as they were read for storing, the others from the stored copy, counted by
    why."""

    in_memory: int
    read_back: dict[str, int]
    most_kept: int = 0  # the most bytes of blocks one run kept at once for the other to catch up
    copied: int = 0  # bytes of blocks copied to be kept (the others were compared in the ingest's own buffers)


class CompareOutcome(msgspec.Struct, frozen=True):
    """A compare's report and exit code; `error`: what made the input unusable (exit code 2)."""

    exit_code: int
    payload: CompareReport
    error: str | None = None
    resumed: bool = False  # the session is a killed compare's, taken over (`compare/interrupted.py`)
    read_once: ReadOnce | None = None  # where both runs were ingested at once


class IngestOutcome(msgspec.Struct, frozen=True):
    exit_code: int
    payload: IngestReport
    error: str | None = None


class CompareEvent(msgspec.Struct, frozen=True, omit_defaults=True):
    """One line of the server's answer to a compare handed to it: progress (`step`, `done`, `total`), then the
    `outcome`, or the `failure` that stopped it."""

    step: str | None = None
    done: int = 0
    total: int = 0
    outcome: CompareOutcome | None = None
    failure: str | None = None


def unusable_report(
    message: str, problems: Sequence[ProblemReport], report: CompareReport | None = None
) -> CompareReport:
    """The report of a compare that found nothing to compare: `report` (or an empty one) with the error."""
    if report is None:
        report = CompareReport(
            session=None,
            pairs=[],
            unmatched=Unmatched([], []),
            verdict="incomplete",
            coverage=None,
            first_divergence=None,
            basis="values",
            pairs_on_summaries=0,
            next_capture=None,
            first_divergences={},
            culprits=[],
            error_growth=None,
            culprit_note=None,
            problems=[],
        )
    return msgspec.structs.replace(report, problems=list(problems), error=message)


def nothing_whole_words(pairs: int, in_part: Sequence[tuple[int, int]]) -> str:
    """In words, a comparison where no pair has a verdict (`pairs` of them): of them, the ones compared in part
    (`in_part`, each its reference rows compared and the reference's rows) said with what was compared of them:
    "no pair was compared whole: 1 pair compared in part (4 of 6 rows)"; "nothing was compared: 0 of 2 pairs
    compared" where none was."""
    if not in_part:
        return f"nothing was compared: 0 of {pairs} pairs compared"
    rows = ", ".join(f"{kept} of {total} rows" for kept, total in in_part[:3])
    rows += f" and {len(in_part) - 3} more" if len(in_part) > 3 else ""
    many = len(in_part) != 1
    count = f"{len(in_part)} pair{'s' if many else ''}" if len(in_part) == pairs else f"{len(in_part)} of {pairs} pairs"
    return f"no pair was compared whole: {count} compared in part ({rows})"


def unread_files(problems: Sequence[ProblemReport]) -> list[str]:
    """The files of `problems` that could not be read: their tensors are missing, so a comparison of their run is
    incomplete. Not those that held no tensor (`ignored`), nor those read whose tensor's name another already had
    (`second_tensors`)."""
    return [p.file for p in problems if not p.ignored and not is_second_tensor(p.reason)]


def second_tensors(problems: Sequence[ProblemReport]) -> list[ProblemReport]:
    """The problems of a file read whose tensor's name a tensor of another file (or key) of its run already had: which
    of the two the other run's tensor of that name stands for is a guess, so the comparison is no pass."""
    return [p for p in problems if not p.ignored and is_second_tensor(p.reason)]


def to_json(report: msgspec.Struct) -> dict[str, Any]:
    """A report as the JSON the command prints (`json.dumps` of it), UNSET fields left out."""
    data: dict[str, Any] = msgspec.to_builtins(report)
    return data
