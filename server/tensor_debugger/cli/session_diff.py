"""`tensor-debugger compare-sessions S1 S2`: two sessions' pairs matched by name, each with its error (max |diff|)
in both and the change (`compare/session_diff.py`). Exit 0 when no pair that passed in S1 fails in S2, 1 when one
does, 2 when a session is not found or has pairs not compared yet."""

from __future__ import annotations

import dataclasses
import json
import sys

from tensor_debugger.cli.compare_output import cell
from tensor_debugger.cli.table import print_rows
from tensor_debugger.compare.planning.requests import EXIT_FAIL, EXIT_PASS, EXIT_UNUSABLE
from tensor_debugger.compare.reports.coverage import Coverage
from tensor_debugger.compare.reports.session_diff import Change, SessionDiff, diff_sessions, find_session
from tensor_debugger.errors import NotFoundError
from tensor_debugger.services import Services


def run_compare_sessions(services: Services, first: str, second: str, as_json: bool) -> int:
    try:
        with services.sessions() as db:
            diff = diff_sessions(db, find_session(db, first), find_session(db, second))
    except NotFoundError as exc:
        if as_json:
            print(json.dumps({"error": str(exc)}))
        else:
            print(f"tensor-debugger: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    if as_json:
        print(json.dumps(dataclasses.asdict(diff)))
    else:
        print_diff(diff)
    return EXIT_FAIL if diff.broke else EXIT_UNUSABLE if diff.pending else EXIT_PASS


def incomplete(coverage: Coverage) -> str:
    """A session with no failing pair that did not compare everything (or nothing at all)."""
    parts = []
    if coverage.unmatched:
        parts.append(
            f"{len(coverage.unmatched)} reference tensors have no partner ({', '.join(coverage.unmatched[:5])}"
        )
        parts[-1] += ", …)" if len(coverage.unmatched) > 5 else ")"
    if coverage.not_compared:
        parts.append(f"{len(coverage.not_compared)} pairs could not be compared")
    if coverage.out_of_step:
        names = ", ".join(o.name for o in coverage.out_of_step[:5]) + (", …" if len(coverage.out_of_step) > 5 else "")
        parts.append(f"{len(coverage.out_of_step)} pairs of ops out of step were not compared ({names})")
    if coverage.unread_files:
        parts.append(f"{coverage.unread_files} input files could not be read")
    if coverage.ambiguous_files:
        many = coverage.ambiguous_files != 1
        parts.append(
            f"AMBIGUOUS: {coverage.ambiguous_files} input file{'s' if many else ''} "
            f"{'hold' if many else 'holds'} a second tensor of a name {'their' if many else 'its'} run already had "
            "(which one is paired by the name is a guess)"
        )
    parts.extend(f"no tensor of {run.words} was compared" for run in coverage.runs_not_compared)
    # where no pair was compared at all, there are no pairs to have no divergence among
    lead = "no divergence among the pairs compared, but" if coverage.compared else "nothing was compared:"
    return f"{lead} INCOMPLETE: " + "; ".join(parts or ["nothing to compare"])


def print_diff(diff: SessionDiff) -> None:
    rows = [("pair", "layer", "A", "B", "A max |diff|", "B max |diff|", "B / A", "change")]
    for p in diff.pairs:
        rows.append(
            (
                p.key,
                "" if p.layer is None else str(p.layer),
                (p.status_a or "-").upper(),
                (p.status_b or "-").upper(),
                cell(p.error_a),
                cell(p.error_b),
                cell(p.ratio),
                str(p.change).upper() if p.change in (Change.FIXED, Change.BROKEN) else str(p.change),
            )
        )
    print_rows(rows)
    for side, name in (("A", diff.a), ("B", diff.b)):
        first = name.first_divergence
        verdict = (
            f"first divergence {first.name}"
            if first and first.in_execution_order
            else f"a divergence {first.name} (no execution order is known: the first failing pair listed)"
            if first
            else f"{name.pending} pairs not compared yet: a server on this data dir compares them "
            "(tensor-debugger serve)"
            if name.pending
            else "nothing compared yet: the session has no candidate run"
            if name.verdict == "no_candidate"
            else "nothing compared yet: a run is still ingesting, or the session has no candidate run"
            if name.verdict == "comparing"
            else f"no divergence found in the summaries ({name.on_summaries} pairs passed on summaries alone: not "
            "every element compared)"
            if name.verdict == "no_divergence" and name.on_summaries
            else "no divergence"
            if name.verdict == "no_divergence"
            else incomplete(name.coverage)
        )
        print(f"{side}: {name.name} (session {name.id}): {verdict}")
    print(", ".join(f"{n} {c}" for c, n in diff.counts.items()))
