"""The `tensor-debugger` command: a thin argparse layer over the library.

    tensor-debugger [--data-dir DIR] [--workers N] serve [--host H] [--port P]
    tensor-debugger [--data-dir DIR] [--workers N] ingest --session NAME --run LABEL PATH... [--json]
    tensor-debugger [--data-dir DIR] sessions [--json]
    tensor-debugger ingest|sessions --server URL [--token T] ...   (through a running server's API)
    tensor-debugger [--data-dir DIR] [--workers N] compare A B [C...] [--name N] [--rtol R --atol T | --ulp N] [--json]
        [--top K] [--strategies LIST] [--name-pattern REGEX] [--dims GLOB=NAMES]... [--pairing FILE] [--fail-fast]
        [--noise A2 [--noise-factor K]] [--in-process]
    tensor-debugger [--data-dir DIR] compare-sessions S1 S2 [--json]
    tensor-debugger [--data-dir DIR] [--workers N] explore PATH [--match GLOB] [--name N] [--json]

Each command imports what it needs when it runs: `--help` imports none of SQLAlchemy, numpy, Zarr, torch or
Litestar, and only `serve` imports the web framework. `compare` and `ingest` hand their work to a server running
on the same data dir when there is one (`warm.py`), and then import none of those either; `compare` again on
unchanged inputs and database prints the answer it kept (`answers.py`), importing nothing but the standard library.
"""

from __future__ import annotations

import argparse
import atexit
import gc
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from tensor_debugger import __version__
from tensor_debugger.cli.progress_bar import ProgressBar
from tensor_debugger.errors import (
    DatabaseSettingError,
    DatabaseUnavailableError,
    StoreUnavailableError,
    TensorDebuggerError,
)
from tensor_debugger.settings import Settings, setting_docs

if TYPE_CHECKING:
    import uvicorn

    from tensor_debugger.cli.session_list import ListedSession
    from tensor_debugger.cli.warm import ServerProbe
    from tensor_debugger.compare.planning.requests import CompareRequest
    from tensor_debugger.compare.reports.compare_report import IngestOutcome
    from tensor_debugger.services import Services

EXIT_OK, EXIT_FAILED, EXIT_UNUSABLE = 0, 1, 2
EXIT_READER_GONE = 128 + 13  # as a tool that SIGPIPE ends exits: its output's reader left (`| head`)
EXIT_INTERRUPTED = 128 + 2  # as a tool that SIGINT ends exits: the user pressed Ctrl-C
# what keeps a command from opening the data dir's database and store: said in one line, exit 2
UNOPENED = (StoreUnavailableError, DatabaseSettingError, DatabaseUnavailableError)
READ_ONLY = ("sessions", "compare-sessions")  # commands that only read the data dir


def build_parser() -> argparse.ArgumentParser:
    settings_help = "\n".join(
        f"  {env} (default {default or 'empty'}): {help}" for env, default, help in setting_docs()
    )
    parser = argparse.ArgumentParser(
        prog="tensor-debugger",
        description="Find which tensor went wrong first between two runs of a model.",
        epilog="Environment variables:\n" + settings_help,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="data directory (default: TENSOR_DEBUGGER_DATA_DIR, else ~/.local/share/tensor-debugger)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="threads that compare and ingest (default: "
        "TENSOR_DEBUGGER_WORKERS, else 0: one per CPU this process may run on)",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the web app and API")
    serve.add_argument("--host", help="address to bind (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, help="port (default 8000)")
    serve.add_argument("--no-demo", action="store_true", help="do not create the demo session")
    serve.add_argument(
        "--no-auth",
        action="store_true",
        help="serve a non-loopback address without a token: anyone who reaches it may read and delete everything",
    )

    ingest = commands.add_parser("ingest", help="add a run to a session (created if needed)")
    ingest.add_argument("--session", required=True, help="session name")
    ingest.add_argument("--run", required=True, help="run label, e.g. reference or candidate")
    ingest.add_argument("paths", nargs="+", type=Path, help="tensor files, archives or folders")
    ingest.add_argument(
        "--against",
        metavar="RUN",
        help="the label of the session's run to compare this run against (default: the session's reference)",
    )
    ingest.add_argument("--json", action="store_true", help="print one JSON object")
    ingest.add_argument(
        "--in-process",
        action="store_true",
        help="do the work in this process even when a server runs on the data dir (no warm path)",
    )
    _server_options(ingest)

    compare = commands.add_parser(
        "compare", help="ingest a reference run and candidates, compare them, print the first divergence"
    )
    compare.add_argument("a", type=Path, help="the reference run: a tensor file, an archive or a folder")
    compare.add_argument("b", type=Path, help="the candidate run")
    compare.add_argument(
        "more",
        nargs="*",
        type=Path,
        metavar="C",
        default=[],  # optional: without a default, argparse lists C among the missing when B is
        help="further candidate runs, each compared with the reference",
    )
    compare.add_argument("--name", help="session name (default: 'A vs B')")
    compare.add_argument("--rtol", type=float, help="relative tolerance (default: torch.testing's per dtype)")
    compare.add_argument("--atol", type=float, help="absolute tolerance (default: torch.testing's per dtype)")
    compare.add_argument(
        "--strategies",
        metavar="LIST",
        help="pairing strategies in the order tried, e.g. "
        "layer_stage,name,normalized,fuzzy:0.8,shape (default: layer_stage,name,module,parameter,key,"
        "normalized,fuzzy,shape)",
    )
    compare.add_argument(
        "--name-pattern",
        metavar="REGEX",
        help="a regex with named groups layer and stage "
        "(and optionally rank) that names match, e.g. 'L(?P<layer>\\d+)_(?P<stage>[a-z_]+)'",
    )
    compare.add_argument(
        "--dims",
        action="append",
        default=[],
        metavar="GLOB=NAMES",
        help="name the aligned dimensions of the tensors whose names match GLOB (repeatable), e.g. "
        "'*attn*=batch,heads,tokens,head_dim': `where` and the error profiles use the names (a glob applies where "
        "its names are as many as the dimensions)",
    )
    compare.add_argument(
        "--pairing",
        type=Path,
        metavar="FILE",
        help="a pairing file (JSON, as GET "
        "/api/sessions/{id}/pairing exports) to apply; --strategies, --name-pattern and --dims win over it",
    )
    compare.add_argument(
        "--verbose",
        action="store_true",
        help="say on stderr how the pairs were read: from the bytes as both runs were ingested, or read back from "
        "the store (and why)",
    )
    compare.add_argument(
        "--fail-fast",
        action="store_true",
        help="stop at the first divergence in execution order, once every pair before it is known (exit 1; "
        "the pairs after it are left uncompared)",
    )
    compare.add_argument(
        "--ulp",
        type=int,
        metavar="N",
        help="an element passes within N units in the last place of the pair's lower-precision dtype (instead of "
        "--rtol and --atol)",
    )
    compare.add_argument(
        "--top",
        type=int,
        metavar="K",
        help="keep each pair's K largest differences, 0 to 64 (default 8; TENSOR_DEBUGGER_TOP)",
    )
    compare.add_argument(
        "--noise",
        type=Path,
        metavar="A2",
        help="a rerun of the reference: each pair passes when the candidate's max |diff| is within "
        "--noise-factor times the rerun's at that tensor (its noise floor)",
    )
    compare.add_argument(
        "--noise-factor",
        type=float,
        metavar="K",
        help="how many times the noise floor a pair's error may be (default 4)",
    )
    compare.add_argument(
        "--allow-unmatched",
        action="append",
        default=[],
        metavar="GLOB",
        help="reference tensors whose names match may have no partner in the candidate (repeatable, e.g. "
        "'layers.[123].*'); any other reference tensor without partner makes the comparison incomplete (exit 1)",
    )
    compare.add_argument("--json", action="store_true", help="print one JSON object")
    compare.add_argument(
        "--in-process",
        action="store_true",
        help="do the work in this process even when a server runs on the data dir (no warm path)",
    )

    explore = commands.add_parser("explore", help="compare every tensor of one run with every other")
    explore.add_argument("path", type=Path, help="the run: a tensor file, an archive or a folder")
    explore.add_argument("--match", metavar="GLOB", help="only tensors whose names match (any case), e.g. '*attn*'")
    explore.add_argument("--name", help="session name (default: 'explore PATH')")
    explore.add_argument("--json", action="store_true", help="print one JSON object, as compare does")

    diff = commands.add_parser(
        "compare-sessions", help="two sessions' pairs matched by name: each one's error in both and the change"
    )
    diff.add_argument("s1", metavar="S1", help="the session before (its id or name)")
    diff.add_argument("s2", metavar="S2", help="the session after (its id or name)")
    diff.add_argument("--json", action="store_true", help="print one JSON object")

    sessions = commands.add_parser("sessions", help="list sessions and their runs")
    sessions.add_argument("--json", action="store_true", help="print a JSON list")
    _server_options(sessions)
    return parser


def _server_options(command: argparse.ArgumentParser) -> None:
    command.add_argument(
        "--server", metavar="URL", help="a running server to send to (e.g. https://gpu-box:8000), not the data dir"
    )
    command.add_argument(
        "--token", help="the server's token (default: TENSOR_DEBUGGER_TOKEN); sent as Authorization: Bearer"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """The command line's entry point: `_main`, and its output flushed while a closed reader can still be said."""
    try:
        code = _main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        if not _stdout_gone():
            raise
        # The output's reader left (`| head`): nothing more can reach it, and a traceback would only hide what it
        # read. Python's way out: stdout onto /dev/null, so that its flush at exit fails no more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_READER_GONE
    except KeyboardInterrupt:
        # Ctrl-C: one line, not a traceback. What a compare had begun is undone on its way out (its runs, and the
        # session they made), or taken up by the same command again where its reference was stored.
        print("\ntensor-debugger: interrupted (Ctrl-C): no verdict. Run the same command again.", file=sys.stderr)
        return EXIT_INTERRUPTED


def _stdout_gone() -> bool:
    """Whether stdout is a pipe (or socket) whose reader has closed it."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # replaced by something with no file: a test's StringIO
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _main(argv: Sequence[str] | None) -> int:
    _one_blas_thread()
    args = build_parser().parse_args(argv)
    try:
        settings = Settings.from_environ(data_dir=args.data_dir, workers=args.workers, top=getattr(args, "top", None))
    except ValueError as exc:
        print(f"tensor-debugger: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    if args.command == "serve":
        return serve(
            settings.with_overrides(host=args.host, port=args.port, demo=False if args.no_demo else None), args.no_auth
        )
    if getattr(args, "server", None):
        from tensor_debugger.cli.remote import remote_ingest, remote_sessions

        if args.command == "ingest":
            return remote_ingest(args.server, args.token, args.session, args.run, args.paths, args.json, args.against)
        return remote_sessions(args.server, args.token, args.json)
    request = None
    answers = None
    if args.command == "compare":
        from tensor_debugger.cli.answers import Answers

        # the same command on unchanged inputs and database: last time's answer, opening nothing (answers.py)
        answers = Answers.of(settings, args)
        cached = None if answers is None else answers.cached()
        if cached is not None:
            sys.stdout.write(cached[0])
            sys.stdout.flush()
            return cached[1]
    if args.command == "compare":  # asked for once, whichever process does the work
        from tensor_debugger.cli.compare_output import print_unusable, request_from_args

        try:
            request = request_from_args(args)
        except TensorDebuggerError as exc:  # a bad argument or an unreadable pairing file
            print_unusable(str(exc), [], args.json)
            return EXIT_UNUSABLE
    probe = None  # what asking this data dir's server found (cli/warm.py), asked once
    # a warm server keeps its own top: a compare with --top runs here
    if (args.command == "ingest" or (args.command == "compare" and args.top is None)) and not args.in_process:
        from tensor_debugger.cli.warm import probe_server

        probe = probe_server(settings)
        code = warm(probe, args, request)
        if code is not None:
            return code
        if probe.answered is not None:  # it answered, then could not be reached: asked again where it matters
            probe = None
    if args.command in READ_ONLY and _nothing_stored_yet(settings):  # a read creates no data dir or database
        return _nothing_stored(settings, args)
    with _start_up_heap():
        from tensor_debugger.services import open_services

        try:
            # a command that only reads marks no new database and store as a pair (store/identity.py)
            services = open_services(settings, writes=args.command not in READ_ONLY)
        except UNOPENED as exc:  # a database or store that cannot be used, or not one pair
            print(f"tensor-debugger: {exc}", file=sys.stderr)
            return EXIT_UNUSABLE
    answered: int | None = None
    try:
        if args.command == "ingest":
            return ingest(services, args.session, args.run, args.paths, args.json, args.against)
        if request is not None:
            from tensor_debugger.cli.compare import run_compare

            if answers is None:
                return run_compare(services, request, args.json, args.verbose, probe)
            with answers.recording():
                answered = run_compare(services, request, args.json, args.verbose, probe)
            return answered
        if args.command == "compare-sessions":
            from tensor_debugger.cli.session_diff import run_compare_sessions

            return run_compare_sessions(services, args.s1, args.s2, args.json)
        if args.command == "explore":
            from tensor_debugger.cli.compare import run_explore

            return run_explore(services, args.path, args.match, args.name, args.json)
        return list_sessions(services, args.json)
    finally:
        services.close()
        if answers is not None and answered is not None:  # the database as this command left it
            answers.keep(answered)


def _nothing_stored_yet(settings: Settings) -> bool:
    """Whether the data dir holds nothing yet: its metadata database is a SQLite file that does not exist, and its
    array store the data dir's folder, which does not either. Anything else (a server's database, a store elsewhere
    that may be another database's) is opened and checked as a pair."""
    default_store = (settings.data_dir / "arrays").as_uri()
    if not settings.database_url.startswith("sqlite:///") or settings.store_url != default_store:
        return False
    database = Path(settings.database_url.removeprefix("sqlite:///").split("?", 1)[0])
    return not database.exists() and not (settings.data_dir / "arrays").exists()


def _nothing_stored(settings: Settings, args: argparse.Namespace) -> int:
    """What a read command says of a data dir that has no database yet, creating none."""
    if args.command == "sessions":
        from tensor_debugger.cli.session_list import print_sessions

        print_sessions([], args.json, str(settings.data_dir))
        return EXIT_OK
    missing = f"no session with id or name {args.s1!r}: {settings.data_dir} has no sessions yet"
    if args.json:
        print(json.dumps({"error": missing}))
    else:
        print(f"tensor-debugger: {missing}", file=sys.stderr)
    return EXIT_UNUSABLE


def _one_blas_thread() -> None:
    """Ask numpy's OpenBLAS for no threads of its own, unless the user set a count, before numpy is imported.
    Nothing here calls BLAS (dot products go through einsum: engine/metrics.py), yet at import OpenBLAS starts a
    thread per core that spins for a while: 0.1 s of CPU of every command, on cores the command's own threads need.
    The variable is inherited by the ingest processes a server starts."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@contextmanager
def _start_up_heap() -> Iterator[None]:
    """Run a one-shot command's imports and opening of the data dir with the garbage collector off, then freeze
    what they built. Those objects (modules, classes, the engine) live until the process exits, so collecting
    them is wasted work: a tenth of the import time went to collections, and tearing them down at exit took
    0.15-0.2 s of a 0.8 s ingest. Objects the command itself creates are collected as usual; at exit everything
    is frozen, so the interpreter's teardown skips what the command imported later too (torch, for a PyTorch
    file: 0.45 s of teardown, 0.15 s frozen). Python runs no collection at exit that anything here relies on:
    files, connections and thread pools are closed explicitly, and weakref finalizers still run."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
        atexit.unregister(gc.freeze)  # once, however often main runs in one process
        atexit.register(gc.freeze)


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server to this machine: localhost, 127.0.0.0/8 or ::1."""
    import ipaddress

    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, other machines may reach it


def _log_to_stderr() -> None:
    """The server's log: INFO and above of every logger, one line each on stderr."""
    import logging

    logging.basicConfig(level=logging.INFO, format="%(levelname)s - %(asctime)s - %(name)s - %(module)s - %(message)s")


def serve(settings: Settings, no_auth: bool = False) -> int:
    if not is_loopback(settings.host) and not settings.auth_required:
        if not no_auth:
            print(
                f"tensor-debugger: refusing to serve {settings.host} (beyond this machine) without a token: set "
                "TENSOR_DEBUGGER_TOKEN (and TENSOR_DEBUGGER_READ_TOKEN for read-only access), or pass --no-auth "
                "to let anyone who reaches the address read, change and delete every session",
                file=sys.stderr,
            )
            return EXIT_UNUSABLE
        print(
            f"WARNING: --no-auth: serving {settings.host}:{settings.port} WITHOUT AUTHENTICATION. Anyone who can "
            "reach this address can read, change and delete every session. Set TENSOR_DEBUGGER_TOKEN instead.",
            file=sys.stderr,
            flush=True,
        )
    refused = _cannot_listen(settings.host, settings.port)
    if refused is not None:
        print(f"tensor-debugger: {refused}", file=sys.stderr)
        return EXIT_UNUSABLE
    # The imports and the app's build with the garbage collector off, as a one-shot command's (`_start_up_heap`):
    # what they make lives as long as the server, and collections during them took about a tenth of their CPU
    enabled = gc.isenabled()
    gc.disable()
    from tensor_debugger.services import check_pair

    try:  # a store that cannot be used, or is not the database's, is said here, not in a traceback at start-up
        check_pair(settings)
    except UNOPENED as exc:
        if enabled:
            gc.enable()
        print(f"tensor-debugger: {exc}", file=sys.stderr)
        return EXIT_UNUSABLE
    import uvicorn

    from tensor_debugger.web.app import create_app

    _log_to_stderr()
    app = create_app(settings)
    # A long-lived server: what is loaded at start-up never needs collecting, and pages of thousands of pairs
    # allocate many short-lived objects; fewer, younger collections keep their render times steady.
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    if enabled:
        gc.enable()
    # uvicorn shuts down gracefully on SIGTERM, then raises it again with the handler it found: with this one the
    # process then exits 0 (a stop asked for, done: `make run` reports no error), running what registered to run
    # at exit (multiprocessing unlinks the ingest children's semaphores, which killed by the signal it leaked:
    # "19 leaked semaphore objects")
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level="warning",
            proxy_headers=bool(settings.trusted_proxies),  # none by default: uvicorn's own default trusts loopback
            forwarded_allow_ips=settings.trusted_proxies,
        )
    )
    # the address once it answers: start-up (a new data dir's demo session) takes seconds before it listens
    threading.Thread(target=_say_when_started, args=(server, settings), name="say-address", daemon=True).start()
    server.run()
    return EXIT_OK


def _cannot_listen(host: str, port: int) -> str | None:
    """Why the server could not listen on host:port (a port in use: a second `make run`), said before anything is
    built; None where it can. Bound as uvicorn binds it (IPv6 for an address with ':', SO_REUSEADDR) and closed at
    once: uvicorn binds it again as it starts."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.create_server((host.strip("[]"), port), family=family).close()
    except OSError as exc:
        why = (exc.strerror or str(exc)).split(" (while attempting")[0].lower()  # create_server adds the address
        if exc.errno == errno.EADDRINUSE:
            why += " (another server? stop it, or choose another port: --port P, or make run PORT=P)"
        return f"cannot listen on {host}:{port}: {why}"
    return None


def _say_when_started(server: uvicorn.Server, settings: Settings) -> None:
    while not server.started:
        if server.should_exit:
            return
        time.sleep(0.05)
    print(f"Tensor Debugger on {settings.base_url}  (data in {settings.data_dir})", flush=True)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(EXIT_OK)


def warm(probe: ServerProbe, args: argparse.Namespace, request: CompareRequest | None) -> int | None:
    """`compare` or `ingest` done by the server of this data dir, printed as if done here; None when no server
    runs there (or it could not be reached), and the command does the work itself."""
    from tensor_debugger.cli.warm import remote_compare, remote_ingest, silent_words

    address = probe.answered
    if address is None:
        if probe.silent is not None:
            print(silent_words(probe.silent), file=sys.stderr)
        return None
    if request is None:  # `ingest`; `compare` comes with its request
        outcome = remote_ingest(address, args.session, args.run, args.paths, args.against)
        return None if outcome is None else show_ingest(outcome, args.json)
    return remote_compare(address, request, args.json)


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
