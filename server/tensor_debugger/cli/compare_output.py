"""What `tensor-debugger compare` asks for and prints, the same whether this process or a running server did the
work: the request from the command line, the table, the first divergence, the culprits, the JSON, the exit code.
Light on purpose (no database, no arrays): the warm path (`cli/warm.py`) imports only this."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tensor_debugger.compare.planning.requests import CompareOutcome, CompareRequest, unread_files, unusable_json
from tensor_debugger.compare.reports.formatting import (
    format_cosine,
    format_error,
    format_number,
    format_where,
    replica_words,
    source_words,
)
from tensor_debugger.engine.dimension_names import parse_dims_option
from tensor_debugger.errors import InvalidInputError


def read_pairing_file(
    path: Path | None, strategies: str | None, name_pattern: str | None, dims: Sequence[str] = ()
) -> dict[str, Any]:
    """The pairing to apply: the file's (if any), with the command line's strategies, pattern and dimension names
    (`--dims GLOB=NAMES`, over the file's globs) over it. Raises InvalidInputError naming the file when it cannot
    be read or is not a JSON object, or naming the --dims option that is not GLOB=NAMES."""
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
    if outcome.resumed and outcome.payload.get("session"):
        print(f"resuming the interrupted session {outcome.payload['session']['name']!r}", file=sys.stderr)
    if outcome.error is not None:
        print_unusable(outcome.error, outcome.payload["problems"], as_json, outcome.payload)
    elif as_json:
        print(json.dumps(outcome.payload))
    else:
        name = outcome.payload["session"]["name"]
        if wanted and name != wanted:
            print(f"a session named {wanted!r} exists already: this one is {name!r}")
        print_table(outcome.payload, data_dir)
    return outcome.exit_code


def print_table(payload: dict[str, Any], data_dir: Path | None = None) -> None:
    if len(payload.get("first_divergences", {})) > 1:
        print_candidates(payload)
        print_where(payload["session"]["url"], data_dir)
        return
    noise = any(p.get("noise_max_abs_diff") is not None for p in payload["pairs"])
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
    for n, p in enumerate(payload["pairs"]):
        s = p["stats"] or {}
        mismatch = f"{100 * s['mismatched'] / s['numel']:.3g}%" if s and s["numel"] else ""
        on_summary = p["summary"] and p["summary"].get("basis") == "summary"
        verdict = p["status"].upper() + (" (summary)" if p["summary"] else "")
        verdict = "NO DIFFERENCE FOUND (summary)" if on_summary and p["status"] == "pass" else verdict
        verdict += " (noise)" if p.get("rule") == "noise" else ""
        floor = (cell(p.get("noise_max_abs_diff")),) if noise else ()
        rows.append(
            (
                str(n),
                "" if p["layer"] is None else str(p["layer"]),
                p["name"],
                verdict,
                cell(s.get("max_abs_diff")),
                *floor,
                cell(s.get("mean_abs_diff")),
                format_cosine(s.get("cosine")),
                mismatch,
                "" if p["alignment"] == "same shape" else p["alignment"][:60],
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    for side, names in payload["unmatched"].items():
        if names and (side == "b" or payload.get("coverage") is None):  # the reference's: NOT COMPARED says them
            which = "reference" if side == "a" else "candidate"
            print(f"unmatched in the {which} run ({len(names)}): {', '.join(names)}")
    print_problems(payload["problems"])
    sketched = payload.get("pairs_on_summaries") or 0
    summaries = sum(1 for p in payload["pairs"] if p["summary"]) - sketched
    if sketched:
        print(
            f'from summaries: {sketched} pairs were judged on summaries alone (values="summary"): hashes, norms, '
            f"means and sampled elements; a pass there means no difference found in the summary"
        )
    if summaries:
        print(
            f"element values are not available for {summaries} pairs (a trace written with use_repr=True): their "
            f"verdicts compare the shape and mean, std, min and max only"
        )
    first = payload["first_divergence"]
    failing = sum(1 for p in payload["pairs"] if p["status"] != "pass")
    if first is None:
        incomplete = unread_files(payload["problems"]) or payload.get("verdict") == "incomplete"
        among = " among the pairs compared" if incomplete else ""
        rests = (
            " (from summaries: no difference found in the summaries, not every element compared)" if sketched else ""
        )
        print(f"no divergence{among}: {len(payload['pairs']) - failing} of {len(payload['pairs'])} pairs pass{rests}")
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
        at = source_words(pair["a"].get("source"), pair["b"].get("source"))  # a captured op's lines
        where = f"{where}, {at}" if at else where
        if first.get("basis") == "summary":
            print(f"FIRST DIVERGENCE: {first['name']} ({where}): {first['summary_reason']}{inside(first)}")
            if payload.get("next_capture"):
                print("next capture, full values of that module (add to this session):")
                print(textwrap.indent(payload["next_capture"]["python"], "    "))
        elif stats is None:
            print(
                f"FIRST DIVERGENCE: {first['name']} ({where}): its summary statistics differ (element values "
                f"are not available in this trace)"
            )
        elif pair.get("rule") == "noise":
            print(
                f"FIRST DIVERGENCE: {first['name']} ({where}): max |diff| {cell(stats['max_abs_diff'])} at "
                f"{stats['argmax']}, beyond the noise factor times the rerun's {cell(pair['noise_max_abs_diff'])}"
                f"{inside(first)}"
            )
        else:
            replicas = pair.get("replicas") or {}
            copies = replica_words(replicas.get("side", "b"), replicas.get("differing"))
            print(
                f"FIRST DIVERGENCE: {first['name']} ({where}): {copies + ' differs: ' if copies else ''}max |diff| "
                f"{cell(stats['max_abs_diff'])} at {stats['argmax']}, {stats['mismatched']} of {stats['numel']} "
                f"elements outside tolerance"
                f"{inside(first)}"
            )
    print_unmatched_before(first)
    pending = sum(1 for p in payload["pairs"] if p["status"] == "pending")
    if pending:
        print(f"stopped at the first divergence (--fail-fast): {pending} pairs after it not compared")
    print_culprits(payload["culprits"], failing > 0, payload.get("culprit_note"))
    print_not_compared(payload)
    print_incomplete(payload["problems"])
    print_where(payload["session"]["url"], data_dir)


def names_of(names: list[str], shown: int = 20) -> str:
    """Names, comma-separated: the first `shown`, then how many more (the JSON lists them all)."""
    more = f" and {len(names) - shown} more (--json lists them all)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def print_unmatched_before(first: dict[str, Any] | None, lead: str = "") -> None:
    """Under a first divergence: the reference tensors without partner before it in execution order."""
    before = (first or {}).get("unmatched_before") or []
    if before:
        tensors = (
            "1 reference tensor before it was"
            if len(before) == 1
            else f"{len(before)} reference tensors before it were"
        )
        print(f"{lead}{tensors} not compared (no partner in the candidate): {names_of(before)}")


def print_not_compared(payload: dict[str, Any]) -> None:
    """What of the reference was not compared (the verdict is incomplete, exit 1): its tensors without partner
    that the user did not allow, pairs that errored or are incomparable; and those the user allowed to stay
    unpaired."""
    coverage = payload.get("coverage") or {}
    missing = coverage.get("unmatched") or []
    if missing:
        of = coverage.get("reference_tensors")
        total = f" of {of}" if of else ""
        tensors = "reference tensor has" if len(missing) == 1 else "reference tensors have"
        print(
            f"NOT COMPARED: {len(missing)}{total} {tensors} no partner in the candidate: {names_of(missing)} "
            "(pair them by hand on the session's page, or allow them with --allow-unmatched GLOB)"
        )
    left_out = coverage.get("not_compared") or []
    if left_out:
        pairs = "1 pair" if len(left_out) == 1 else f"{len(left_out)} pairs"
        print(f"NOT COMPARED: {pairs} could not be compared (error or incomparable): {names_of(left_out)}")
    allowed = coverage.get("allowed_unmatched") or []
    if allowed:
        print(f"allowed to have no partner ({len(allowed)}): {names_of(allowed)}")


def inside(first: dict[str, Any]) -> str:
    """Where inside the first divergence its error is, after a semicolon ("; in heads 5, tokens 10-12");
    nothing where not known (a result stored before `where` was computed, a JSON from an older server)."""
    text = format_where(first.get("where"))
    return f"; {text}" if text else ""


def print_where(url: str, data_dir: Path | None) -> None:
    """Where to see the session: its page, on the server that computed it, or once a server serves `data_dir`."""
    if data_dir is None:
        print(f"open in the browser: {url}")
    else:
        print(f"to open it in a browser: tensor-debugger --data-dir {shlex.quote(str(data_dir))} serve, then {url}")


def print_problems(problems: list[dict[str, Any]]) -> None:
    """What could not be read, a line each; what held no tensor (a config.json beside the weights), on one line."""
    ignored = [p["file"] for p in problems if p["ignored"]]
    if ignored:
        print(f"ignored, no tensor in them ({len(ignored)}): {', '.join(ignored)}")
    for problem in problems:
        if not problem["ignored"]:
            print(f"problem: {problem['file']}: {problem['reason']}")


def print_incomplete(problems: list[dict[str, Any]], culprits: bool = True) -> None:
    """The last word where input files could not be read: their tensors are not in the comparison (exit 2).
    `culprits`: whether the comparison names any (`explore` does not)."""
    lost = unread_files(problems)
    if lost:
        files = "1 input file" if len(lost) == 1 else f"{len(lost)} input files"
        print(
            f"INCOMPLETE: {files} could not be read (see problem above): their tensors are missing from this "
            + ("comparison, and a culprit next to them may be wrong" if culprits else "comparison")
        )


def print_candidates(payload: dict[str, Any]) -> None:
    """Several candidates side by side: a row per reference tensor, a column per candidate (verdict and
    max |diff|), then each candidate's first divergence."""
    labels = list(payload["first_divergences"])
    cells: dict[str, dict[str, str]] = {}
    layers: dict[str, str] = {}
    for p in payload["pairs"]:
        name = p["a"]["name"]
        layers.setdefault(name, "" if p["layer"] is None else str(p["layer"]))
        stats = p["stats"] or {}
        cells.setdefault(name, {})[p["candidate"]] = f"{p['status'].upper()} {cell(stats.get('max_abs_diff'))}".rstrip()
    rows = [("#", "layer", "tensor", *(f"{label} (max |diff|)" for label in labels))]
    for n, (name, verdicts) in enumerate(cells.items()):
        rows.append((str(n), layers[name], name, *(verdicts.get(label, "unmatched") for label in labels)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(text.ljust(w) for text, w in zip(row, widths, strict=True)).rstrip())
    print_problems(payload["problems"])
    for label, first in payload["first_divergences"].items():
        if first is None:
            print(f"{label}: no divergence")
        else:
            where = "no layer" if first["layer"] is None else f"layer {first['layer']}"
            print(f"{label}: FIRST DIVERGENCE: {first['name']} ({where}){inside(first)}")
            print_unmatched_before(first, "  ")
    print_not_compared(payload)
    print_incomplete(payload["problems"])


def print_culprits(culprits: list[dict[str, Any]], failing: bool, note: str | None = None, top: int = 5) -> None:
    """The modules whose added error (relative RMSE of the output minus that of the input) stands out, or in a plain
    dump the stages (relative RMSE minus that of the tensor before), and `CULPRIT:` the first; then `note`: that the
    error grows evenly through the run where none stands out, or where a trace records too little to say more."""
    if culprits:
        print_culprit_table(culprits, failing, top)
    if note and failing:
        print(note[0].upper() + note[1:])


def print_culprit_table(culprits: list[dict[str, Any]], failing: bool, top: int) -> None:
    """The culprits' table, top `top`, and `CULPRIT:` the first when any pair fails."""
    modules = "module_path" in culprits[0]
    rows = [("module" if modules else "stage", "added error", "input error", "output error")]
    rows += [
        (
            c["module_path"] if modules else c["name"],
            format_error(c["added_error"]),
            format_error(c["input_error"]),
            format_error(c["output_error"]),
        )
        for c in culprits[:top]
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    rule = "output minus input" if modules else "minus the tensor before"
    print(
        f"{'modules' if modules else 'stages'} whose added error stands out (relative RMSE, {rule}), top "
        f"{min(top, len(culprits))} of {len(culprits)}:"
    )
    for row in rows:
        print("  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    best = culprits[0]
    if failing:
        print(
            f"CULPRIT: {rows[1][0]} added {format_error(best['added_error'])} relative RMSE "
            f"(input {format_error(best['input_error'])}, output {format_error(best['output_error'])})"
        )


def cell(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else format_number(value)


def print_unusable(
    message: str, problems: list[dict[str, str]], as_json: bool, payload: dict[str, Any] | None = None
) -> None:
    if as_json:
        print(json.dumps(unusable_json(message, problems, payload)))
        return
    print(f"tensor-debugger: {message}", file=sys.stderr)
    for p in problems:
        print(f"  {p['file']}: {p['reason']}", file=sys.stderr)
