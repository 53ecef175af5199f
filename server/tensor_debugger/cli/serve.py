"""`tensor-debugger serve`: the web app on uvicorn, refused beyond this machine without a token."""

from __future__ import annotations

import gc
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING

from tensor_debugger.cli.exit_codes import EXIT_OK, EXIT_UNUSABLE, UNOPENED
from tensor_debugger.settings import Settings

if TYPE_CHECKING:
    import uvicorn


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
    # The imports and the app's build with the garbage collector off, as a one-shot command's (`main._start_up_heap`):
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
