"""The session's pairs as CSV, in the order the user keeps them; with several candidate runs, a `candidate_run`
column (the run's label) says whose each pair is (`candidate` is the candidate tensor's name, as always).

Tensor and run names come from the uploaded files: a text cell that a spreadsheet would read as a formula (one
starting with `=`, `+`, `-`, `@`, a tab or a carriage return) gets a leading `'`, as OWASP advises against CSV
injection. Numbers, and the statistics' "-inf", are left as they are."""

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
            ]
        )
    return out.getvalue()
