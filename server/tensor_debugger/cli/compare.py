"""`tensor-debugger compare A B` in this process: ingest both runs, pair, align, compare (`compare/pipeline.py`),
print the table and the first divergence (`compare_output.py`). Exit 0 when every pair passes, 1 when any does
not, 2 on unusable input. Also `explore`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tensor_debugger.cli.compare_output import (
    alignment_words,
    cell,
    print_incomplete,
    print_not_compared,
    print_problems,
    print_unusable,
    print_where,
    read_once_words,
    show_compare,
)
from tensor_debugger.cli.progress_bar import ProgressBar, StatusLine
from tensor_debugger.cli.table import print_rows
from tensor_debugger.cli.warm import ServerProbe, probe_server
from tensor_debugger.compare.pipeline import compare_runs, free_name
from tensor_debugger.compare.planning.requests import (
    EXIT_PASS,
    EXIT_UNUSABLE,
    CompareRequest,
    wanted_name,
)
from tensor_debugger.compare.reports.compare_report import second_tensors, to_json, unread_files
from tensor_debugger.compare.reports.formatting import format_cosine
from tensor_debugger.errors import NothingUsableError, TensorDebuggerError
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import Services
from tensor_debugger.store import catalog
from tensor_debugger.store.problem_report import ProblemReport


def run_compare(
    services: Services, request: CompareRequest, as_json: bool, verbose: bool = False, probe: ServerProbe | None = None
) -> int:
    """Compare in this process; prints what `show_compare` prints and returns the exit code. `verbose`: say on
    stderr how the pairs were read (`read_once_words`). `probe`: what asking this data dir's server found, where
    the caller asked already (else it is asked here: a server asked not to take the work, `--top`)."""
    settings = services.settings
    base_url, hint_dir = link_base(services, probe)
    line = StatusLine()
    try:
        outcome = compare_runs(
            services.ingestor,
            services.context,
            services.compute,
            request,
            base_url,
            progress=line.update,
            where=f", data_dir={str(settings.data_dir)!r}",  # the session's: the snippet adds its runs to it
        )
    finally:
        line.close()
    if verbose and outcome.read_once is not None:
        print(read_once_words(outcome.read_once), file=sys.stderr)
    return show_compare(outcome, as_json, hint_dir, wanted_name(request))


def link_base(services: Services, probe: ServerProbe | None = None) -> tuple[str, Path | None]:
    """Where a session made in this process is linked: a server running on this data dir (say, one asked not to
    take the work: --top, --in-process, explore; or one that did not answer in time) at its address, and no hint
    to start one; else the settings' address and the data dir, for the hint to serve it. `probe`: what asking that
    server found, where the caller asked already (else it is asked here)."""
    settings = services.settings
    probe = probe_server(settings) if probe is None else probe
    running = probe.answered or probe.silent
    if running is None:
        return settings.base_url, settings.data_dir
    return settings.public_url.rstrip("/") or running.url, None


def run_explore(services: Services, path: Path, match: str | None, name: str | None, as_json: bool) -> int:
    """Ingest one run and compare every tensor of it with every other (those matching `match`); the JSON is
    compare's. Exit 0 once done, whatever the verdicts; 2 on unusable input (a file that could not be read too) or
    too many pairs."""
    from tensor_debugger.compare.planning.explore import plan_explore
    from tensor_debugger.compare.reports.contract import compare_report
    from tensor_debugger.compare.reports.pair_reports import session_pairs

    wanted = name or f"explore {path.name}"
    session_name = free_name(services.sessions, wanted)
    if session_name != wanted and not as_json:
        print(f"a session named {wanted!r} exists already: this one is {session_name!r}")
    bar = ProgressBar(f"ingest {path.name}")
    try:
        result = services.ingestor.ingest(
            session_name, path.name or "run", [InputFile(path, str(path))], progress=bar.update
        )
    except (NothingUsableError, TensorDebuggerError) as exc:
        bar.close()
        details = [ProblemReport.of(p) for p in exc.problems] if isinstance(exc, NothingUsableError) else []
        print_unusable(str(exc), details, as_json)
        return EXIT_UNUSABLE
    bar.close()
    problems = [ProblemReport.of(p) for p in result.problems]
    try:
        plan_explore(services.context, result.session_id, match)
    except TensorDebuggerError as exc:
        with services.sessions() as db:
            catalog.delete_session(db, services.store, result.session_id)
        print_unusable(str(exc), problems, as_json)
        return EXIT_UNUSABLE
    bar = ProgressBar("compare")
    try:
        services.compute(result.session_id, progress=bar.update)
    finally:
        bar.close()
    with services.sessions() as db:
        pairs = session_pairs(db, result.session_id)
    base_url, hint_dir = link_base(services)
    url = f"{base_url}/sessions/{result.session_id}"
    report = compare_report(result.session_id, session_name, url, pairs, problems)
    # files that could not be read: their tensors are missing, whatever the rest gives (as `compare`)
    done = EXIT_UNUSABLE if unread_files(problems) or second_tensors(problems) else EXIT_PASS
    if as_json:
        print(json.dumps(to_json(report)))
        return done
    rows = [("a", "b", "verdict", "max |diff|", "cosine", "alignment")]
    rows += [
        (
            p.a.name,
            p.b.name,
            p.status.upper(),
            cell(None if p.stats is None else p.stats.max_abs_diff),
            format_cosine(None if p.stats is None else p.stats.cosine),
            alignment_words(p),
        )
        for p in report.pairs
    ]
    print_rows(rows)
    equal = sum(1 for p in report.pairs if p.status == "pass")
    print(f"{len(report.pairs)} pairs: {equal} equal within tolerance")
    print_not_compared(report)  # pairs that errored or are incomparable: neither equal nor not
    print_problems(problems)
    print_incomplete(problems, culprits=False)  # every tensor against every other: no culprit
    print_where(url, hint_dir)
    return done
