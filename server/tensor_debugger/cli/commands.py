"""`ingest` (here, or by this data dir's running server: `warm`) and `sessions` on the data dir."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from tensor_debugger.cli.exit_codes import EXIT_INTERRUPTED, EXIT_OK
from tensor_debugger.cli.progress_bar import ProgressBar

if TYPE_CHECKING:
    from tensor_debugger.cli.session_list import ListedSession
    from tensor_debugger.cli.warm import ServerProbe
    from tensor_debugger.compare.planning.requests import CompareRequest
    from tensor_debugger.compare.reports.compare_report import IngestOutcome
    from tensor_debugger.services import Services


def warm(probe: ServerProbe, args: argparse.Namespace, request: CompareRequest | None) -> int | None:
    """`compare` or `ingest` done by the server of this data dir, printed as if done here; None when no server
    runs there (or it could not be reached), and the command does the work itself."""
    from tensor_debugger.cli.warm import remote_compare, remote_ingest, silent_words

    address = probe.answered
    if address is None:
        if probe.silent is not None:
            print(silent_words(probe.silent), file=sys.stderr)
        return None
    try:
        if request is None:  # `ingest`; `compare` comes with its request
            outcome = remote_ingest(address, args.session, args.run, args.paths, args.against)
            return None if outcome is None else show_ingest(outcome, args.json)
        return remote_compare(address, request, args.json)
    except KeyboardInterrupt:
        # the server goes on with what it was sent to the end (web/controllers/local.py): said, not undone
        print(f"\n{interrupted_words(address.url, request)}", file=sys.stderr)
        return EXIT_INTERRUPTED


def interrupted_words(url: str, request: CompareRequest | None) -> str:
    """What a `compare` (`request`) or an `ingest` handed to the server at `url` says on Ctrl-C: the server goes on
    to the end, and where its answer is then. A compare run again is compared once more, into a new session (the
    name taken by the one the server finished): said, so that the answer is looked for where it is."""
    if request is None:
        return (
            f"tensor-debugger: interrupted (Ctrl-C): no verdict here; the server at {url} goes on with this ingest "
            "to the end (`tensor-debugger sessions` lists its run)."
        )
    from tensor_debugger.compare.planning.requests import wanted_name

    name = wanted_name(request)
    return (
        f"tensor-debugger: interrupted (Ctrl-C): no verdict here; the server at {url} goes on with this compare to "
        f"the end, into session {name!r} (or {name + ' (2)'!r}... where that name was taken): its answer is on "
        f"that session's page ({url}/sessions lists it; so does `tensor-debugger sessions`). This command run "
        "again compares once more, into a new session."
    )


def ingest(
    services: Services, session: str, run: str, paths: list[Path], as_json: bool, against: str | None = None
) -> int:
    from tensor_debugger.compare.pipeline import ingest_run
    from tensor_debugger.ingest.inputs import InputFile

    bar = ProgressBar(f"ingest {run}")
    try:
        outcome = ingest_run(
            services.ingestor,
            services.context,
            session,
            run,
            [InputFile(p, str(p)) for p in paths],
            progress=lambda _, done, total: bar.update(done, total),
            against=against,
        )  # planned: the server's worker computes the pairs
    finally:
        bar.close()
    return show_ingest(outcome, as_json)


def show_ingest(outcome: IngestOutcome, as_json: bool) -> int:
    from tensor_debugger.compare.reports.compare_report import to_json

    report = outcome.payload
    if as_json:
        print(json.dumps(to_json(report)))
    elif outcome.error is not None:
        print(f"tensor-debugger: {outcome.error}", file=sys.stderr)
        for p in report.problems:
            print(f"  {p.file}: {p.reason}", file=sys.stderr)
    elif report.session is not None and report.run is not None:
        run = report.run
        tensors = f"{run.tensors} tensor{'' if run.tensors == 1 else 's'}"
        print(f"stored {tensors} as run {run.label!r} of session {report.session.name!r}")
        for p in report.problems:
            print(f"  problem: {p.file}: {p.reason}")
    return outcome.exit_code


def list_sessions(services: Services, as_json: bool) -> int:
    from tensor_debugger.cli.session_list import print_sessions

    print_sessions(_session_list(services), as_json, str(services.settings.data_dir))
    return EXIT_OK


def _session_list(services: Services) -> list[ListedSession]:
    from tensor_debugger.cli.session_list import ListedRun, ListedSession
    from tensor_debugger.store import catalog
    from tensor_debugger.store.reports import iso

    with services.sessions() as db:
        return [
            ListedSession(
                s.id,
                s.name,
                iso(s.created_at),
                [ListedRun(r.id, r.label, r.role, r.status, r.tensor_count, r.compared_against_id) for r in s.runs],
            )
            for s in catalog.list_sessions(db)
        ]
