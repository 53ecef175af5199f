"""What a session's comparison covered, and its verdict on that: a reference tensor with no partner in the
candidate, a pair whose comparison failed or that no alignment makes comparable, an input file that could not be
read: each is part of the answer, and a session reads "no divergence" only when everything was compared and
within tolerance. Also the closest candidates a hand pairing could give a reference tensor left without partner.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tensor_debugger.engine.alignment import Shape, alignment_choices
from tensor_debugger.engine.fuzzy import similarity, tokens
from tensor_debugger.store.reports import PairStatus

CLOSEST = 3  # candidates offered for each unmatched reference tensor
_WIDE = 200_000  # past this many (reference, candidate) scores, only tensors of the same layer are scored


class SessionVerdict(enum.StrEnum):
    """Where a session stands, in one word."""

    COMPARING = "comparing"  # pairs (or runs) not compared yet, and none outside tolerance so far
    # a pair is outside tolerance, or a module's output has another shape on each side where its inputs agree (that
    # pair is incomparable: no element was compared, but it is the first divergence)
    DIVERGED = "diverged"
    # no pair is outside tolerance, but not everything was compared: reference tensors without partner (that the
    # user did not allow), pairs that errored or are incomparable, input files that could not be read, runs compared
    # against a run that failed, is not ready or is gone (none of their tensors compared), pairs of captured ops out
    # of step (one side calls an op more often: not one value computed two ways)
    INCOMPLETE = "incomplete"
    NO_DIVERGENCE = "no_divergence"  # every reference tensor compared, every pair within tolerance
    # nothing compared yet: the session's runs are done, but none is a candidate (one run alone, the reference, or
    # with reruns of it): it stays so until a candidate run is added
    NO_CANDIDATE = "no_candidate"


@dataclass(frozen=True)
class RunCoverage:
    """What one candidate run compared of the run it is compared against (`against`, its label): `tensors`, that
    run's tensors the candidate was asked to record; `compared`, of them those compared (a pass or fail);
    `not_asked`, that run's tensors outside what the candidate was asked to record (a capture of some modules
    only, as find_divergence's full-values runs): not compared by choice, and not counted in `tensors`."""

    run: str
    against: str
    tensors: int
    compared: int
    not_asked: int = 0


@dataclass(frozen=True)
class RunNotCompared:
    """A run none of whose tensors was compared: the run it is compared against (`against`, its label; None where
    that run is gone) failed, is not ready yet or was removed (`why`)."""

    run: str
    against: str | None
    why: str

    @property
    def words(self) -> str:
        """ "run 'late' (compared against 'early', which failed)" """
        against = "a run that was removed" if self.against is None else repr(self.against)
        which = "" if self.against is None else f", which {self.why}"
        return f"run {self.run!r} (compared against {against}{which})"


@dataclass(frozen=True)
class OutOfStep:
    """A pair of captured ops out of step (`name`, the pair's): one side calls the op more often in a module call,
    so which calls face each other is not known, or their outputs' shapes or kinds differ (`why`, in plain words).
    Its values are not one value computed two ways: it is not compared, and no verdict counts it."""

    name: str
    why: str


@dataclass(frozen=True)
class Coverage:
    """How much of the reference was compared. `reference_tensors`: the reference's tensors (logical: shards of one
    count once); `compared`: of them, those compared (a verdict of pass or fail) with every candidate that was asked
    to record them, by one at least; `unmatched`: those with no partner in a candidate that the user did not allow;
    `allowed_unmatched`: those the user allowed to stay unpaired (a pairing file's `unpaired`, an unpair by hand,
    `--allow-unmatched`), and those no candidate that compared anything of them was asked to record (outside the
    modules a capture asked for); a tensor one candidate was not asked to record and another compared counts as
    compared; `not_compared`: the pairs that errored or are incomparable; `unread_files`: input files that could
    not be read; `ambiguous_files`: files read whose tensor's name a tensor of another file of its run already had
    (which of the two the other run's tensor stands for is a guess: no pass); `runs`: each candidate run's own
    coverage of the run it is compared against;
    `runs_not_compared`: the runs compared against a run that failed, is not ready or is gone (no pairs at all);
    `out_of_step`: the pairs of captured ops out of step, not compared (their reference tensors are not counted in
    `compared`). An explored run (`explore`: every tensor against every other) counts its tensors of either side of
    its pairs, each compared where one pair of it was at least."""

    reference_tensors: int = 0
    compared: int = 0
    unmatched: list[str] = field(default_factory=list)
    allowed_unmatched: list[str] = field(default_factory=list)
    not_compared: list[str] = field(default_factory=list)
    unread_files: int = 0
    ambiguous_files: int = 0
    runs_not_compared: list[RunNotCompared] = field(default_factory=list)
    runs: list[RunCoverage] = field(default_factory=list)
    out_of_step: list[OutOfStep] = field(default_factory=list)

    @property
    def left_out(self) -> bool:
        """Whether anything was not compared (the verdict is incomplete where no pair fails)."""
        return bool(
            self.unmatched
            or self.not_compared
            or self.unread_files
            or self.ambiguous_files
            or self.runs_not_compared
            or self.out_of_step
        )


def session_verdict(
    statuses: Iterable[PairStatus | str],
    coverage: Coverage,
    ingesting: bool = False,
    diverged: bool = False,
    no_candidate: bool = False,
) -> SessionVerdict:
    """The verdict: diverged when a pair fails, or where a first divergence was found without a failing pair
    (`diverged`: a module's output of another shape on each side, its inputs compared and passing:
    compare/reports/reshaped.py); comparing while pairs are pending or runs ingest; no candidate where the runs
    are done and none is a candidate (`no_candidate`); incomplete when anything was left out (`coverage`); no
    divergence when pairs exist and all of them pass."""
    seen = set(statuses)
    if PairStatus.FAIL in seen or diverged:
        return SessionVerdict.DIVERGED
    if PairStatus.PENDING in seen or ingesting:
        return SessionVerdict.COMPARING
    if no_candidate and not seen:
        return SessionVerdict.NO_CANDIDATE
    if coverage.left_out:
        return SessionVerdict.INCOMPLETE
    if PairStatus.PASS in seen:
        return SessionVerdict.NO_DIVERGENCE
    return SessionVerdict.COMPARING  # no pair yet: a session waiting for its runs


@dataclass(frozen=True)
class ClosestCandidate:
    """A candidate tensor with no partner that a hand pairing could give an unmatched reference tensor: its fuzzy
    name score (0 to 1), whether its element count is the reference tensor's, and whether an alignment fits the
    two (as `POST /api/sessions/{id}/pairs` would take them; `GET .../pairs/choices` lists them)."""

    name: str
    score: float
    same_numel: bool
    alignment_fits: bool


@dataclass(frozen=True)
class Unpaired:
    """A logical tensor with no partner: its name, its layer (parsed at ingest) and its shards' shapes."""

    name: str
    layer: int | None
    shapes: Sequence[Shape]

    @property
    def numel(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


def closest_candidates(reference: Sequence[Unpaired], candidates: Sequence[Unpaired]) -> list[list[ClosestCandidate]]:
    """For each reference tensor, the `CLOSEST` candidate tensors a hand pairing could take: best name score
    first, then a matching element count, then an alignment that fits; none scoring 0 with neither."""
    words = {c.name: tokens(c.name) for c in candidates}
    wide = len(reference) * len(candidates) > _WIDE
    found = []
    for a in reference:
        mine = tokens(a.name)
        scored = []
        for b in candidates:
            if wide and b.layer != a.layer:
                continue
            score = similarity(mine, words[b.name])
            same = a.numel == b.numel
            if score > 0 or same:
                scored.append((score, same, b))
        scored.sort(key=lambda s: (-s[0], not s[1], s[2].name))
        best = []
        for score, same, b in scored[: CLOSEST * 3]:  # the alignments of the likeliest few only: they cost more
            fits = bool(alignment_choices(list(a.shapes), list(b.shapes)))
            best.append(ClosestCandidate(b.name, round(score, 3), same, fits))
        best.sort(key=lambda c: (-c.score, not c.same_numel, not c.alignment_fits, c.name))
        found.append(best[:CLOSEST])
    return found
