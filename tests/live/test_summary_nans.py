"""A tensor holding a NaN fails whether its pair is judged on full values or on summaries: a NaN is a mismatch, NaN
against NaN too (torch.testing's default, equal_nan=False), so the same two runs get one verdict either way."""

from __future__ import annotations

import pytest
import torch
from sqlalchemy import select
from tensor_debugger import capture
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import PairRecord

from tests.support import loopback_http
from tests.support.servers import LiveServer, wait_done


class Net(torch.nn.Module):
    """A linear layer, a NaN written into its output, and a ReLU (which keeps the NaN)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x).clone()
        y[0, 0] = float("nan")
        return torch.relu(y)


@pytest.mark.parametrize("values", [("full", "full"), ("summary", "full"), ("full", "summary"), ("summary", "summary")])
def test_the_same_nan_on_both_sides_fails_on_summaries_as_on_full_values(
    settings: Settings, values: tuple[str, str]
) -> None:
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 8)
    for run, kind in zip(("reference", "candidate"), values, strict=True):
        with torch.no_grad(), capture(model, "nans", run, data_dir=settings.data_dir, values=kind):
            model(x)
    services = open_services(settings)
    try:
        with services.sessions() as db:
            session_id = db.scalars(select(PairRecord.session_id)).first() or 1
        services.plan(session_id)
        services.compute(session_id)
        with services.sessions() as db:
            pairs = {p.name: p for p in db.scalars(select(PairRecord).where(PairRecord.session_id == session_id))}
    finally:
        services.close()
    assert pairs["Net.lin_outputs"].status == "pass"  # before the NaN: no NaN, equal values
    out = pairs["Net_outputs"]
    assert out.status == "fail", (values, out.summary)
    if "summary" in values:
        assert out.summary is not None and out.summary["basis"] == "summary"
        assert out.summary["identical"] and not out.summary["passed"]
        assert "bit-identical (equal content hashes), but 1 NaN elements: a NaN is a mismatch" in out.summary["reason"]


def test_the_pair_page_of_a_bit_identical_pair_holding_a_nan_says_it_fails(shared_server: LiveServer) -> None:
    """Through the app: the pair's page gives the reason (bit-identical, but a NaN is a mismatch), not the bare
    "bit-identical" of a pass."""
    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 8)
    name = "nans on the pair page"
    for run, kind in (("reference", "summary"), ("candidate", "full")):
        with (
            torch.no_grad(),
            capture(model, name, run, server=shared_server.url, token=shared_server.token, values=kind) as sent,
        ):
            model(x)
    assert sent.session_id is not None
    report = wait_done(shared_server, sent.session_id)
    pair = next(p for p in report["pairs"] if p["name"] == "Net_outputs")
    assert pair["status"] == "fail"
    page = loopback_http.get(f"{shared_server.url}/pairs/{pair['id']}", headers=shared_server.auth).text
    notice = page.split('id="from-summaries"')[1].split("</p>")[0]
    assert "bit-identical (equal content hashes), but 1 NaN elements: a NaN is a mismatch" in notice, notice
