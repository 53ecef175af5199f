"""The demo session, generated on the first start of a new data directory."""

from __future__ import annotations

import shutil
from collections.abc import Callable

from sqlalchemy import func, select

from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.staging import new_folder
from tensor_debugger.services import Services
from tensor_debugger.store.models import SessionRecord

DEMO_NAME = "demo: planted divergence at layer 2 post_attn"
DEMO_LAYERS = 4
_MARKER = ".demo-created"


def ensure_demo_session(services: Services, building: Callable[[], None] = lambda: None) -> bool:
    """Create the demo session unless this data directory ever had one or holds sessions already; `building` is
    called first when it is created (seconds of work: the server says so before it answers)."""
    marker = services.settings.data_dir / _MARKER
    if marker.exists():
        return False
    with services.sessions() as db:
        if db.scalar(select(func.count()).select_from(SessionRecord)):
            marker.touch()
            return False
    # imported only now: writing the dumps needs torch (about a second to import), which a restart does not
    from tensor_debugger.demo.synthetic import Plant, write_dump

    building()

    folder = new_folder(services.settings.staging_dir, "demo")
    try:
        write_dump(folder / "reference", DEMO_LAYERS, seed=7)
        write_dump(folder / "candidate", DEMO_LAYERS, seed=7, plant=Plant(2, "post_attn", (5, 17), 0.3))
        for label in ("reference", "candidate"):
            result = services.ingestor.ingest(DEMO_NAME, label, [InputFile(folder / label, f"{label}/")])
        services.plan(result.session_id)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    marker.touch()
    return True
