"""The report `tensor-debugger compare` prints (`--json`: a stable contract for scripts, narrower than the API's),
read from the same reports. The server builds it too, for a command line that hands it the work (the warm path).
Its types: `compare_report.py`."""

from __future__ import annotations

import re
from collections.abc import Sequence

import msgspec

from tensor_debugger.compare.reports.compare_report import (
    ComparedPair,
    CompareReport,
    CoverageSummary,
    Culprit,
    DivergenceSummary,
    NextCaptureSummary,
    OutOfStepSummary,
    ReferenceRows,
    Replicas,
    RunCoverageSummary,
    RunNotComparedSummary,
    SessionLink,
    SideSummary,
    StatsSummary,
    Unmatched,
    WorstValue,
)
from tensor_debugger.compare.reports.pair_report import PairReport, PairSide
from tensor_debugger.compare.reports.pair_reports import FirstDivergence, SessionPairs, UnmatchedReport
from tensor_debugger.compare.reports.pair_stats import PairStatsSummary
from tensor_debugger.engine.culprits import RANKED_ENOUGH
from tensor_debugger.engine.summary_compare import NextCapture, next_capture
from tensor_debugger.store.problem_report import ProblemReport


def _side(side: PairSide) -> SideSummary:
    return SideSummary(side.name, side.shape, side.dtype, side.source)


def _stats(stats: PairStatsSummary | None) -> StatsSummary | None:
    if stats is None:
        return None
    return StatsSummary(
        stats.max_abs_diff,
        stats.mean_abs_diff,
        stats.max_rel_diff,
        stats.mean_rel_diff,
        stats.mse,
        stats.cosine,
        stats.mismatched,
        stats.numel,
        stats.argmax,
        stats.nan_a,
        stats.nan_b,
        stats.inf_a,
        stats.inf_b,
        [WorstValue(w.index, w.a, w.b, w.abs_diff) for w in stats.worst],
    )


def _pair(p: PairReport, report: SessionPairs) -> ComparedPair:
    return ComparedPair(
        name=p.name,
        layer=p.layer,
        stage=p.stage,
        status=str(p.status),
        alignment=p.alignment,
        strategy=str(p.strategy),
        a=_side(p.a),
        b=_side(p.b),
        stats=_stats(p.stats),
        error=p.error,
        module_path=p.module_path,
        place=p.place,
        summary=p.summary,
        candidate=report.candidate_of(p),
        rule=p.rule,
        noise_max_abs_diff=p.noise_max_abs_diff,
        replicas=Replicas(p.replicas.ranks, p.replicas.side, p.replicas.differing) if p.replicas else None,
        where=p.where,
        pairing_note=p.pairing_note,
        reference_rows=None
        if p.reference_rows is None
        else ReferenceRows(p.reference_rows.kept, p.reference_rows.rows, p.reference_rows.axis),
    )


def _divergence(found: FirstDivergence | None, report: SessionPairs) -> DivergenceSummary | None:
    if found is None:
        return None
    return DivergenceSummary(
        found.name,
        found.layer,
        found.stage,
        found.where,
        found.unmatched_before,
        found.basis,
        found.summary_reason,
        found.candidate_only_before,
        found.first_changed,
        found.in_execution_order,
        first_changed_on_summaries=found.first_changed_on_summaries,
        source_note=found.source_note,
        crossed_before=found.crossed_before,
        lowered_first=found.lowered_first,
        candidate_early_before=found.candidate_early_before,
        candidate_holds=found.candidate_holds,
        find_divergence_checks=found.find_divergence_checks,
        outputs_agree=found.outputs_agree,
        order_note=found.order_note,
        paired_by=found.paired_by,
        candidate_name=found.candidate_name,
        not_compared_before=found.not_compared_before,
        statistics_before=report.statistics_before(found),
    )


def _culprits(report: SessionPairs) -> list[Culprit]:
    """The modules of a trace or capture whose added error (relative RMSE, output minus input) stands out, largest
    first; in a plain dump, its stages whose error added to the tensor before it does (engine/culprits.py's
    stands_out); [] where none stands out."""
    modules = report.modules.culprits if report.modules else []
    if modules:
        return [
            Culprit(
                module_path=c.module_path,
                added_error=c.added_error,
                input_error=c.input_error,
                output_error=c.output_error,
            )
            for c in modules
        ]
    return [
        Culprit(
            name=c.name,
            layer=c.layer,
            stage=c.stage,
            previous=c.previous,
            added_error=c.added_error,
            input_error=c.input_error,
            output_error=c.output_error,
            paired_by=c.paired_by,
            candidate_name=c.candidate_name,
        )
        for c in report.stage_culprits
    ]


def _model_calls(report: SessionPairs) -> tuple[str, ...]:
    """The model's own calls the compared tensors name, in call order (`Net`, `Net#2`, ...: a capture around
    generate's forwards or a loop of steps), each with the reference position of its first tensor; () where the
    model's own inputs or outputs were not recorded."""
    firsts: dict[str, int] = {}
    for pair in report.pairs:
        path = pair.module_path or ""
        if path and "." not in path and "/" not in path:
            firsts[path] = min(firsts.get(path, pair.position), pair.position)
    ordered = sorted(firsts, key=firsts.__getitem__)
    model = ordered[0] if ordered else ""
    return tuple(c for c in ordered if c == model or re.fullmatch(re.escape(model) + r"#\d+", c))


def _call_of(pair_id: int, calls: tuple[str, ...], report: SessionPairs) -> str:
    """The call of the model (of `calls`) that holds pair `pair_id` (the first divergence's): the last to begin
    before it."""
    at = next((p.position for p in report.pairs if p.id == pair_id), None)
    starts = {c: min(p.position for p in report.pairs if p.module_path == c) for c in calls}
    before = [c for c in calls if at is not None and starts[c] <= at]
    return before[-1] if before else ""


def _next_runs(pair_id: int, report: SessionPairs) -> tuple[tuple[str, str], tuple[str | None, str | None]]:
    """The runs a next capture adds (`next_capture`'s `runs` and `against`): where the candidate that diverged is
    compared against a run of the session other than its reference ("late" against "early"), the candidate's new
    run is compared against the new run of that run's model ("early (full)"), which is compared against "early"
    (as "reference (full)" is against the reference), so that each new run pairs with its counterpart; else
    "reference (full)" (against the reference) and "candidate (full)" against "reference (full)": against the
    reference itself, a summary run, its pairs would be judged on summaries again, with no `where`."""
    pair = next((p for p in report.pairs if p.id == pair_id), None)
    by_run = {c.run_id: c for c in report.candidates}
    diverged = by_run.get(pair.b.run_id) if pair is not None else None
    taken = {c.label for c in report.candidates}  # the snippet run twice: its runs' labels are taken
    if pair is None or diverged is None or pair.a.run_id not in by_run:  # against the session's reference
        first_run, second_run = _free_label("reference", taken), _free_label("candidate", taken)
        return (first_run, second_run), (None, first_run)
    counterpart = by_run[pair.a.run_id].label
    first_run, second_run = _free_label(counterpart, taken), _free_label(diverged.label, taken)
    return (first_run, second_run), (counterpart, first_run)


def _free_label(label: str, taken: set[str]) -> str:
    """The label of a next capture's run of the model of run `label`: "<label> (full)", or where the session has
    a run of that label (`taken`), "<label> (full, 2)", "(full, 3)", ..."""
    wanted, number = f"{label} (full)", 1
    while wanted in taken:
        number += 1
        wanted = f"{label} (full, {number})"
    return wanted


def _call_form(report: SessionPairs, model: str | None) -> tuple[str, str]:
    """How the next capture's snippet calls each model, as `next_capture`'s `arguments`, and what it must be given,
    in words: from the inputs of the model's call `model` the runs compared recorded (`inputs_args_0`, ...,
    `inputs_kwargs_<name>`, a nested one `inputs_args_1_0`), so that one tensor is passed as one argument, not
    unpacked along its first dimension. Keyword names are not said: a nested one (`inputs_kwargs_pair_0`) cannot be
    told from a keyword of that name."""
    places = {p.place for p in report.pairs if model is not None and p.module_path == model and p.place}
    positions = {int(m[1]) for p in places if (m := re.match(r"inputs_args_(\d+)", p))}
    nested = any(re.fullmatch(r"inputs_args_\d+_.+", p) for p in places)
    keywords = any(p.startswith("inputs_kwargs_") for p in places)
    recorded = f"as the runs compared called the model ({model})"
    if positions and keywords:
        return "*args, **kwargs", (
            f"args: a tuple of the model's positional arguments, kwargs: a dict of its keyword arguments, {recorded}"
        )
    if keywords:
        return "**inputs", f"inputs: a dict of the model's keyword arguments, {recorded}"
    if positions == {0} and not nested:
        return "inputs", f"inputs: the model's one positional argument (a tensor), {recorded}"
    if positions:
        return "*inputs", f"inputs: a tuple of the model's positional arguments, {recorded}"
    return "*inputs", "inputs: a tuple of the model's arguments (the runs compared recorded none of them)"


def next_capture_of(name: str, report: SessionPairs, where: str = "") -> NextCapture | None:
    """Where a divergence was found from summaries, the capture with full values that settles it, into session
    `name` (`where`: more of capture()'s keywords, as Python: ", data_dir='/data'", ", server='http://...'"): the
    first candidate's, or where it has none, the first candidate's that has one (`compare A B C`, a session of
    several versions of a port), its runs compared against the right runs (`_next_runs`). None for any other."""
    first = report.first_divergence
    diverged = first or next((c.first_divergence for c in report.candidates if c.first_divergence), None)
    if diverged is not None:
        if diverged.basis != "summary" or not diverged.module_path:
            return None
        module_path, pair_id = diverged.module_path, diverged.pair_id
    else:  # no divergence, but values differ (content hashes): full values of the first such pair's module
        changed = report.hashes_changed
        if changed is None or not changed.module_path:
            return None
        module_path, pair_id = changed.module_path, changed.id
    calls = _model_calls(report)
    runs, against = _next_runs(pair_id, report)
    arguments, given = _call_form(report, calls[0] if calls else None)
    return next_capture(
        name,
        [module_path],
        arguments=arguments,
        given=given,
        calls=calls,
        divergent_call=_call_of(pair_id, calls, report),
        runs=runs,
        against=against,
        where=where,
    )


def compare_report(
    session_id: int, name: str, url: str, report: SessionPairs, problems: Sequence[ProblemReport], where: str = ""
) -> CompareReport:
    """The CLI's report (a stable contract, narrower than the API's), read from the session's reports. `where`:
    the place the next capture's snippet stores into, as capture()'s keywords (", data_dir='/data'")."""
    reference_run = report.pairs[0].a.run_id if report.pairs else None
    # each candidate's tensors are paired with those of the run it is compared against (the reference, or the run
    # it names): that run's tensors without partner are the reference side's
    against = {c.run_id: c.against_run_id for c in report.candidates}

    def reference_side(u: UnmatchedReport) -> bool:
        return u.run_id == against.get(u.against_run_id, reference_run)

    first = report.first_divergence
    capture = next_capture_of(name, report, where)
    changed = report.hashes_changed
    coverage = report.coverage
    return CompareReport(
        session=SessionLink(session_id, name, url),
        pairs=[_pair(p, report) for p in report.pairs],
        unmatched=Unmatched(
            [u.name for u in report.unmatched if reference_side(u)],
            [u.name for u in report.unmatched if not reference_side(u)],
        ),
        verdict=str(report.verdict),
        coverage=CoverageSummary(
            coverage.reference_tensors,
            coverage.compared,
            coverage.unmatched,
            coverage.allowed_unmatched,
            coverage.not_compared,
            [RunNotComparedSummary(r.run, r.against, r.why) for r in coverage.runs_not_compared],
            [RunCoverageSummary(r.run, r.against, r.tensors, r.compared, r.not_asked) for r in coverage.runs],
            [OutOfStepSummary(o.name, o.why) for o in coverage.out_of_step],
        ),
        first_divergence=_divergence(first, report),
        basis="summary" if report.on_summaries else "statistics" if report.on_statistics else "values",
        pairs_on_summaries=report.on_summaries,
        pairs_on_statistics=report.on_statistics,
        first_changed=None if changed is None else changed.name,
        next_capture=None if capture is None else msgspec.convert(capture.to_json(), NextCaptureSummary),
        first_divergences={c.label: _divergence(c.first_divergence, report) for c in report.candidates},
        culprits=_culprits(report),
        error_growth=report.error_growth,
        culprit_note=culprit_note(report),
        problems=list(problems),
    )


def culprit_note(report: SessionPairs) -> str | None:
    """In words: where error appears inside a block that records no output, say so (the trace lacks what would
    localise it further); where a stage's error would stand out but its input was not compared, that where it began
    is not known; where one would stand out but is within the noise floor, so; where no culprit stands out although
    error was added, that the error grows evenly. Where the module view's pairs rest on summaries, first which runs'
    full values judged the culprits, or that none could be judged."""
    words = [report.modules.values_note] if report.modules is not None and report.modules.values_note else []
    rest = _culprit_words(report)
    return "; ".join(words + ([rest] if rest else [])) or None


def _culprit_words(report: SessionPairs) -> str | None:
    if report.modules is not None and report.modules.notes:
        return "; ".join(report.modules.notes)
    if report.stage_notes:
        return "; ".join(report.stage_notes)
    if report.error_growth not in ("even", "too few"):
        return None
    # what would stand out but is within the noise floor: no culprit, and said so rather than "grows evenly"
    within = report.modules.noise_notes if report.modules is not None else report.stage_noise_notes
    if within:
        return "; ".join(within)
    what = "module" if report.modules is not None else "stage"
    if report.error_growth == "too few":
        return (
            f"too few {what}s to rank (fewer than {RANKED_ENOUGH}): no {what} is named a culprit, and whether one "
            "stands out from the others is not known"
        )
    return (
        f"the error grows evenly through the run: no {what} stands out (as a change of precision or of kernels "
        "makes it)"
    )
