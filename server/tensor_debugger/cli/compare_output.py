"""What `tensor-debugger compare` asks for and prints, the same whether this process or a running server did the
work: the request from the command line, the table, the first divergence, the culprits, the JSON, the exit code.
Light on purpose (no database, no arrays): the warm path (`cli/warm.py`) imports only this."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import textwrap
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tensor_debugger.cli.table import print_rows
from tensor_debugger.compare.planning.requests import CompareRequest
from tensor_debugger.compare.reports.compare_report import (
    ComparedPair,
    CompareOutcome,
    CompareReport,
    Culprit,
    DivergenceSummary,
    ReadOnce,
    nothing_whole_words,
    second_tensors,
    to_json,
    unread_files,
    unusable_report,
)
from tensor_debugger.compare.reports.divergence_words import (
    OUTPUTS_AGREE,
    RESHAPED_WHY,
    changed_words,
    checks_words,
    crossed_words,
    early_words,
    holds_words,
    lowered_words,
)
from tensor_debugger.compare.reports.formatting import (
    format_cosine,
    format_error,
    format_number,
    format_where,
    replica_words,
    source_words,
)
from tensor_debugger.compare.reports.guessed_pairs import guess_words
from tensor_debugger.compare.reports.pass_words import (
    PassBasis,
    hashes_changed_words,
    no_divergence_words,
    on_printed_statistics,
    statistics_before_words,
)
from tensor_debugger.engine.dimension_names import parse_dims_option
from tensor_debugger.engine.pairing import PARAMETER
from tensor_debugger.errors import InvalidInputError
from tensor_debugger.store.problem_report import ProblemReport


def read_pairing_file(
    path: Path | None, strategies: str | None, name_pattern: str | None, dims: Sequence[str] = ()
) -> dict[str, Any]:  # a pairing file's JSON, checked where the compare runs
    """The pairing to apply: the file's (if any), with the command line's strategies, pattern and dimension names
    (`--dims GLOB=NAMES`, over the file's globs) over it. Raises InvalidInputError naming the file when it cannot
    be read or is not a JSON object, or naming the --dims option that is not GLOB=NAMES."""
    data: dict[str, Any] = {}  # the pairing file's JSON as read: `pairing_files.check_file` checks it
    if path is not None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidInputError(f"pairing file {path}: {exc}") from None
        if not isinstance(data, dict):
            raise InvalidInputError(f"pairing file {path}: not a JSON object")
    if strategies is not None:
        data["strategies"] = strategies.split(",")
    if name_pattern is not None:
        data["name_pattern"] = name_pattern
    if dims:
        try:
            named = parse_dims_option(dims) or {}
        except ValueError as exc:
            raise InvalidInputError(str(exc)) from None
        given = data.get("dims")
        data["dims"] = {**(given if isinstance(given, dict) else {}), **named}
    return data  # checked where the compare runs (`compare_runs`), which names the file in what it says


def compare_request(
    a: Path,
    b: Path,
    name: str | None,
    rtol: float | None,
    atol: float | None,
    *,
    strategies: str | None = None,
    name_pattern: str | None = None,
    pairing: Path | None = None,
    fail_fast: bool = False,
    ulp: int | None = None,
    more: Sequence[Path] = (),
    noise: Path | None = None,
    noise_factor: float | None = None,
    allow_unmatched: Sequence[str] = (),
    dims: Sequence[str] = (),
) -> CompareRequest:
    """What the command line asks for. Raises InvalidInputError on an unusable pairing file, or options that
    contradict each other or mean nothing alone."""
    if ulp is not None and (rtol is not None or atol is not None):
        raise InvalidInputError("--ulp replaces --rtol and --atol: give one or the others")
    if noise_factor is not None and noise is None:
        raise InvalidInputError("--noise-factor needs --noise A2 (a rerun of the reference)")
    return CompareRequest(
        a.absolute(),
        b.absolute(),
        str(a),
        str(b),
        name,
        rtol,
        atol,
        read_pairing_file(pairing, strategies, name_pattern, dims),
        None if pairing is None else str(pairing),
        fail_fast,
        ulp,
        tuple(p.absolute() for p in more),
        tuple(str(p) for p in more),
        None if noise is None else noise.absolute(),
        None if noise is None else str(noise),
        noise_factor,
        tuple(allow_unmatched),
    )


def request_from_args(args: argparse.Namespace) -> CompareRequest:
    """`compare`'s request from its parsed command line (cli/main.py). Raises InvalidInputError as
    `compare_request` does."""
    return compare_request(
        args.a,
        args.b,
        args.name,
        args.rtol,
        args.atol,
        strategies=args.strategies,
        name_pattern=args.name_pattern,
        pairing=args.pairing,
        fail_fast=args.fail_fast,
        ulp=args.ulp,
        more=args.more,
        noise=args.noise,
        noise_factor=args.noise_factor,
        allow_unmatched=args.allow_unmatched,
        dims=args.dims,
    )


def show_compare(outcome: CompareOutcome, as_json: bool, data_dir: Path | None = None, wanted: str = "") -> int:
    """Print a compare's outcome (the JSON, or the table and the first divergence) and return its exit code.
    `data_dir`: where the session is stored when no server serves it (the compare ran in this process); `wanted`:
    the session name asked for, said beside the one given where that was taken ("name (2)"). A killed compare's
    session taken over is said on stderr: not part of the answer `answers.py` keeps for the next identical compare."""
    report = outcome.payload
    if outcome.resumed and report.session is not None:
        print(f"resuming the interrupted session {report.session.name!r}", file=sys.stderr)
    if outcome.error is not None:
        print_unusable(outcome.error, report.problems, as_json, report)
    elif as_json:
        print(json.dumps(to_json(report)))
    else:
        name = report.session.name if report.session else ""
        if wanted and name != wanted:
            print(f"a session named {wanted!r} exists already: this one is {name!r}")
        print_table(report, data_dir)
    return outcome.exit_code


def read_once_words(read_once: ReadOnce) -> str:
    """How a compare of two runs ingested at once read its pairs, in one line (`compare --verbose`)."""
    back = sum(read_once.read_back.values())
    why = "; ".join(f"{n} {reason}" for reason, n in sorted(read_once.read_back.items(), key=lambda r: -r[1]))
    return (
        f"read once: {read_once.in_memory} pairs compared from the bytes as they were ingested, "
        f"{back} read back from the store" + (f" ({why})" if why else "")
    )


def verdict_words(pair: ComparedPair) -> str:
    """A pair's verdict as the table says it: "FAIL", "FAIL (summary)", "NO DIFFERENCE FOUND (summary)" or
    "(statistics)" (a use_repr trace's printed statistics), "(noise)"."""
    verdict = pair.status.upper() + (" (summary)" if pair.summary else "")
    if pair.summary and pair.status == "pass":  # never a verified pass: no element was compared
        verdict = "NO DIFFERENCE FOUND (summary)" if pair.on_summary else "NO DIFFERENCE FOUND (statistics)"
    return verdict + (" (noise)" if pair.rule == "noise" else "")


def alignment_words(pair: ComparedPair) -> str:
    return "" if pair.alignment == "same shape" else pair.alignment[:60]


def print_table(report: CompareReport, data_dir: Path | None = None) -> None:
    url = report.session.url if report.session else ""
    if len(report.first_divergences) > 1:
        print_candidates(report)
        print_where(url, data_dir)
        return
    noise = any(p.noise_max_abs_diff is not None for p in report.pairs)
    floor_header = ("noise floor",) if noise else ()
    rows: list[tuple[str, ...]] = [
        (
            "#",
            "layer",
            "tensor",
            "verdict",
            "max |diff|",
            *floor_header,
            "mean |diff|",
            "cosine",
            "mismatch",
            "alignment",
        )
    ]
    for n, p in enumerate(report.pairs):
        s = p.stats
        mismatch = f"{100 * s.mismatched / s.numel:.3g}%" if s and s.numel else ""
        floor = (cell(p.noise_max_abs_diff),) if noise else ()
        rows.append(
            (
                str(n),
                "" if p.layer is None else str(p.layer),
                p.name,
                verdict_words(p),
                cell(None if s is None else s.max_abs_diff),
                *floor,
                cell(None if s is None else s.mean_abs_diff),
                format_cosine(None if s is None else s.cosine),
                mismatch,
                alignment_words(p),
            )
        )
    print_rows(rows)
    for side, names in (("a", report.unmatched.a), ("b", report.unmatched.b)):
        if names and (side == "b" or report.coverage is None):  # the reference's: NOT COMPARED says them
            which = "reference" if side == "a" else "candidate"
            print(f"unmatched in the {which} run ({len(names)}): {', '.join(names)}")
    print_problems(report.problems)
    sketched = report.pairs_on_summaries
    printed = report.pairs_on_statistics
    if sketched:
        print(
            f'from summaries: {sketched} pairs were judged on summaries alone (values="summary"): hashes, norms, '
            f"means and sampled elements; a pass there means no difference found in the summary"
        )
    if printed:
        print(
            f"element values are not available for {printed} pairs (a trace written with use_repr=True): their "
            f"verdicts compare the shape and mean, std, min and max only; a pass there means no difference found in "
            f"the printed statistics"
        )
    first = report.first_divergence
    failing = sum(1 for p in report.pairs if p.status != "pass")
    if first is None:
        incomplete = unread_files(report.problems) or second_tensors(report.problems) or report.verdict == "incomplete"
        # pairs not one value computed two ways (out of step) were not compared: neither passing nor failing
        off = {o.name for o in report.coverage.out_of_step} if report.coverage is not None else set()
        judged = [p for p in report.pairs if p.name not in off]
        if judged and not any(p.status in ("pass", "fail") for p in judged):
            # not one pair has a verdict: there are no pairs compared to have no divergence among, but the rows
            # compared of a pair whose reference was cut were compared, and are said to be
            told = nothing_whole_words(len(judged), _in_part(judged))
        else:
            told = no_divergence_words([pass_basis(p) for p in judged])
        if incomplete and told.startswith("no divergence") and " among the pairs compared" not in told:
            told = told.replace(":", " among the pairs compared:", 1)
        print(told)
        if report.first_changed is not None:  # a pass on summaries whose hashes differ: not a verified pass
            print(hashes_changed_words(report.first_changed))
            if report.next_capture:
                print("next capture, full values of that module (add to this session):")
                print(textwrap.indent(report.next_capture.python, "    "))
    else:
        print_first_divergence(report, first)
    print_unmatched_before(first, noise=_changed_by_noise(report, first))
    pending = sum(1 for p in report.pairs if p.status == "pending")
    if pending:
        print(fail_fast_stop(first, pending))
    print_culprits(report.culprits, failing > 0, report.culprit_note)
    print_not_compared(report)
    print_incomplete(report.problems)
    print_where(url, data_dir)


def fail_fast_stop(first: DivergenceSummary | None, pending: int) -> str:
    """What `--fail-fast` left: after the first divergence in execution order, or, where no order is known (a state
    dict's keys), after a failing pair that need not be the first."""
    if first is not None and not first.in_execution_order:
        return (
            f"stopped at a divergence (--fail-fast), not the first: no execution order is known; {pending} pairs not "
            f"compared, any of them may fail too"
        )
    return f"stopped at the first divergence (--fail-fast): {pending} pairs after it not compared"


def divergence_label(first: DivergenceSummary) -> str:
    """`FIRST DIVERGENCE`, or where no execution order is known (a state dict's weights, names without a stage) what
    the pair is instead: the first failing one listed."""
    if first.in_execution_order:
        return "FIRST DIVERGENCE"
    if first.order_note:  # a dump's stages sorted by name (`q_proj`, `mlp`)
        return (
            f"DIVERGENCE (no execution order is known: {first.order_note}; the first failing pair listed, not the "
            "first to fail)"
        )
    return (
        "DIVERGENCE (no execution order is known, as in a state dict: the first failing pair listed, not the first to "
        "fail)"
    )


def with_guess(where: str, first: DivergenceSummary) -> str:
    """`where` (layer and stage), and where the pair's partner was guessed, the strategy and the candidate's tensor."""
    guess = guess_words(first.paired_by, first.candidate_name)
    return f"{where}; {guess}" if guess else where


def print_first_divergence(report: CompareReport, first: DivergenceSummary) -> None:
    """`FIRST DIVERGENCE:` where, by how much, and what settles it where it was found from summaries."""
    pair = report.pair_named(first.name)
    stats = pair.stats
    where = (
        "no layer"
        if first.layer is None
        else f"layer {first.layer}"
        if first.stage is None
        else f"layer {first.layer}, stage {first.stage}"
    )
    at = source_words(pair.a.source, pair.b.source, pair.place)  # a captured op's lines, or a module input's
    where = f"{where}, {at}" if at else where
    if first.source_note:
        where = f"{where}; {first.source_note}"
    where = with_guess(where, first)
    if first.basis == "summary":
        print(f"{divergence_label(first)}: {first.name} ({where}): {first.summary_reason}{inside(first)}")
        if report.next_capture:
            print("next capture, full values of that module (add to this session):")
            print(textwrap.indent(report.next_capture.python, "    "))
    elif pair.status == "incomparable" and pair.a.shape != pair.b.shape:
        # a module's output of another shape (compare/reports/reshaped.py): no element was compared, or only those
        # of the reference's rows the candidate has (its statistics are of those alone)
        print(
            f"{divergence_label(first)}: {first.name} ({where}): shapes differ ({pair.a.shape} vs {pair.b.shape}); "
            f"{RESHAPED_WHY}"
        )
    elif stats is None:
        print(
            f"{divergence_label(first)}: {first.name} ({where}): its summary statistics differ (element values "
            f"are not available in this trace)"
        )
    elif pair.rule == "noise":
        print(
            f"{divergence_label(first)}: {first.name} ({where}): max |diff| {cell(stats.max_abs_diff)} at "
            f"{stats.argmax}, beyond the noise factor times the rerun's {cell(pair.noise_max_abs_diff)}"
            f"{inside(first)}"
        )
    else:
        replicas = pair.replicas
        copies = replica_words(replicas.side, replicas.differing) if replicas else ""
        print(
            f"{divergence_label(first)}: {first.name} ({where}): {copies + ' differs: ' if copies else ''}max |diff| "
            f"{cell(stats.max_abs_diff)} at {stats.argmax}, {stats.mismatched} of {stats.numel} "
            f"elements outside tolerance"
            f"{inside(first)}"
        )
    if pair.pairing_note:  # two ops of one name and shape (by content, or by position, ambiguously); an input
        inputs = pair.strategy.partition(" ")[0] == PARAMETER  # "parameter through **kwargs" too
        print(f"  its two {'inputs' if inputs else 'ops'} were {pair.pairing_note}")


def names_of(names: list[str], shown: int = 20) -> str:
    """Names, comma-separated: the first `shown`, then how many more (the JSON lists them all)."""
    more = f" and {len(names) - shown} more (--json lists them all)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _changed_by_noise(report: CompareReport, first: DivergenceSummary | None, label: str | None = None) -> bool:
    """Whether `first`'s first pair whose values differ (`first_changed`: its name, then its line) passed by the noise
    rule, not within tolerance (candidate `label`'s pair, where several candidates are compared)."""
    changed = first.first_changed if first is not None else None
    if not changed:
        return False
    return any(
        p.rule == "noise" and (changed == p.name or changed.startswith(p.name + " "))
        for p in report.pairs
        if label is None or p.candidate == label
    )


def print_unmatched_before(first: DivergenceSummary | None, lead: str = "", noise: bool = False) -> None:
    """Under a first divergence: the reference tensors without partner before it in execution order, and the
    candidate's without partner just before it; the first pair before it whose values differ at all, which passed
    within tolerance, or with `noise` (it passed by the noise rule) within the noise floor; in find_divergence's words,
    the reference's tensor that holds what the candidate's holds there, the candidate's tensors recorded where the
    reference records them only after it, the ops before it paired by content across call indices, where the
    candidate's lower precision begins, and what find_divergence can check of it that the session cannot."""
    before = first.unmatched_before if first else []
    if before:
        tensors = (
            "1 reference tensor before it was"
            if len(before) == 1
            else f"{len(before)} reference tensors before it were"
        )
        print(f"{lead}{tensors} not compared (no partner in the candidate): {names_of(before)}")
    unjudged = first.not_compared_before if first else []
    if unjudged:
        pairs = "1 pair before it was" if len(unjudged) == 1 else f"{len(unjudged)} pairs before it were"
        print(f"{lead}{pairs} not compared: {names_of(unjudged)}: the divergence may have begun there")
    extra = first.candidate_only_before if first else []
    if extra:
        print(f"{lead}before it, the candidate recorded what the reference did not: {names_of(extra)}")
    if first is not None and first.first_changed:
        print(f"{lead}{changed_words(first.first_changed, first.first_changed_on_summaries, noise)}")
    if first is not None and first.statistics_before:
        print(f"{lead}{statistics_before_words(first.statistics_before)}")
    if first is not None:  # in find_divergence's words
        dtype = first.lowered_first.dtype if first.lowered_first is not None else None
        for words in (
            holds_words(first.candidate_holds),
            early_words(first.candidate_early_before),
            crossed_words(first.crossed_before),
            lowered_words(first.lowered_first),
            checks_words(first.name, first.find_divergence_checks, dtype),
            OUTPUTS_AGREE if first.outputs_agree else "",
        ):
            if words:
                print(f"{lead}{words}")


def _reshaped(report: CompareReport, name: str, label: str | None = None) -> bool:
    """Whether a first divergence is a module's output of another shape (its pair incomparable: the kind said with
    its shapes, not again as not compared), not a failing pair. `label`: the candidate whose first divergence it is
    (another candidate's incomparable pair of that name is not it); None: a session of one candidate."""
    pairs = [p for p in report.pairs if p.name == name and (label is None or p.candidate == label)]
    return any(p.status == "incomparable" and p.a.shape != p.b.shape for p in pairs)


def _print_why(report: CompareReport, names: list[str], shown: int = 20) -> None:
    """Why each of the pairs `names` was not compared, where its pair says (an error, a shard one side lacks, the
    reference rows an alignment cut away): one indented line each, the first `shown` (the JSON has them all)."""
    said = 0
    for pair in report.pairs:
        if said < shown and pair.name in names and pair.error:
            print(f"  {pair.name}: {pair.error}")
            said += 1


def print_not_compared(report: CompareReport) -> None:
    """What of the reference was not compared (the verdict is incomplete, exit 1): its tensors without partner
    that the user did not allow, pairs that errored or are incomparable, pairs of ops out of step; and those the
    user allowed to stay unpaired."""
    coverage = report.coverage
    if coverage is None:
        return
    missing = coverage.unmatched
    if missing:
        of = coverage.reference_tensors
        total = f" of {of}" if of else ""
        # "1 reference tensor has", "1 of 8 reference tensors has", "6 of 8 reference tensors have"
        tensors = "reference tensors" if len(missing) > 1 or of else "reference tensor"
        tensors += " has" if len(missing) == 1 else " have"
        print(
            f"NOT COMPARED: {len(missing)}{total} {tensors} no partner in the candidate: {names_of(missing)} "
            "(pair them by hand on the session's page, or allow them with --allow-unmatched GLOB)"
        )
    # a first divergence of another shape (incomparable) was said with its shapes: not again as not compared
    # (once per candidate's first divergence: another candidate's pair of the same name that errored is still said)
    firsts = list(report.first_divergences.items()) if report.first_divergences else [(None, report.first_divergence)]
    named = Counter(d.name for label, d in firsts if d is not None and _reshaped(report, d.name, label))
    left_out = []
    for name in coverage.not_compared:
        if named[name]:
            named[name] -= 1
        else:
            left_out.append(name)
    if left_out:
        pairs = "1 pair" if len(left_out) == 1 else f"{len(left_out)} pairs"
        print(f"NOT COMPARED: {pairs} could not be compared (error or incomparable): {names_of(left_out)}")
        _print_why(report, left_out)
    for pair in coverage.out_of_step:
        print(f"NOT COMPARED: pair {pair.name} ({pair.why})")
    for run in coverage.runs_not_compared:
        against = "a run that was removed" if run.against is None else f"{run.against!r}, which {run.why}"
        print(f"NOT COMPARED: run {run.run!r}, none of its tensors: it is compared against {against}")
    allowed = coverage.allowed_unmatched
    if allowed:
        print(f"allowed to have no partner ({len(allowed)}): {names_of(allowed)}")


def inside(first: DivergenceSummary) -> str:
    """Where inside the first divergence its error is, after a semicolon ("; in heads 5, tokens 10-12");
    nothing where not known (a result stored before `where` was computed)."""
    text = format_where(first.where)
    return f"; {text}" if text else ""


def print_where(url: str, data_dir: Path | None) -> None:
    """Where to see the session: its page, on the server that computed it, or once a server serves `data_dir`."""
    if data_dir is None:
        print(f"open in the browser: {url}")
    else:
        print(f"to open it in a browser: tensor-debugger --data-dir {shlex.quote(str(data_dir))} serve, then {url}")


def print_problems(problems: Sequence[ProblemReport]) -> None:
    """What could not be read, a line each; what held no tensor (a config.json beside the weights), on one line; a
    capture's notes on its trace (what it could not see: a compiled module's ops), a line each."""
    notes = [p for p in problems if p.note]
    ignored = [p.file for p in problems if p.ignored and not p.note]
    if ignored:
        print(f"ignored, no tensor in them ({len(ignored)}): {', '.join(ignored)}")
    for note in notes:
        print(f"note: {note.file}: {note.reason}")
    for problem in problems:
        if not problem.ignored:
            print(f"problem: {problem.file}: {problem.reason}")


def print_incomplete(problems: Sequence[ProblemReport], culprits: bool = True) -> None:
    """The last word where input files could not be read: their tensors are not in the comparison (exit 2).
    `culprits`: whether the comparison names any (`explore` does not)."""
    lost = unread_files(problems)
    if lost:
        files = "1 input file" if len(lost) == 1 else f"{len(lost)} input files"
        print(
            f"INCOMPLETE: {files} could not be read (see problem above): their tensors are missing from this "
            + ("comparison, and a culprit next to them may be wrong" if culprits else "comparison")
        )
    second = second_tensors(problems)
    if second:
        files = ", ".join(p.file for p in second)
        print(
            f"AMBIGUOUS: a run holds two tensors of one name ({files}: see problem above); the first is paired by the "
            f"name, which may not be the one meant: not a pass (pair them by hand on the session's page)"
        )


def _no_divergence_of(report: CompareReport, label: str) -> str:
    """In words, candidate `label`'s verdict where none of its pairs fails: on what it compared only ("among the
    pairs compared") where a pair of its was not compared or a reference tensor has no partner in it, and saying so
    where its passes rest on summaries. Another candidate's pairs and coverage are not its."""
    mine = [p for p in report.pairs if p.candidate == label]
    run = next((r for r in report.coverage.runs if r.run == label), None) if report.coverage is not None else None
    if mine and not any(p.status in ("pass", "fail") for p in mine):
        return nothing_whole_words(len(mine), _in_part(mine))
    return no_divergence_words(
        [pass_basis(p) for p in mine], None if run is None else run.compared, None if run is None else run.tensors
    )


def pass_basis(pair: ComparedPair) -> PassBasis:
    """What `pair`'s verdict rests on, for the words of a verdict of no divergence."""
    summary = pair.summary
    return PassBasis(
        pair.status,
        sketched=pair.on_summary,
        identical=bool(summary is not None and summary.identical),
        printed=on_printed_statistics(summary),
        hashes_differ=summary is not None and summary.hashes_differ is True,
    )


def _in_part(pairs: Sequence[ComparedPair]) -> list[tuple[int, int]]:
    """(rows compared, reference rows) of the pairs of `pairs` compared in part (their reference cut)."""
    return [(p.reference_rows.kept, p.reference_rows.rows) for p in pairs if p.reference_rows and p.compared_in_part]


def print_candidates(report: CompareReport) -> None:
    """Several candidates side by side: a row per reference tensor, a column per candidate (verdict and
    max |diff|), then each candidate's first divergence."""
    labels = list(report.first_divergences)
    cells: dict[str, dict[str, str]] = {}
    layers: dict[str, str] = {}
    for p in report.pairs:
        name = p.a.name
        layers.setdefault(name, "" if p.layer is None else str(p.layer))
        cells.setdefault(name, {})[p.candidate] = (
            f"{p.status.upper()} {cell(None if p.stats is None else p.stats.max_abs_diff)}".rstrip()
        )
    rows = [("#", "layer", "tensor", *(f"{label} (max |diff|)" for label in labels))]
    for n, (name, verdicts) in enumerate(cells.items()):
        rows.append((str(n), layers[name], name, *(verdicts.get(label, "unmatched") for label in labels)))
    print_rows(rows)
    print_problems(report.problems)
    for label, first in report.first_divergences.items():
        if first is None:
            print(f"{label}: {_no_divergence_of(report, label)}")
        else:
            where = with_guess("no layer" if first.layer is None else f"layer {first.layer}", first)
            print(f"{label}: {divergence_label(first)}: {first.name} ({where}){inside(first)}")
            print_unmatched_before(first, "  ", _changed_by_noise(report, first, label))
    print_not_compared(report)
    print_incomplete(report.problems)


def print_culprits(culprits: Sequence[Culprit], failing: bool, note: str | None = None, top: int = 5) -> None:
    """The modules whose added error (relative RMSE of the output minus that of the input) stands out, or in a plain
    dump the stages (relative RMSE minus that of the tensor before), and `CULPRIT:` the first; then `note`: that the
    error grows evenly through the run where none stands out, or where a trace records too little to say more."""
    if culprits:
        print_culprit_table(culprits, failing, top)
    if note and failing:
        print(note[0].upper() + note[1:])


def print_culprit_table(culprits: Sequence[Culprit], failing: bool, top: int) -> None:
    """The culprits' table, top `top`, and `CULPRIT:` the first when any pair fails."""
    modules = isinstance(culprits[0].module_path, str)
    rows = [("module" if modules else "stage", "added error", "input error", "output error")]
    rows += [
        (c.label, format_error(c.added_error), format_error(c.input_error), format_error(c.output_error))
        for c in culprits[:top]
    ]
    rule = "output minus input" if modules else "minus the tensor before"
    print(
        f"{'modules' if modules else 'stages'} whose added error stands out (relative RMSE, {rule}), top "
        f"{min(top, len(culprits))} of {len(culprits)}:"
    )
    print_rows(rows, indent="  ")
    best = culprits[0]
    if failing:
        guess = guess_words(
            best.paired_by if isinstance(best.paired_by, str) else None,
            best.candidate_name if isinstance(best.candidate_name, str) else None,
        )
        print(
            f"CULPRIT: {best.label}{f' ({guess})' if guess else ''} added {format_error(best.added_error)} relative "
            f"RMSE (input {format_error(best.input_error)}, output {format_error(best.output_error)})"
        )


def cell(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else format_number(value)


def print_unusable(
    message: str, problems: Sequence[ProblemReport], as_json: bool, report: CompareReport | None = None
) -> None:
    if as_json:
        print(json.dumps(to_json(unusable_report(message, problems, report))))
        return
    print(f"tensor-debugger: {message}", file=sys.stderr)
    for p in problems:
        print(f"  {p.file}: {p.reason}", file=sys.stderr)
