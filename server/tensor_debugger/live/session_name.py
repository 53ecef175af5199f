"""The session `find_divergence` stores into: the name asked for, or, where a session has that name already, the
name a new session takes (`name (2)`, the first number free), as `compare` names one (store/catalog.free_name).
Its runs are labelled "reference", "candidate", "reference (full)"...: added to a session made before (by an
earlier call with the same name, or by `compare`), they would clash with its runs or take its reference's place."""

from __future__ import annotations

from pathlib import Path


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
