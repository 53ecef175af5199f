"""`capture(..., role="noise")`: a captured run as the session's rerun of the reference (its noise floor), into a
local data dir and through a server; a float16 port's rounding then passes by the noise rule."""

from __future__ import annotations

import httpx
import pytest
import torch
from sqlalchemy import select
from tensor_debugger import capture
from tensor_debugger.compare.reports.pair_reports import session_pairs
from tensor_debugger.errors import InvalidInputError
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import PairRecord, RunRecord
from torch import nn

from tests.support.polling import wait_until
from tests.support.servers import LiveServer


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(16, 16), nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h: torch.Tensor = self.b(torch.tanh(self.a(x.to(self.a.weight.dtype))))
        return h


X = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))


def _runs(**where: object) -> int | None:
    """Capture the reference (float32), its rerun converted to float16 (role "noise") and a float16 port, in that
    order, into session "floor"; the session's id."""
    ids: list[int | None] = []
    for run, model, role in (
        ("reference", Net(), None),
        ("noise", Net().half(), "noise"),
        ("candidate", Net().half(), None),
    ):
        with torch.no_grad(), capture(model.eval(), session="floor", run=run, role=role, **where) as result:
            model(X)
        ids.append(result.session_id)
    return ids[-1]


def test_a_captured_rerun_is_the_noise_floor_of_a_local_session(settings: Settings) -> None:
    session_id = _runs(data_dir=settings.data_dir)
    assert session_id is not None
    services = open_services(settings)
    try:
        services.compute(session_id)
        with services.sessions() as db:
            query = select(RunRecord.label, RunRecord.role).where(RunRecord.session_id == session_id)
            roles = {label: role for label, role in db.execute(query)}
            report = session_pairs(db, session_id)
    finally:
        services.close()
    assert roles == {"reference": "reference", "noise": "noise", "candidate": "candidate"}
    # float16 rounding fails float16's tolerance at a linear layer's outputs, but it is the floor's own rounding
    assert any(p.rule == "noise" for p in report.pairs)
    assert report.first_divergence is None
    assert all(str(p.status) == "pass" for p in report.pairs)


def test_a_captured_rerun_is_the_noise_floor_through_a_server(shared_server: LiveServer) -> None:
    session_id = _runs(server=shared_server.url)
    with httpx.Client(base_url=shared_server.url, timeout=30) as client:
        report = wait_until(
            lambda: client.get(f"/api/sessions/{session_id}/pairs").json(),
            until=lambda r: r["pairs"] and not r["progress"]["pending"],
            what="the captured session's pairs to be computed",
            timeout=120,
            interval=0.03,
        )
        session = client.get(f"/api/sessions/{session_id}").json()
    assert {r["label"]: r["role"] for r in session["runs"]} == {
        "reference": "reference",
        "noise": "noise",
        "candidate": "candidate",
    }
    assert any(p["rule"] == "noise" for p in report["pairs"])
    assert all(p["status"] == "pass" for p in report["pairs"])


def test_a_rerun_through_a_server_must_be_labelled_noise_and_the_role_must_be_known(settings: Settings) -> None:
    net = Net().eval()
    with (
        pytest.raises(ValueError, match="must be labelled 'noise'"),
        capture(net, session="s", run="rerun", role="noise", server="http://127.0.0.1:9"),
    ):
        net(X)
    with (
        pytest.raises(ValueError, match="capture role must be 'noise'"),
        capture(net, session="s", run="r", role="candidate", data_dir=settings.data_dir),
    ):
        net(X)


def test_a_rerun_compared_against_another_run_is_that_runs_floor_and_no_run_is_compared_against_a_rerun(
    settings: Settings,
) -> None:
    """`capture(..., role="noise", against=RUN)`: the rerun is paired with RUN's tensors (its noise floor, as
    find_divergence's "noise (full)" is of "reference (full)"); a run compared against a rerun is refused, naming
    it."""
    where = {"data_dir": settings.data_dir}
    results = {}
    for run, model, role, against in (
        ("reference", Net(), None, None),
        ("other reference", Net(), None, None),
        ("noise (other)", Net().half(), "noise", "other reference"),
    ):
        with (
            torch.no_grad(),
            capture(model.eval(), session="floors", run=run, role=role, against=against, **where) as result,
        ):
            model(X)
        results[run] = result
    with (
        pytest.raises(InvalidInputError, match="run 'noise \\(other\\)' is a rerun .* cannot be compared against it"),
        capture(Net().eval(), session="floors", run="late", against="noise (other)", **where),
    ):
        Net()(X)
    services = open_services(settings)
    try:
        with services.sessions() as db:
            sides = set(
                db.scalars(select(PairRecord.run_a_id).where(PairRecord.run_b_id == results["noise (other)"].run_id))
            )
            roles = {label: role for label, role in db.execute(select(RunRecord.label, RunRecord.role))}
    finally:
        services.close()
    assert sides == {results["other reference"].run_id}
    assert roles["noise (other)"] == "noise" and "late" not in roles
