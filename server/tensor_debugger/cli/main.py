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
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tensor_debugger.cli.commands import ingest, list_sessions, warm
from tensor_debugger.cli.exit_codes import EXIT_INTERRUPTED, EXIT_OK, EXIT_READER_GONE, EXIT_UNUSABLE, UNOPENED
from tensor_debugger.cli.parser import build_parser
from tensor_debugger.cli.serve import serve
from tensor_debugger.errors import TensorDebuggerError
from tensor_debugger.settings import Settings

READ_ONLY = ("sessions", "compare-sessions")  # commands that only read the data dir


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
        # Ctrl-C: one line, not a traceback. What a compare in this process was ingesting is dropped on its way out
        # (compare/pipeline.py); a reference it had stored keeps its session, which the same command takes up again
        # where the name was the one it wanted. (Sent to a server: cli/commands.warm says so itself.)
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
    Nothing here calls BLAS (dot products go through einsum: engine/scaled_sums.real_dot), yet at import OpenBLAS
    starts a thread per core that spins for a while: 0.1 s of CPU of every command, on cores the command's own
    threads need. The variable is inherited by the ingest processes a server starts."""
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
