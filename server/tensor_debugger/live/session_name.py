"""The session `find_divergence` stores into: the name asked for, or, where a session has that name already, the
name a new session takes (`name (2)`, the first number free), as `compare` names one (store/catalog.free_name).
Its runs are labelled "reference", "candidate", "reference (full)"...: added to a session made before (by an
earlier call with the same name, or by `compare`), they would clash with its runs or take its reference's place.

The name is found free before the passes (the snippet of the next capture names it), and taken only as the first
run is stored: in a local data dir, that run makes the session or is refused where another call (two
`find_divergence` calls with one name at once) made a session of that name meanwhile; then the next free name is
found and the run stored into it (`stored_in_new_session`), as `compare` does (compare/pipeline._begin_session)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")
NAME_TRIES = 5  # names found free and taken by another call before this one stores: then the last error is raised


def free_session(session: str, server: str | None, token: str | None, data_dir: str | Path | None) -> str:
    """`session`, or the name a new session takes where `session` is taken: on `server` where given (asked over
    its API), else in the local data dir (`data_dir`, else the settings'; one with no database yet has no session,
    and none is made here)."""
    from tensor_debugger.store.catalog import parse_label

    parse_label(session, "session name")
    if server is not None:
        from tensor_debugger.live.upload import free_session_on

        return free_session_on(server, session, token)
    from tensor_debugger.services import open_services
    from tensor_debugger.settings import Settings
    from tensor_debugger.store.catalog import free_name

    settings = Settings.from_environ() if data_dir is None else Settings.from_environ(data_dir=Path(data_dir))
    prefix = "sqlite:///"
    if settings.database_url.startswith(prefix) and not Path(settings.database_url[len(prefix) :]).exists():
        return session
    services = open_services(settings)
    try:
        with services.sessions() as db:
            return free_name(db, session)
    finally:
        services.close()


def stored_in_new_session(
    store: Callable[[str], T],
    asked: str,
    session: str,
    data_dir: str | Path | None,
    server: str | None = None,
    token: str | None = None,
) -> tuple[T, str]:
    """`store(name)` (which makes session `name`, raising SessionNameTaken where one of that name exists) into
    `session`, the name found free for `asked`, or where another call took it meanwhile into the next name free
    for `asked` on `server` where given, else in the local data dir (`data_dir`): what it returned and the name of
    the session it made."""
    from tensor_debugger.errors import SessionNameTaken

    for _ in range(NAME_TRIES - 1):
        try:
            return store(session), session
        except SessionNameTaken:
            session = free_session(asked, server, token, data_dir)
    return store(session), session
