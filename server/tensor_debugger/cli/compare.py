"""`tensor-debugger compare A B`: ingest both runs, pair, align, compare, print the table and the first
divergence. Exit 0 when every pair passes, 1 when any does not, 2 on unusable input."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from sqlalchemy import select

from tensor_debugger.cli.progress_bar import ProgressBar
from tensor_debugger.compare.formatting import format_error, format_number
from tensor_debugger.compare.pair_reports import SessionPairs, session_pairs
from tensor_debugger.compare.pairing_files import check_file, import_pairing
from tensor_debugger.errors import InvalidInputError, NothingUsableError, TensorDebuggerError
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.models import SessionRecord
from tensor_debugger.store.reports import problem_json

EXIT_PASS, EXIT_FAIL, EXIT_UNUSABLE = 0, 1, 2
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


def free_name(services: Services, wanted: str) -> str:
    with services.sessions() as db:
        taken = set(db.scalars(select(SessionRecord.name)))
    if wanted not in taken:
        return wanted
    n = 2
    while f"{wanted} ({n})" in taken:
        n += 1
    return f"{wanted} ({n})"


def read_pairing_file(path: Path | None, strategies: str | None, name_pattern: str | None) -> dict[str, Any]:
    """The pairing to apply: the file's (if any), with the command line's strategies and pattern over it.
    Raises InvalidInputError naming what is wrong."""
    data: dict[str, Any] = {}
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
    try:
        return check_file(data)
    except InvalidInputError as exc:
        raise InvalidInputError(f"pairing file {path}: {exc}" if path else str(exc)) from None


def run_compare(
    services: Services,
    a: Path,
    b: Path,
    name: str | None,
    rtol: float | None,
    atol: float | None,
    as_json: bool,
    *,
    strategies: str | None = None,
    name_pattern: str | None = None,
    pairing: Path | None = None,
) -> int:
    try:
        pairing_file = read_pairing_file(pairing, strategies, name_pattern)
    except InvalidInputError as exc:
        _unusable(str(exc), [], as_json)
        return EXIT_UNUSABLE
    session_name = free_name(services, name or f"{a.name} vs {b.name}")
    labels = (a.name or "reference", b.name if b.name != a.name else f"{b.name} (candidate)")
    problems: list[dict[str, str]] = []
    session_id: int | None = None
    try:
        for label, path in zip(labels, (a, b), strict=True):
            bar = ProgressBar(f"ingest {label}")
            try:
                result = services.ingestor.ingest(  # A is the reference, whatever the folders are named
                    session_name, label, [InputFile(path, str(path))], progress=bar.update, by_label=False
                )
            finally:
                bar.close()
            session_id = result.session_id
            problems += [problem_json(p) for p in result.problems]
    except (NothingUsableError, TensorDebuggerError) as exc:
        if session_id is not None:
            with services.sessions() as db:
                catalog.delete_session(db, services.store, session_id)
        details = [problem_json(p) for p in exc.problems] if isinstance(exc, NothingUsableError) else []
        _unusable(str(exc), problems + details, as_json)
        return EXIT_UNUSABLE
    assert session_id is not None
    if rtol is not None or atol is not None:
        with services.sessions.begin() as db:
            catalog.set_tolerances(catalog.get_session(db, session_id), rtol, atol)
    if pairing_file:
        try:
            with services.sessions.begin() as db:
                import_pairing(db, session_id, pairing_file)
        except InvalidInputError as exc:  # a candidate run's label the file names and this session lacks
            with services.sessions() as db:
                catalog.delete_session(db, services.store, session_id)
            _unusable(f"pairing file {pairing}: {exc}", problems, as_json)
            return EXIT_UNUSABLE
    services.comparisons.plan(session_id)
    bar = ProgressBar("compare")
    try:
        services.comparisons.compute_pending(session_id, progress=bar.update)
    finally:
        bar.close()
    with services.sessions() as db:
        report = session_pairs(db, session_id, modules=True)
    url = f"http://{services.settings.host}:{services.settings.port}/sessions/{session_id}"
    payload = contract_json(session_id, session_name, url, report, problems)
    if not report.pairs:
        _unusable("no tensor of one run could be paired with a tensor of the other", problems, as_json, payload)
        return EXIT_UNUSABLE
    if as_json:
        print(json.dumps(payload))
    else:
        print_table(payload)
    return EXIT_PASS if all(p["status"] == "pass" for p in payload["pairs"]) else EXIT_FAIL


def run_explore(services: Services, path: Path, match: str | None, name: str | None, as_json: bool) -> int:
    """Ingest one run and compare every tensor of it with every other (those matching `match`); the JSON is
    compare's. Exit 0 once done, whatever the verdicts; 2 on unusable input or too many pairs."""
    from tensor_debugger.compare.explore import plan_explore

    session_name = free_name(services, name or f"explore {path.name}")
    bar = ProgressBar(f"ingest {path.name}")
    try:
        result = services.ingestor.ingest(
            session_name, path.name or "run", [InputFile(path, str(path))], progress=bar.update
        )
    except (NothingUsableError, TensorDebuggerError) as exc:
        bar.close()
        details = [problem_json(p) for p in exc.problems] if isinstance(exc, NothingUsableError) else []
        _unusable(str(exc), details, as_json)
        return EXIT_UNUSABLE
    bar.close()
    problems = [problem_json(p) for p in result.problems]
    try:
        plan_explore(services.comparisons, result.session_id, match)
    except TensorDebuggerError as exc:
        with services.sessions() as db:
            catalog.delete_session(db, services.store, result.session_id)
        _unusable(str(exc), problems, as_json)
        return EXIT_UNUSABLE
    bar = ProgressBar("compare")
    try:
        services.comparisons.compute_pending(result.session_id, progress=bar.update)
    finally:
        bar.close()
    with services.sessions() as db:
        report = session_pairs(db, result.session_id)
    url = f"http://{services.settings.host}:{services.settings.port}/sessions/{result.session_id}"
    payload = contract_json(result.session_id, session_name, url, report, problems)
    if as_json:
        print(json.dumps(payload))
        return EXIT_PASS
    rows = [("a", "b", "verdict", "max |diff|", "cosine", "alignment")]
    for p in payload["pairs"]:
        s = p["stats"] or {}
        rows.append(
            (
                p["a"]["name"],
                p["b"]["name"],
                p["status"].upper(),
                _num(s.get("max_abs_diff")),
                _num(s.get("cosine")),
                "" if p["alignment"] == "same shape" else p["alignment"][:60],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    equal = sum(1 for p in payload["pairs"] if p["status"] == "pass")
    print(f"{len(payload['pairs'])} pairs: {equal} equal within tolerance")
    for problem in problems:
        print(f"problem: {problem['file']}: {problem['reason']}")
    print(f"open in the browser: {url}")
    return EXIT_PASS


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
            "a": {"name": p.a.name, "shape": p.a.shape, "dtype": p.a.dtype},
            "b": {"name": p.b.name, "shape": p.b.shape, "dtype": p.b.dtype},
            "stats": {k: getattr(p.stats, k) for k in CONTRACT_STATS} if p.stats else None,
            "error": p.error,
            "module_path": p.module_path,
            "place": p.place,
            "summary": p.summary,
        }
        for p in report.pairs
    ]
    reference_run = report.pairs[0].a.run_id if report.pairs else None
    unmatched = {
        "a": [u.name for u in report.unmatched if u.run_id == reference_run],
        "b": [u.name for u in report.unmatched if u.run_id != reference_run],
    }
    first = report.first_divergence
    culprits = report.modules.culprits if report.modules else []
    return {
        "session": {"id": session_id, "name": name, "url": url},
        "pairs": pairs,
        "unmatched": unmatched,
        "first_divergence": {"name": first.name, "layer": first.layer, "stage": first.stage} if first else None,
        # modules of a trace or capture by the error each added (relative RMSE, output minus input), largest first
        "culprits": [
            {
                "module_path": c.module_path,
                "added_error": c.added_error,
                "input_error": c.input_error,
                "output_error": c.output_error,
            }
            for c in culprits
        ],
        "problems": problems,
    }


def print_table(payload: dict[str, Any]) -> None:
    rows = [("#", "layer", "tensor", "verdict", "max |diff|", "mean |diff|", "cosine", "mismatch", "alignment")]
    for n, p in enumerate(payload["pairs"]):
        s = p["stats"] or {}
        mismatch = f"{100 * s['mismatched'] / s['numel']:.3g}%" if s and s["numel"] else ""
        verdict = p["status"].upper() + (" (summary)" if p["summary"] else "")
        rows.append(
            (
                str(n),
                "" if p["layer"] is None else str(p["layer"]),
                p["name"],
                verdict,
                _num(s.get("max_abs_diff")),
                _num(s.get("mean_abs_diff")),
                _num(s.get("cosine")),
                mismatch,
                "" if p["alignment"] == "same shape" else p["alignment"][:60],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    for side, names in payload["unmatched"].items():
        if names:
            which = "reference" if side == "a" else "candidate"
            print(f"unmatched in the {which} run ({len(names)}): {', '.join(names)}")
    for problem in payload["problems"]:
        print(f"problem: {problem['file']}: {problem['reason']}")
    summaries = sum(1 for p in payload["pairs"] if p["summary"])
    if summaries:
        print(
            f"element values are not available for {summaries} pairs (a trace written with use_repr=True): their "
            f"verdicts compare the shape and mean, std, min and max only"
        )
    first = payload["first_divergence"]
    failing = sum(1 for p in payload["pairs"] if p["status"] != "pass")
    if first is None:
        print(f"no divergence: {len(payload['pairs']) - failing} of {len(payload['pairs'])} pairs pass")
    else:
        pair = next(p for p in payload["pairs"] if p["name"] == first["name"])
        stats = pair["stats"]
        where = (
            "no layer"
            if first["layer"] is None
            else f"layer {first['layer']}"
            if first["stage"] is None
            else f"layer {first['layer']}, stage {first['stage']}"
        )
        if stats is None:
            print(
                f"FIRST DIVERGENCE: {first['name']} ({where}): its summary statistics differ (element values "
                f"are not available in this trace)"
            )
        else:
            print(
                f"FIRST DIVERGENCE: {first['name']} ({where}): max |diff| {_num(stats['max_abs_diff'])} at "
                f"{stats['argmax']}, {stats['mismatched']} of {stats['numel']} elements outside tolerance"
            )
    print_culprits(payload["culprits"], failing > 0)
    print(f"open in the browser: {payload['session']['url']}")


def print_culprits(culprits: list[dict[str, Any]], failing: bool, top: int = 5) -> None:
    """The modules that added the most error (relative RMSE of the output minus that of the input)."""
    if not culprits:
        return
    rows = [("module", "added error", "input error", "output error")]
    rows += [
        (
            c["module_path"],
            format_error(c["added_error"]),
            format_error(c["input_error"]),
            format_error(c["output_error"]),
        )
        for c in culprits[:top]
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(
        f"modules by the error they added (relative RMSE, output minus input), top {min(top, len(culprits))} "
        f"of {len(culprits)}:"
    )
    for row in rows:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    best = culprits[0]
    if failing and float(best["added_error"]) > 0:
        print(
            f"CULPRIT: {best['module_path']} added {format_error(best['added_error'])} relative RMSE "
            f"(input {format_error(best['input_error'])}, output {format_error(best['output_error'])})"
        )


def _num(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else format_number(value)


def _unusable(
    message: str, problems: list[dict[str, str]], as_json: bool, payload: dict[str, Any] | None = None
) -> None:
    if as_json:
        empty: dict[str, Any] = {
            "session": None,
            "pairs": [],
            "unmatched": {"a": [], "b": []},
            "first_divergence": None,
            "culprits": [],
        }
        print(json.dumps({**(payload or empty), "problems": problems, "error": message}))
        return
    print(f"tensor-debugger: {message}", file=sys.stderr)
    for p in problems:
        print(f"  {p['file']}: {p['reason']}", file=sys.stderr)
