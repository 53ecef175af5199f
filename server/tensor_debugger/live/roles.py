"""The role a captured run may be given: a rerun of the reference, the noise floor of the session's pairs."""

from __future__ import annotations

from tensor_debugger.ingest.runs import is_noise_label

# the role of a rerun of the reference (the noise floor of each pair), and the upload form's field that gives a run
# that role (web/uploads.py NOISE_FIELD): through a server, such a run's label is the field's name
NOISE_ROLE = "noise"


def parse_role(role: str | None, run: str, server: str | None) -> str | None:
    """A capture's `role`: None (the session's first run is its reference, the others candidates) or "noise" (a
    rerun of the reference); ValueError naming the reason otherwise, or where a rerun sent to a server is not
    labelled "noise" or "noise (...)" (the server gives the role to runs of those labels only)."""
    if role is not None and role != NOISE_ROLE:
        raise ValueError(f"capture role must be {NOISE_ROLE!r} (a rerun of the reference) or None, got {role!r}")
    if role is not None and server is not None and not is_noise_label(run):
        raise ValueError(
            f"capture of run {run!r} with role {role!r} through a server: the server takes a rerun of the reference "
            f"from the upload's field {NOISE_ROLE!r}, so the run must be labelled {NOISE_ROLE!r} (or 'noise (...)')"
        )
    return role
