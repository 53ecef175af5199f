"""The JSON `tensor-debugger compare --json` prints: a stable contract for scripts, narrower than the API's, read
from the same reports. The server builds it too, for a command line that hands it the work (the warm path)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from tensor_debugger.compare.reports.pair_reports import FirstDivergence, SessionPairs
from tensor_debugger.compare.reports.where_reports import WhereEntry
from tensor_debugger.engine.summary_compare import next_capture

CONTRACT_STATS = (
    "max_abs_diff",
    "mean_abs_diff",
    "max_rel_diff",
    "mean_rel_diff",
    "mse",
    "cosine",
    "mismatched",
    "numel",
    "argmax",
    "nan_a",
    "nan_b",
    "inf_a",
    "inf_b",
)


def _where(where: list[WhereEntry] | None) -> list[dict[str, Any]] | None:
    return None if where is None else [asdict(w) for w in where]


def contract_json(
    session_id: int, name: str, url: str, report: SessionPairs, problems: list[dict[str, str]]
) -> dict[str, Any]:
    """The CLI's JSON (a stable contract, narrower than the API's), read from the same reports."""
    pairs = [
        {
            "name": p.name,
            "layer": p.layer,
            "stage": p.stage,
            "status": str(p.status),
            "alignment": p.alignment,
            "strategy": str(p.strategy),
            # source: a captured op's caller, "<file>:<line>" (capture with level="op"); null otherwise
            "a": {"name": p.a.name, "shape": p.a.shape, "dtype": p.a.dtype, "source": p.a.source},
            "b": {"name": p.b.name, "shape": p.b.shape, "dtype": p.b.dtype, "source": p.b.source},
            "stats": {**{k: getattr(p.stats, k) for k in CONTRACT_STATS}, "worst": [asdict(w) for w in p.stats.worst]}
            if p.stats
            else None,
            "error": p.error,
            "module_path": p.module_path,
            "place": p.place,
            "summary": p.summary,
            "candidate": report.candidate_of(p),  # the label of the candidate run
            "rule": p.rule,  # what judged the verdict: "tolerance", or "noise" (a rerun of the reference's floor)
            "noise_max_abs_diff": p.noise_max_abs_diff,  # that floor: the reference's rerun's max |diff| here
            # one side's shards are whole copies (replicas), each compared: the ranks whose copy differs
            "replicas": {"ranks": p.replicas.ranks, "side": p.replicas.side, "differing": p.replicas.differing}
            if p.replicas
            else None,
            # a failing pair's aligned dimensions that confine its error ({"dim", "name", "size", "ranges"}; []:
            # everywhere); null for any other pair
            "where": _where(p.where),
        }
        for p in report.pairs
    ]
    reference_run = report.pairs[0].a.run_id if report.pairs else None
    unmatched = {
        "a": [u.name for u in report.unmatched if u.run_id == reference_run],
        "b": [u.name for u in report.unmatched if u.run_id != reference_run],
    }
    first = report.first_divergence

    def where(found: FirstDivergence | None) -> dict[str, Any] | None:
        if found is None:
            return None
        # `unmatched_before`: the reference tensors without partner (not allowed by the user) before it in execution
        # order; `where`: the dimensions and index ranges its error is confined to
        return {
            "name": found.name,
            "layer": found.layer,
            "stage": found.stage,
            "where": _where(found.where),
            "unmatched_before": found.unmatched_before,
            # "summary": the verdict rests on summaries (a capture with values="summary"), said in `summary_reason`
            # ("from summaries: ..."); null: on element values
            "basis": found.basis,
            "summary_reason": found.summary_reason,
        }

    culprits = report.modules.culprits if report.modules else []
    return {
        "session": {"id": session_id, "name": name, "url": url},
        "pairs": pairs,
        "unmatched": unmatched,
        # comparing, diverged, incomplete (not everything was compared) or no_divergence (compare/reports/coverage.py)
        "verdict": str(report.verdict),
        "coverage": {
            "reference_tensors": report.coverage.reference_tensors,
            "compared": report.coverage.compared,
            "unmatched": report.coverage.unmatched,  # reference tensors without partner, not allowed by the user
            "allowed_unmatched": report.coverage.allowed_unmatched,
            "not_compared": report.coverage.not_compared,  # pairs that errored or are incomparable
        },
        "first_divergence": where(first),  # the first candidate's
        # "summary" where any pair was judged on summaries alone (a capture with values="summary"): a pass there is
        # "no difference found in the summary", not a comparison of every element; "values" otherwise
        "basis": "summary" if report.on_summaries else "values",
        "pairs_on_summaries": report.on_summaries,
        # a divergence found from summaries: the capture with full values that settles it (`python`, a snippet)
        "next_capture": next_capture(name, [first.module_path]).to_json()
        if first is not None and first.basis == "summary" and first.module_path
        else None,
        "first_divergences": {c.label: where(c.first_divergence) for c in report.candidates},
        # the modules of a trace or capture whose added error (relative RMSE, output minus input) stands out, largest
        # first; in a plain dump, its stages whose error added to the tensor before it does (engine/culprits.py's
        # stands_out); [] where none stands out
        "culprits": [
            {
                "module_path": c.module_path,
                "added_error": c.added_error,
                "input_error": c.input_error,
                "output_error": c.output_error,
            }
            for c in culprits
        ]
        or [
            {
                "name": c.name,
                "layer": c.layer,
                "stage": c.stage,
                "previous": c.previous,
                "added_error": c.added_error,
                "input_error": c.input_error,
                "output_error": c.output_error,
            }
            for c in report.stage_culprits
        ],
        "error_growth": report.error_growth,  # "even", "stands out", or null where nothing could be ranked
        "culprit_note": culprit_note(report),  # in words: even growth, or where a trace cannot localise the error
        "problems": problems,
    }


def culprit_note(report: SessionPairs) -> str | None:
    """In words: where error appears inside a block that records no output, say so (the trace lacks what would
    localise it further); where no culprit stands out although error was added, that the error grows evenly."""
    if report.modules is not None and report.modules.notes:
        return "; ".join(report.modules.notes)
    if report.error_growth != "even":
        return None
    what = "module" if report.modules is not None else "stage"
    return (
        f"the error grows evenly through the run: no {what} stands out (as a change of precision or of kernels "
        "makes it)"
    )
