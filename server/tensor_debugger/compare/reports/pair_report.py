"""One pair's report: the typed, frozen structure of a pair and its two sides, and the detail of one pair (its full
statistics, alignment steps, shards' shapes and argmax). `pair_reports` builds them from the store's rows; the module
and worst-pair reports (and the API, the CLI, the CSV export and the pages) take them from here, so none of those
imports the module that builds them."""

from __future__ import annotations

from dataclasses import dataclass

from tensor_debugger.compare.reports.formatting import replica_words
from tensor_debugger.compare.reports.pair_stats import PairStatsFull, PairStatsSummary
from tensor_debugger.compare.reports.summary_reports import SummaryReport
from tensor_debugger.compare.reports.where_reports import WhereEntry
from tensor_debugger.engine.alignment import ReferenceCut, Step
from tensor_debugger.engine.metrics import Number
from tensor_debugger.store.reports import PairStatus


@dataclass(frozen=True)
class PairSide:
    """One run's side of a pair: its logical tensor (several shards when a tensor-parallel run split it)."""

    name: str
    shape: list[int]  # after concatenating its shards
    dtype: str
    shards: int
    tensor_ids: list[int]
    run_id: int
    # a captured op's caller (capture with level="op"), "<file>:<line>": the innermost frame outside torch; else null
    source: str | None = None


@dataclass(frozen=True)
class ReplicaReport:
    """One side's shards are whole copies of the tensor (replicas on `ranks` ranks), each compared with the other
    side: `side` "a" (the reference's) or "b" (the candidate's); `differing`, the ranks whose copy has elements
    outside the tolerance (aligned dim 0 is the rank): [] when the pair passes, null where not known (the pair
    not compared, or its ranks not read)."""

    ranks: int
    side: str
    differing: list[int] | None

    def words(self) -> str:
        return replica_words(self.side, self.differing)


@dataclass(frozen=True)
class PairReport:
    id: int
    position: int
    name: str
    layer: int | None
    stage: str | None
    strategy: str  # a PairingStrategy, and for fuzzy pairs their score ("fuzzy 0.95")
    status: PairStatus
    alignment: str  # in words
    aligned_shape: list[int] | None
    alignment_overridden: bool
    a: PairSide
    b: PairSide
    stats: PairStatsSummary | None
    error: str | None
    module_path: str | None
    place: str | None
    summary: SummaryReport | None  # the verdict on summary statistics when element values are not available
    rule: str  # what judged the verdict: "tolerance", or "noise" (within the factor times the noise floor)
    # with a rerun in the session: its max |diff| at this tensor (the floor); for a pair judged on summaries, its
    # sampled max |diff| (a lower bound; the summary's reason says what the verdict rests on)
    noise_max_abs_diff: Number | None
    replicas: ReplicaReport | None  # where one side's shards are copies of the tensor, not parts of it
    # a failing pair's: the aligned dimensions that confine its error ([]: everywhere); null for any other pair, or
    # a result stored before `where` was computed
    where: list[WhereEntry] | None
    # two captured ops of one name and shape not paired by position alone, in words ("paired by content: ...",
    # "paired by position, ambiguous: ..."): compare/planning/op_pairs.pairing_note; null for any other pair
    pairing_note: str | None
    # the reference rows its alignment cut away, in words ("compared 4 of the reference's 6 rows along dim 0: ..."):
    # such a pair never passes (engine.alignment.cut_verdict); null where every reference element was compared
    reference_cut: str | None
    # the same cut as numbers: the reference rows compared (`kept`) of its `rows` along `axis`; null where none
    reference_rows: ReferenceCut | None

    @property
    def key(self) -> str:
        """The pair's key in the user's order: "reference name|candidate name"."""
        return f"{self.a.name}|{self.b.name}"


@dataclass(frozen=True)
class ArgmaxSide:
    tensor: str
    tensor_id: int
    index: list[int]  # in the run's own tensor (shard)


@dataclass(frozen=True)
class ArgmaxReport:
    """Where the largest difference is: in aligned coordinates, and in each run's own tensor."""

    aligned: list[int]
    max_abs_diff: Number
    a: ArgmaxSide
    b: ArgmaxSide


@dataclass(frozen=True)
class PairShapes:
    a: list[list[int]]  # each shard's
    b: list[list[int]]


@dataclass(frozen=True)
class PairDetail(PairReport):
    """A pair with its full statistics, alignment steps, shards' shapes and the argmax."""

    stats: PairStatsFull | None
    alignment_steps: list[Step]
    shapes: PairShapes
    argmax: ArgmaxReport | None
