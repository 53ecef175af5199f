"""What `find_divergence` answers (`live/divergence.py`): the first divergence, the pairs compared element by
element, what was and was not compared, the precision floor that judged them, and the words that say it all."""

from __future__ import annotations

import html
from dataclasses import dataclass, field

from tensor_debugger.compare.reports.compare_report import CrossedOps, HeldBefore, LoweredFirst, RecordedEarly
from tensor_debugger.compare.reports.divergence_words import (
    OUTPUTS_AGREE,
    OUTPUTS_WITHIN,
    SUMMARIES_FOUND_NOTHING,
    crossed_words,
    early_words,
    holds_words,
    lowered_clause,
    slices_words,
    tensors,
)
from tensor_debugger.compare.reports.noise import NOISE_FACTOR
from tensor_debugger.engine.head_slices import HeadSlices
from tensor_debugger.engine.summary_compare import SketchVerdict
from tensor_debugger.live.capture_names import is_module_input, module_of
from tensor_debugger.live.own_error import OwnError
from tensor_debugger.live.state_differences import StateDifference, state_words

NOISE_RUN, NOISE_FULL_RUN = "noise", "noise (full)"  # the precision floor's runs in the session (role "noise")
# module calls replayed on the reference's arguments (live/own_error.py): the reference's, the candidate's (compared
# against the first), the floor copy's (its rerun, role "noise")
OWN_RUNS = ("reference (own)", "candidate (own)", "noise (own)")
_LISTED = 5  # one side's unpaired tensors just before the first divergence named in its words, the nearest


@dataclass(frozen=True)
class ElementStats:
    """A pair compared element by element (the second pass)."""

    reference: str
    candidate: str
    shape: tuple[int, ...]
    max_abs_diff: float
    argmax: tuple[int, ...]  # where max |diff| is
    mismatched: int  # elements outside the tolerance
    numel: int
    passed: bool
    # with a precision floor: the floor's max |diff| at this tensor, where it judged the pair (passed: within
    # NOISE_FACTOR times it); None where there is none, or it is zero or infinite there (the tolerance judged)
    floor_max_abs_diff: float | None = None


@dataclass(frozen=True)
class FirstDivergence:
    reference: str  # the reference's tensor: "Net.layers.1.self_attn/mul#1_outputs"
    candidate: str
    module: str  # the module call holding it: "Net.layers.1.self_attn"
    op: str | None  # the op's function, where the tensor is an op's ("mul")
    # "<file>:<line>" of the op's caller; for a module call's input or output, of the line that called the module
    reference_source: str | None
    candidate_source: str | None
    summary: SketchVerdict  # what the summaries showed
    full: ElementStats | None  # the same pair from full values (None where the second pass did not record it)
    # tensors one side recorded and the other did not, between the last pair before it and it (in each side's own
    # order), with the line that made each ("" where none was recorded): an op one implementation runs and the
    # other does not (an extra scale, a cast, a fused kernel) is where the divergence may have begun
    candidate_only_before: tuple[tuple[str, str], ...] = ()
    reference_only_before: tuple[tuple[str, str], ...] = ()
    # the first pair before it whose values differ at all (their summaries' hashes differ) though within tolerance,
    # with the reference's line ("" where none): where a difference too small to fail began, which then grew
    first_changed: tuple[str, str] | None = None
    # every tensor of the reference before it, in its order, that paired with none of the candidate's (as the
    # session's `unmatched_before`): `reference_only_before` and any earlier, none of them compared
    unmatched_before: tuple[str, ...] = ()
    # the line that made each of `unmatched_before` ("" where none), in its order
    unmatched_before_sources: tuple[str, ...] = ()
    # every tensor of the candidate before it, in its order, that paired with none of the reference's, with its line
    # ("" where none): `candidate_only_before` and any earlier. An op both sides run, once more on one side and right
    # beside its twin (a scale applied twice), faces none of the other side's (either call could be its partner), so
    # the candidate's extra call, the bug, lies here, with the reference's call in `unmatched_before`
    candidate_unmatched_before: tuple[tuple[str, str], ...] = ()
    # how its two ops were paired where not by position alone (two ops of one name and shape in one module call):
    # "paired by content: ...", or "paired by position, ambiguous: ..." (its error then counts toward no culprit); or
    # how two module inputs were paired where one side passed it by keyword: "paired by parameter: ...", or "paired
    # by parameter name through **kwargs: ..." where that keyword went into one side's `**kwargs`
    pairing: str | None = None
    # tensors of the candidate just before it (after the last whose partner the reference recorded before it), in
    # its order, that pair by name with tensors the reference records only after it: each with its line and its
    # partner's line ("" where none). A module called in another's place (the attention's norm called as the
    # feed-forward's) pairs by name with the reference's later call of it, so its line, the bug's, is here
    candidate_early_before: tuple[tuple[str, str, str], ...] = ()
    # ops of its module call before it, of one name and shape, that paired by content with an op of another call
    # index on the other side (the candidate's `getitem#1` holding what the reference's `getitem#2` holds): each the
    # reference's tensor and line, the candidate's and line. Two slices swapped in use (a rotary turning the half it
    # should pass) hold the same values on both sides, so no pair of theirs differs: their lines are only here
    crossed_before: tuple[tuple[str, str, str, str], ...] = ()
    # the reference's tensor recorded before it that holds, bit for bit, what the candidate's holds (content hashes
    # equal; not a constant), with its line ("" where none): a cache given the keys before their rotary holds the
    # reference's keys as they were before it, so the op that made them names the step the candidate skipped
    candidate_holds: tuple[str, str] | None = None
    # whether it was found by full values, element by element: the earliest pair of the second pass that fails, which
    # the summaries passed (they bound max |diff| from below: sampled elements, norms, means); `summary_first`, the
    # pair the summaries named first, later, where they named one
    by_full: bool = False
    summary_first: str | None = None
    # `first_changed`'s pair from full values, where the second pass recorded it (None where it did not)
    first_changed_full: ElementStats | None = None
    # inside its module call, the candidate's ops before it that paired with none of the reference's (a loop over
    # heads against one batched op), checked by values against slices of the reference's tensors there
    # (live/slices_inside.py); None where there were none, or no full values of them
    inside: HeadSlices | None = None
    # the lines that made the tensors `inside` names: the reference's, the candidate's (name, "<file>:<line>")
    inside_lines: tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = ((), ())


@dataclass(frozen=True)
class Divergence:
    """What `find_divergence` found: see its docstring. `first` is None where no difference was found in the
    summaries."""

    session: str
    location: str  # the session's URL on the server, or the local data dir that holds it
    first: FirstDivergence | None
    # modules whose outputs fail while every input recorded was compared and passes, from the full values, in order
    culprits: list[str]
    compared: int  # pairs of summaries compared
    full_modules: tuple[str, ...]  # the `modules=` patterns of the second pass
    next_capture: str | None  # the second pass, as a snippet to rerun
    runs: tuple[str, ...]
    failing_full: list[ElementStats] = field(default_factory=list)  # the second pass's failing pairs, in order
    # the last tensor of the reference's and of the candidate's up to which a second call gave the same values
    # (content hashes of every tensor up to it); None where no model was called twice (no divergence found)
    repeatable_until: tuple[str, str] | None = None
    # the reference's and the candidate's tensors that paired with none of the other's, so were not compared
    unpaired: tuple[int, int] = (0, 0)
    # where no divergence was found: the first pair whose values differ at all (within tolerance), and its line
    changed: tuple[str, str] | None = None
    # what the summary captures could not see (a compiled region's ops), each "the reference: ..." or "the
    # candidate: ..."
    notes: tuple[str, ...] = ()
    # modules whose outputs fail and whose compared inputs pass but with inputs that were not compared (paired with
    # none of the candidate's, or left unpaired as out of step): each with those inputs; no culprit is named on them
    uncompared_inputs: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # of the pairs of summaries compared, those whose tensors hold no elements (an empty batch): equal, whatever the
    # models compute
    empty: int = 0
    # the precision floor (live/precision_floor.py): the candidate's dtype where it is less precise than the
    # reference's and a converted copy of the reference judged the pairs ("float16"), else None
    floor: str | None = None
    # pairs of summaries outside their tolerance but within the precision floor, so passed
    within_floor: int = 0
    # pairs of summaries within their tolerance but more than NOISE_FACTOR times the precision floor, so failed
    beyond_floor: int = 0
    # from full values, the module outputs outside tolerance but within the precision floor: no culprit is named on
    # their modules (a bug whose effect there is no more than 4 times the rounding)
    floored_outputs: tuple[str, ...] = ()
    # why no precision floor was used though the candidate's dtype is less precise (the converted copy raised)
    floor_note: str | None = None
    # whether the precision floor is the reference run under torch.autocast (the candidate computed parts of its
    # forward in `floor` though its parameters are the reference's dtype), not a converted copy of it
    floor_autocast: bool = False
    # with that floor: the reference's modules run under autocast, where the candidate computes in `floor` (paths
    # without the model's class name); () where the whole forward ran under it
    floor_region: tuple[str, ...] = ()
    # with that floor run under autocast in all of the reference: why autocast in those modules only was not used
    # (what it raised), else None
    floor_widened: str | None = None
    # with that floor: the candidate's first tensor in `floor` where the reference computes in another dtype, and
    # the line that made it ("" where none): where the candidate's own lower precision begins
    lowered_first: tuple[str, str] | None = None
    # modules one side calls more often than the other on inputs of other shapes (a block run row by row and
    # concatenated, against one call on the batch): (module path without the model's class name, the reference's
    # calls, the candidate's); their calls face none of each other's, so their tensors were not compared
    split_calls: tuple[tuple[str, int, int], ...] = ()
    # with a converted precision floor: the modules whose outputs were within it while their inputs passed, each
    # called again on the reference's arguments to it (live/own_error.py), in order; a culprit where its own error
    # stands out against the floor copy's
    own_errors: tuple[OwnError, ...] = ()
    # the module call that made the first divergence (the reference's, the candidate's) and its parameters and
    # buffers that differ from the reference's of one name and shape (live/state_differences.py); None where none do
    state: tuple[str, str, tuple[StateDifference, ...]] | None = None
    # where a divergence was found: whether every one of the models' own outputs paired with a bit-identical one
    # (content hashes equal: a causal mask let one future token through, then a second mask took it out again): the
    # divergence does not reach them
    outputs_agree: bool = False
    # where a divergence was found: whether every one of the models' own outputs paired with one within tolerance
    # by their summaries, not all bit-identical (the first pass's verdicts: a norm folded into a conv's weights makes
    # the conv's outputs differ, not the model's)
    outputs_within: bool = False
    # modules whose outputs fail while their inputs agree within tolerance but not bit for bit, whose candidate
    # module, called on the reference's arguments to it, gives the reference's outputs within tolerance: no
    # culprit is named on them (their inputs' difference grown past the tolerance, not their own doing)
    grown: tuple[str, ...] = ()
    # the session name asked for, where a session had it already: the answer is stored as a new session, `session`
    # ("fd (2)"), as `compare` names one; None where the name asked for was free
    asked_session: str | None = None
    # where no divergence was found but hashes differ (`changed`): the pairs the second pass compared element by
    # element (of the modules `full_modules`), every one within tolerance; `changed`'s own figures among them
    full_compared: int = 0
    changed_full: ElementStats | None = None
    # the rules by which the candidate's copies of a module paired with the reference's calls of one module called
    # several times (engine/shared_calls.py), in words: not by name
    shared_calls: tuple[str, ...] = ()

    @staticmethod
    def _earlier_in_call(f: FirstDivergence) -> str:
        """The candidate's ops without partner earlier in the first diverging op's module call than those just
        before it, pairs that agree between them and it (Falcon's ALiBi slopes negated, `-torch.pow(...)`: the
        port's `neg` one-sided, then the positions' ops, paired and equal, then the slopes' use, the divergence)."""
        if "/" not in f.candidate:
            return ""
        call = f.candidate.partition("/")[0] + "/"
        named = set(f.candidate_only_before)
        earlier = [(n, at) for n, at in f.candidate_unmatched_before if n.startswith(call) and (n, at) not in named]
        if not earlier:
            return ""
        shown = [f"{n} ({at})" if at else n for n, at in earlier[-_LISTED:]]
        more = f"{len(earlier) - len(shown)} more and then " if len(earlier) > len(shown) else ""
        return (
            f" Earlier in its module call, the candidate recorded {more}{', '.join(shown)}, which paired with none "
            "of the reference's: an op it runs that the reference does not may be where it began."
        )

    def words(self) -> str:
        seen = f" What the captures could not see: {'; '.join(self.notes)}." if self.notes else ""
        seen = self._floor_words() + self._split_words() + seen
        seen += "".join(f" Tensors of the candidate were {rule}." for rule in self.shared_calls)
        if self.first is None:
            return self._none_found() + seen + f" {self._session_words()}: {self.location}."
        f = self.first
        where = ""
        how = "passed" if is_module_input(f.reference) else "called"
        if f.reference_source or f.candidate_source:
            where = f" ({how} at {f.reference_source} in the reference, {f.candidate_source} in the candidate)"
        elif how == "passed":  # both captured here: no frame outside torch and this package called the module
            where = " (no source line: the module was called from no code outside torch)"
        if f.by_full:
            summaries_named = (
                f"; the summaries named {f.summary_first} first, a later pair"
                if f.summary_first is not None
                else "; the summaries found no pair outside tolerance"
            )
            text = (
                f"The first divergence, found by comparing full values element by element, is {f.reference}{where}, "
                f"in module {f.module}. Its summaries found nothing outside tolerance there (they bound max |diff| "
                f"from below: sampled elements, norms and means){summaries_named}."
            )
        else:
            text = (
                f"The first divergence is {f.reference}{where}, in module {f.module}: {f.summary.reason}."
                if f.summary.reason
                else ""
            )
        if f.candidate_holds is not None:
            text += " " + holds_words(HeldBefore(f.candidate, *f.candidate_holds))
        if f.pairing:
            how, _, why = f.pairing.partition(": ")
            text += f" Its two {'inputs' if how.startswith('paired by parameter') else 'ops'} were {how}: {why}."
        for side, extra, other in (
            ("candidate", f.candidate_only_before, "reference"),
            ("reference", f.reference_only_before, "candidate"),
        ):
            if extra:  # the last few, nearest the divergence (a fused block against its parts makes dozens)
                shown = extra[-_LISTED:]
                listed = ", ".join(f"{n} ({at})" if at else n for n, at in shown)
                hidden = len(extra) - len(shown)
                more = f"{hidden} more {tensors(hidden)} and then " if hidden > 0 else ""
                text += f" Just before it, the {side} recorded {more}{listed}, which paired with none of the {other}'s."
        if f.inside is not None:
            text += " " + slices_words(f.module, f.inside, *(dict(lines) for lines in f.inside_lines))
        if f.candidate_early_before:
            text += " " + early_words([RecordedEarly(*e) for e in f.candidate_early_before])
        if f.crossed_before:
            text += " " + crossed_words([CrossedOps(*c) for c in f.crossed_before])
        if len(f.unmatched_before) > len(f.reference_only_before):  # some earlier than those just before it
            count = len(f.unmatched_before)
            lines = f.unmatched_before_sources or ("",) * count
            first_few = [f"{n} ({at})" if at else n for n, at in zip(f.unmatched_before, lines, strict=True)][:_LISTED]
            more = f", and {count - len(first_few)} more" if count > len(first_few) else ""
            text += (
                f" {count} tensor{'s' if count != 1 else ''} of the reference before it paired with none of the "
                f"candidate's and {'were' if count != 1 else 'was'} not compared (the first: {', '.join(first_few)}"
                f"{more}); the divergence may have begun there."
            )
        # the candidate's, where the reference's are named too (an op of both left unpaired as twins: the
        # candidate's extra call is among these); the last few, nearest the divergence
        if len(f.unmatched_before) > len(f.reference_only_before) and len(f.candidate_unmatched_before) > len(
            f.candidate_only_before
        ):
            count = len(f.candidate_unmatched_before)
            last_few = [f"{n} ({at})" if at else n for n, at in f.candidate_unmatched_before[-_LISTED:]]
            more = f"{count - len(last_few)} more and then " if count > len(last_few) else ""
            text += (
                f" {count} tensor{'s' if count != 1 else ''} of the candidate before it paired with none of the "
                f"reference's (the last: {more}{', '.join(last_few)}): an op it runs that the reference does not, or "
                "runs once more beside its twin, may be where it began."
            )
        else:
            text += self._earlier_in_call(f)
        if f.first_changed is not None:
            changed, at = f.first_changed
            text += (
                f" The first tensor whose values differ at all (content hashes) is {changed}{f' ({at})' if at else ''}"
                f"; {_changed_words(f.first_changed_full)}."
            )
        if f.full is not None:
            text += (
                f" From full values: max |diff| {f.full.max_abs_diff:.4g} at {list(f.full.argmax)}, "
                f"{f.full.mismatched} of {f.full.numel} elements outside tolerance"
            )
            if f.full.floor_max_abs_diff is not None:
                within = "within" if f.full.passed else "more than"
                text += (
                    f", {within} {NOISE_FACTOR:g} times the precision floor's max |diff| "
                    f"{f.full.floor_max_abs_diff:.4g}"
                )
            text += "."
        own = {e.module for e in self.own_errors if e.culprit}
        if self.culprits:
            text += " Culprit: " + ", ".join(
                f"{c} (its own error, given the reference's inputs, is {self._own(c).ratio:.1f}x the precision floor's)"
                if c in own
                else f"{c} (its inputs agree, its outputs do not)"
                for c in self.culprits
            )
            text += "."
        if self.grown:
            text += (
                f" No culprit is named on {', '.join(self.grown)}: its inputs agree within tolerance but not bit "
                "for bit, and the candidate's module, called again on the reference's inputs to it, gives the "
                "reference's outputs within tolerance: its outputs differ because its inputs do (a difference "
                "within tolerance grown past it), not by its own doing; look before it."
            )
        if self.state is not None:
            said = state_words(*self.state)
            text += f" {said[0].upper()}{said[1:]}."
        text += self._own_words()
        # the outputs within the floor whose module no replay named
        floored_left = tuple(n for n in self.floored_outputs if module_of(n) not in own)
        if floored_left:
            floored = floored_left[-_LISTED:]  # the last, nearest the divergence's module
            hidden = len(floored_left) - len(floored)
            text += (
                " From full values, module outputs outside tolerance but within the precision floor, so no culprit "
                f"is named on their modules for them: {f'{hidden} more and then ' if hidden else ''}"
                f"{', '.join(floored)}."
            )
        for module, inputs in self.uncompared_inputs:
            text += (
                f" No culprit is named on {module}: its outputs do not agree, but its input"
                f"{'s' if len(inputs) != 1 else ''} {', '.join(inputs)} {'were' if len(inputs) != 1 else 'was'} not "
                "compared (paired with none of the candidate's: no partner, or one of another shape or kind of "
                f"dtype), so whether {'they agree' if len(inputs) != 1 else 'it agrees'} is not known."
            )
        if self.outputs_agree:
            text += " " + OUTPUTS_AGREE
        elif self.outputs_within:
            text += " " + OUTPUTS_WITHIN
        if self.repeatable_until is not None:
            a, b = self.repeatable_until
            text += (
                f" Called again, each model gave the same values up to {a} (reference) and {b} (candidate) (the "
                "content hash of every tensor up to there compared; what comes after cannot change this answer)."
            )
        text += seen + f" {self._session_words()}: {self.location} (runs {', '.join(self.runs)})."
        return text

    def _session_words(self) -> str:
        """The session that holds the runs, and why it is not the one asked for where it is not."""
        if self.asked_session is None:
            return f"Session {self.session!r}"
        return (
            f"A session named {self.asked_session!r} exists already and is left as it was: this answer's runs are "
            f"in a new session, {self.session!r}"
        )

    def _own(self, module: str) -> OwnError:
        return next(e for e in self.own_errors if e.module == module)

    def _own_words(self) -> str:
        """What calling each module again on the reference's arguments showed, or why it could not be done."""
        text = ""
        for e in self.own_errors:
            if e.reason is not None:
                text += (
                    f" {e.module}'s outputs are within the precision floor, and its own error could not be measured: "
                    f"it cannot be replayed ({e.reason}), so no culprit is named on it from its own error."
                )
                continue
            if not e.culprit:
                continue  # listed together below
            figures = (
                f"max |diff| {e.candidate_error:.4g} against the floor copy's {e.floor_error:.4g} on the same "
                f"inputs; relative RMSE {e.candidate_rmse:.3g} against {e.floor_rmse:.3g}, the inputs' cast adding "
                f"{e.input_rmse:.3g}"
            )
            text += (
                f" {e.module}'s outputs are within {NOISE_FACTOR:g} times the precision floor (the rounding "
                f"accumulated before it), but its own error, given the reference's inputs, is {e.ratio:.1f}x the "
                f"precision floor's ({figures}): a culprit, on a replay of its call that find_divergence made "
                f"(stored as runs {', '.join(repr(r) for r in OWN_RUNS)})."
            )
        rounding = [e for e in self.own_errors if e.reason is None and not e.culprit]
        if rounding:
            listed = ", ".join(f"{e.module} {e.ratio:.1f}x" for e in rounding)
            text += (
                f" Called again on the reference's arguments to them, the own errors of modules within the precision "
                f"floor, each against the floor copy's (max |diff|): {listed}: no culprit among them."
            )
        return text

    def _floor_words(self) -> str:
        """What the precision floor did, or why there was none."""
        if self.floor_note is not None:
            return f" {self.floor_note}."
        if self.floor is None:
            return ""
        many = self.within_floor != 1
        beyond = ""
        if self.beyond_floor:
            more = self.beyond_floor != 1
            beyond = (
                f" {self.beyond_floor} pair{'s' if more else ''} of summaries within tolerance "
                f"{'were' if more else 'was'} more than {NOISE_FACTOR:g} times the precision floor, so "
                f"{'they fail' if more else 'it fails'}."
            )
        how = " (a torch.autocast region, or casts of its own)" if self.floor_autocast else ""
        if self.lowered_first is not None:
            name, at = self.lowered_first
            how += ", " + lowered_clause(LoweredFirst(name, at, self.floor))
        return (
            f" The candidate computes {'parts of its forward ' if self.floor_autocast else ''}in {self.floor}"
            f"{how}: every pair was judged against the precision floor of {self.floor} ({self._floor_copy()}, "
            f"stored as the session's rerun, run {NOISE_RUN!r}, so that its pages judge as this answer does): a "
            f"pair passes where its |diff| is within {NOISE_FACTOR:g} times the floor's and fails where it is more "
            "(from summaries, of the sampled elements and the norms: lower bounds; where the floor's is zero or "
            f"infinite, the tolerance judges). {self.within_floor} pair{'s' if many else ''} of summaries "
            f"{'were' if many else 'was'} outside tolerance but within the precision floor: rounding to the lower "
            f"precision, not a difference of the candidate's own.{beyond}"
        )

    def _floor_copy(self) -> str:
        """What ran as the precision floor, in words."""
        if self.floor_autocast and self.floor_region:
            shown = ", ".join(self.floor_region[:_LISTED]) + (", ..." if len(self.floor_region) > _LISTED else "")
            return (
                f"the reference run on the same inputs with torch.autocast to {self.floor} in the forward of "
                f"{shown} only, where the candidate computes in it"
            )
        if self.floor_autocast and self.floor_widened:
            return (
                f"the reference run under torch.autocast to {self.floor} on the same inputs, all of its forward: with "
                f"autocast in only the modules where the candidate computes in it, it raised {self.floor_widened}"
            )
        if self.floor_autocast:
            return f"the reference run under torch.autocast to {self.floor} on the same inputs"
        return f"a copy of the reference converted to {self.floor}, run on the same inputs cast to it"

    def _split_words(self) -> str:
        """The modules whose calls were split differently on the two sides, so not compared."""
        if not self.split_calls:
            return ""
        listed = ", ".join(
            f"{path.lstrip('.')} ({a} call{'s' if a != 1 else ''} in the reference, {b} in the candidate)"
            for path, a, b in self.split_calls
        )
        return (
            f" Called a different number of times on inputs of other shapes (a batch run in pieces?): {listed}; "
            "those calls face none of the other side's, so their tensors (and those of the modules inside them) "
            "were not compared."
        )

    def _none_found(self) -> str:
        """The answer where no pair of summaries failed, claiming no more than the pairs compared."""
        a, b = self.unpaired
        left = (
            f" {a} tensor{'s' if a != 1 else ''} of the reference and {b} of the candidate paired with none of the "
            "other's and were not compared."
            if a or b
            else ""
        )
        if not self.compared:
            return f"Nothing was compared: no tensor of the reference pairs with one of the candidate.{left}"
        if self.changed is not None and self.repeatable_until is not None:  # the full values looked at too
            name, at = self.changed
            modules = (
                "the whole model"
                if "*" in self.full_modules
                else f"modules {', '.join(repr(m) for m in self.full_modules)}"
            )
            found = (
                "From summaries and full values: no divergence found, though values differ (content hashes) from "
                f"{name}{f' ({at})' if at else ''} on: none of the {self.compared} pairs of summaries is outside "
                "tolerance, and the "
                f"{self.full_compared} pairs whose full values were compared element by element (those of "
                f"{modules}) are all within it; at {name}, {_changed_words(self.changed_full)}"
            )
        elif self.changed is not None:
            name, at = self.changed
            found = (
                f"From summaries: no divergence found in {self.compared} pairs of summaries, but values differ "
                f"(content hashes) from {name}{f' ({at})' if at else ''} on; the summaries found nothing outside "
                "tolerance there"
            )
        else:
            found = f"From summaries: no difference found in {self.compared} pairs of summaries"
        if self.floor is not None and self.within_floor and self.repeatable_until is not None:
            found = (
                "From summaries and full values: no divergence beyond the precision floor of "
                f"{self.floor} found in {self.compared} pairs of summaries nor in the {self.full_compared} pairs "
                "whose full values were compared element by element"
            )
        elif self.floor is not None and self.within_floor:
            found = (
                f"From summaries: no divergence beyond the precision floor of {self.floor} found in {self.compared} "
                "pairs of summaries"
            )
        if self.empty:
            every = "Every one of those pairs" if self.empty == self.compared else f"{self.empty} of those pairs"
            theirs = "theirs" if self.empty > 1 else "its"
            left += f" {every} held no elements (an empty input?): no value of {theirs} was compared."
        if self.repeatable_until is not None:
            ref_until, cand_until = self.repeatable_until
            return (
                f"{found}. The other pairs were compared by hashes, norms, means and sampled elements (lower bounds of "
                f"max |diff|: not every element of theirs was compared).{left} Called again, each model gave the same "
                f"values up to {ref_until} (reference) and {cand_until} (candidate) (runs {', '.join(self.runs)})."
            )
        return (
            f"{found} (hashes, norms, means and sampled elements; not every element was compared).{left} Each "
            "model was called once (whether it gives the same values on every call was not checked)."
        )

    def __repr__(self) -> str:
        return self.words()

    def _repr_markdown_(self) -> str:
        return self.words()

    def _repr_html_(self) -> str:
        return f"<p>{html.escape(self.words())}</p>"


def _changed_words(full: ElementStats | None) -> str:
    """What is known of the first pair whose hashes differ but whose summaries pass: from its full values where the
    second pass compared them, else only that the summaries, lower bounds of max |diff|, found nothing."""
    if full is None:
        return SUMMARIES_FOUND_NOTHING
    if full.passed:
        return f"its full values are within tolerance (max |diff| {full.max_abs_diff:.4g}, every element compared)"
    return f"its full values differ beyond tolerance (max |diff| {full.max_abs_diff:.4g})"
