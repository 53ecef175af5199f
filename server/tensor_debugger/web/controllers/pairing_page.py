"""The session page's pairing forms: two tensors paired by hand (with the alignment chosen where shapes differ),
the pairing rules, and the pairing file downloaded or uploaded. A refused form comes back on the session page,
its error next to it."""

from __future__ import annotations

from functools import partial
from typing import Any
from urllib.parse import urlencode

import anyio
from litestar import Controller, Request, Response, get, post
from litestar.di import NamedDependency
from litestar.params import FromPath
from litestar.response import Redirect, Template

from tensor_debugger.compare.planning.hand_pairing import hand_pair_choices
from tensor_debugger.compare.planning.pairing_files import PairingExport, export_pairing
from tensor_debugger.errors import ConflictError, InvalidInputError
from tensor_debugger.services import Services
from tensor_debugger.web.controllers.forms import Form
from tensor_debugger.web.controllers.session_page import session_template
from tensor_debugger.web.json_bodies import PAIRING_FILE_LIMIT, parse_json
from tensor_debugger.web.multipart import MultipartLimits, receive_multipart
from tensor_debugger.web.views.pairing_form import PairingForm, rules_from_form
from tensor_debugger.web.views.session_view import ViewParams


class PairingPageController(Controller):
    path = "/"
    include_in_schema = False

    @post("/sessions/{session_id:int}/pairs", sync_to_thread=True)
    def pair_by_hand(
        self, services: NamedDependency[Services], session_id: FromPath[int], data: Form
    ) -> Template | Redirect:
        """Pair two tensors by hand. Where their shapes differ, the page first offers the alignments that fit
        (`alignment`: the number of the one chosen, or "auto"); pairs at once where they agree."""
        a_name, b_name = data.get("a_name", ""), data.get("b_name", "")
        if not a_name or not b_name:
            raise InvalidInputError("choose a tensor of each run to pair")
        chosen = data.get("alignment")
        try:
            with services.sessions() as db:
                offered = hand_pair_choices(db, session_id, a_name, b_name)
            steps = None
            if chosen is None and not offered.same_shape and offered.choices:
                query = urlencode({"pair_a": a_name, "pair_b": b_name})
                return Redirect(f"/sessions/{session_id}?{query}#hand-pair", status_code=303)
            if chosen is not None and chosen != "auto":
                if not chosen.isdigit() or int(chosen) >= len(offered.choices):
                    raise InvalidInputError(f"no alignment numbered {chosen!r} fits these tensors")
                steps = offered.choices[int(chosen)].steps
            services.actions.pair_by_hand(session_id, a_name, b_name, alignment=steps)
        except InvalidInputError as exc:
            return session_template(services, session_id, ViewParams(), hand_error=str(exc), status_code=400)
        return Redirect(f"/sessions/{session_id}", status_code=303)

    @post("/sessions/{session_id:int}/pairing-rules", sync_to_thread=True)
    def set_pairing_rules(
        self, services: NamedDependency[Services], session_id: FromPath[int], data: Form
    ) -> Template | Redirect:
        """The chain of strategies (a comma list, the fuzzy threshold apart) and the name pattern; pairs the
        session again. Refused rules are shown on the page, next to the form, as typed."""
        try:
            strategies, pattern = rules_from_form(data)
            services.actions.set_pairing_rules(session_id, strategies, pattern)
        except InvalidInputError as exc:
            return session_template(
                services, session_id, ViewParams(), pairing=PairingForm.typed(data, str(exc)), status_code=400
            )
        return Redirect(f"/sessions/{session_id}#pairing", status_code=303)

    @get("/sessions/{session_id:int}/pairing.json", sync_to_thread=True)
    def pairing_file(self, services: NamedDependency[Services], session_id: FromPath[int]) -> Response[PairingExport]:
        """The session's pairing file (what GET /api/sessions/{id}/pairing answers) as a download."""
        with services.sessions() as db:
            data = export_pairing(db, session_id)
        return Response(
            data,
            media_type="application/json",
            headers={"content-disposition": f'attachment; filename="session-{session_id}-pairing.json"'},
        )

    @post("/sessions/{session_id:int}/pairing", request_max_body_size=PAIRING_FILE_LIMIT)
    async def upload_pairing_file(
        self, services: NamedDependency[Services], session_id: FromPath[int], request: Request[Any, Any, Any]
    ) -> Template | Redirect:
        """A pairing file posted from the page (`file`), applied as PUT /api/sessions/{id}/pairing applies it."""
        batch = await receive_multipart(
            request.headers.get("content-type", ""),
            request.stream(),
            services.settings.staging_dir,
            MultipartLimits.of(services.settings),
        )
        try:
            if not batch.files:
                raise InvalidInputError("choose a pairing file (JSON) to upload")
            upload = batch.files[0]
            data = parse_json(upload.path.read_bytes(), Any, what=upload.filename)
            await anyio.to_thread.run_sync(services.actions.import_pairing, session_id, data)
        except (InvalidInputError, ConflictError) as exc:  # a name no run has; a run still ingesting (409)
            status = 409 if isinstance(exc, ConflictError) else 400
            return await anyio.to_thread.run_sync(
                partial(session_template, services, session_id, ViewParams(), upload_error=str(exc), status_code=status)
            )
        finally:
            batch.discard()
        return Redirect(f"/sessions/{session_id}#pairing", status_code=303)
