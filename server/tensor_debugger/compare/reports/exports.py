"""The session's pairs as CSV, in the order the user keeps them; with several candidate runs, a `candidate_run`
column (the run's label) says whose each pair is (`candidate` is the candidate tensor's name, as always).

Tensor and run names come from the uploaded files: a text cell that a spreadsheet would read as a formula (one
starting with `=`, `+`, `-`, `@`, a tab or a carriage return) gets a leading `'`, as OWASP advises against CSV
injection. Numbers, and the statistics' "-inf", are left as they are.

A row says what its verdict rests on: `basis` is "values" (every element compared: the statistics columns),
"summary" (a pair judged on a capture's summaries: no statistics, its `status` "pass" only "no difference found in
the summary" unless `reason` says bit-identical, and `sampled_max_abs_diff_lower_bound` the largest difference
among the sampled elements, a lower bound of the pair's), "statistics" (a trace's reported statistics, compared) or
empty (nothing compared: pending, errored, incomparable); `reason` is the summary's verdict in words or why the pair
was not compared; `rule` "noise" where the verdict is against the rerun's noise floor (`noise_max_abs_diff`)."""

from __future__ import annotations

import csv
import io

from tensor_debugger.compare.reports.pair_report import PairReport

STAT_COLUMNS = (
    "max_abs_diff",
    "mean_abs_diff",
    "max_rel_diff",
    "mean_rel_diff",
    "mse",
    "rmse",
    "cosine",
    "snr_db",
    "mismatched",
    "numel",
    "argmax",
    "nan_a",
    "nan_b",
    "inf_a",
    "inf_b",
)


COLUMNS = (
    "position",
    "name",
    "layer",
    "stage",
    "status",
    "strategy",
    "reference",
    "reference_shape",
    "reference_dtype",
    "candidate",
    "candidate_shape",
    "candidate_dtype",
    "alignment",
    *STAT_COLUMNS,
    "basis",
    "sampled_max_abs_diff_lower_bound",
    "reason",
    "rule",
    "noise_max_abs_diff",
)


FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def text_cell(value: object) -> object:
    """`value`, prefixed with `'` where it is text a spreadsheet would take for a formula."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def pairs_to_csv(pairs: list[PairReport], runs: dict[int, str] | None = None) -> str:
    """One row per pair; `runs` (candidate run id to label), given when the session has several candidates, adds
    the `candidate_run` column after `position`."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow((COLUMNS[0], "candidate_run", *COLUMNS[1:]) if runs else COLUMNS)
    for n, p in enumerate(pairs):
        s = p.stats
        writer.writerow(
            [
                n,
                *(
                    text_cell(v)
                    for v in (
                        *([runs.get(p.b.run_id, "")] if runs else []),
                        p.name,
                        p.layer,
                        p.stage,
                        p.status,
                        p.strategy,
                        p.a.name,
                        p.a.shape,
                        p.a.dtype,
                        p.b.name,
                        p.b.shape,
                        p.b.dtype,
                        p.alignment,
                    )
                ),
                *(getattr(s, k) if s is not None else "" for k in STAT_COLUMNS),
                *_basis(p),
                text_cell(p.rule),
                "" if p.noise_max_abs_diff is None else p.noise_max_abs_diff,
            ]
        )
    return out.getvalue()


def _basis(p: PairReport) -> tuple[object, object, object]:
    """`basis`, `sampled_max_abs_diff_lower_bound` and `reason` of `p`'s row (see the module docstring)."""
    summary = p.summary if p.summary is not None and p.summary.on_summary else None
    if summary is not None:
        bound = summary.sampled_max_abs_diff
        return "summary", "" if not isinstance(bound, int | float | str) else bound, text_cell(summary.reason or "")
    if p.summary is not None and p.stats is None:  # a use_repr trace's reported statistics, compared
        return "statistics", "", text_cell(p.error or "")
    return ("values" if p.stats is not None else ""), "", text_cell(p.error or "")
