"""`find_divergence` says only what it checked, and never changes a session made before it: one element far off
passes the summaries (a lower bound of max |diff|), so the full values decide; a session name already taken (an
earlier call's, a capture's or a compare's) gets a new session, "name (2)", as `compare` names one."""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from sqlalchemy import select
from tensor_debugger import capture, find_divergence
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import RunRecord, SessionRecord
from torch import nn

from tests.support.servers import LiveServer

HERE = Path(__file__)
WIDTH, ROWS, AT = 256, 64, 12345  # the element one side changes: (48, 57) of a (64, 256) tensor


def line_of(marker: str) -> str:
    """`path:line` of the line of this file that ends with the comment `marker`."""
    lines = HERE.read_text(encoding="utf-8").splitlines()
    found = [i + 1 for i, text in enumerate(lines) if text.rstrip().endswith(f"# {marker}")]
    assert len(found) == 1, marker
    return f"{HERE}:{found[0]}"


def one_off(h: torch.Tensor, by: float) -> torch.Tensor:
    """`h` with its element AT (flat index) moved by `by`."""
    return h + (torch.arange(h.numel()).reshape(h.shape) == AT).to(h.dtype) * by


class Late(nn.Module):
    """Two linear layers; the port moves one element of the model's output by 1e-2 after the last of them."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.port = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH), port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = self.b(torch.relu(self.a(x)))
        return one_off(y, 1e-2) if self.port else y


class BeforeRelu(nn.Module):
    """Two linear layers with a relu between; the port moves one element by 1e-3 before the relu."""

    def __init__(self, port: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b, self.port = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH), port

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.port:
            h = one_off(h, 1e-3)
        out: torch.Tensor = self.b(torch.relu(h))  # b called
        return out


def inputs() -> torch.Tensor:
    return torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(0))


def test_one_element_off_that_the_summaries_pass_is_found_by_the_full_values(settings: Settings) -> None:
    """The answer was "no divergence found in 9 pairs of summaries, but values differ within tolerance from
    Late_outputs on", and no model was called again; torch.testing.assert_close fails the same outputs (1 element
    of 16384, max |diff| 0.01). Hashes that differ where the summaries pass send the full pass to that tensor."""
    reference, candidate = Late(False).eval(), Late(True).eval()
    with torch.no_grad(), pytest.raises(AssertionError, match="Mismatched elements: 1 / 16384"):
        torch.testing.assert_close(candidate(inputs()), reference(inputs()))
    found = find_divergence(reference, candidate, inputs(), session="late", data_dir=settings.data_dir)
    first = found.first
    assert first is not None and first.reference == "Late_outputs", repr(found)
    assert first.by_full and first.summary.passed and first.summary_first is None
    assert first.full is not None and not first.full.passed
    assert (first.full.mismatched, first.full.argmax) == (1, (AT // WIDTH, AT % WIDTH))
    assert first.full.max_abs_diff == pytest.approx(1e-2, rel=1e-3)
    assert found.failing_full[0].reference == "Late_outputs"
    words = repr(found)
    assert words.startswith(
        "The first divergence, found by comparing full values element by element, is Late_outputs, in module Late. "
        "Its summaries found nothing outside tolerance there"
    ), words
    assert "within tolerance" not in words
    assert found.runs == ("reference", "candidate", "reference (full)", "candidate (full)")


def test_the_first_divergence_is_the_earliest_pair_whose_full_values_fail(settings: Settings) -> None:
    """The summaries named b's linear first and said the relu's output, where the values first differ, was "within
    tolerance there"; yet the answer's own full values failed b's input, earlier (max |diff| 1e-3, one element).
    The first divergence is that input, at the line that called b, said to be found by the full values."""
    found = find_divergence(
        BeforeRelu(False).eval(), BeforeRelu(True).eval(), inputs(), session="relu", data_dir=settings.data_dir
    )
    first = found.first
    assert first is not None and first.reference == "BeforeRelu.b_inputs_args_0", repr(found)
    assert first.by_full and first.summary_first == "BeforeRelu.b/linear#1_outputs"
    assert first.reference_source == first.candidate_source == line_of("b called")
    assert first.full is not None and first.full.mismatched == 1
    assert first.full.max_abs_diff == pytest.approx(1e-3, rel=1e-3)
    assert found.failing_full[0].reference == first.reference
    assert first.first_changed == ("BeforeRelu/relu#1_outputs", line_of("b called"))
    words = repr(found)
    assert words.startswith(
        "The first divergence, found by comparing full values element by element, is BeforeRelu.b_inputs_args_0 "
        f"(passed at {line_of('b called')} in the reference"
    ), words
    assert "the summaries named BeforeRelu.b/linear#1_outputs first, a later pair" in words
    # the relu's output: its hashes differ, its summaries pass, its full values were not recorded: nothing more said
    assert "within tolerance" not in words
    assert (
        "The first tensor whose values differ at all (content hashes) is BeforeRelu/relu#1_outputs "
        f"({line_of('b called')}); its summaries found nothing outside tolerance"
    ) in words


def runs_of(settings: Settings, session: str) -> list[tuple[str, int, str]]:
    """The session's runs as (label, position, role), in position order."""
    services = open_services(settings)
    try:
        with services.sessions() as db:
            rows = db.execute(
                select(RunRecord.label, RunRecord.position, RunRecord.role)
                .join(SessionRecord)
                .where(SessionRecord.name == session)
                .order_by(RunRecord.position)
            ).all()
    finally:
        services.close()
    return [(label, position, role) for label, position, role in rows]


def test_a_session_name_taken_gets_a_new_session_and_the_one_before_is_left_as_it_was(settings: Settings) -> None:
    """Running the notebook cell again with the same session raised ConflictError ("already has a run labelled
    'reference'") after every pass had run, and the answer was lost; into a session whose reference is not
    labelled "reference" (a compare's "r2 vs c2"), the run "reference" took position 0 and made that reference a
    candidate. Either way the answer now goes into a new session, "name (2)", as compare names one, and says so."""
    reference, candidate = Late(False).eval(), Late(True).eval()
    first = find_divergence(reference, candidate, inputs(), session="cell", data_dir=settings.data_dir)
    assert first.session == "cell" and first.asked_session is None
    before = runs_of(settings, "cell")
    again = find_divergence(reference, candidate, inputs(), session="cell", data_dir=settings.data_dir)
    assert again.session == "cell (2)" and again.asked_session == "cell"
    assert runs_of(settings, "cell") == before
    assert runs_of(settings, "cell (2)") == before  # the same runs, in a session of their own
    assert "A session named 'cell' exists already and is left as it was: this answer's runs are in a new session, " in (
        repr(again)
    )
    assert again.next_capture is not None and "session='cell (2)'" in again.next_capture

    for label, model in (("r2", reference), ("c2", candidate)):  # a session of runs labelled otherwise
        with torch.no_grad(), capture(model, "r2 vs c2", label, data_dir=settings.data_dir):
            model(inputs())
    made = runs_of(settings, "r2 vs c2")
    assert made == [("r2", 0, "reference"), ("c2", 1, "candidate")]
    found = find_divergence(reference, candidate, inputs(), session="r2 vs c2", data_dir=settings.data_dir)
    assert found.session == "r2 vs c2 (2)"
    assert runs_of(settings, "r2 vs c2") == made


def test_a_session_name_taken_on_a_server_gets_a_new_session_there(shared_server: LiveServer) -> None:
    """The same through a server: its session's runs and their places are left as they were."""
    name = f"taken {uuid.uuid4().hex[:8]}"
    reference, candidate = Late(False).eval(), Late(True).eval()
    for label, model in (("r2", reference), ("c2", candidate)):
        with torch.no_grad(), capture(model, name, label, server=shared_server.url) as result:
            model(inputs())
    with httpx.Client(base_url=shared_server.url, timeout=30) as client:

        def runs(session_id: int) -> list[tuple[str, int, str]]:
            detail: dict[str, Any] = client.get(f"/api/sessions/{session_id}").json()
            return sorted((r["label"], r["position"], r["role"]) for r in detail["runs"])

        assert result.session_id is not None
        made = runs(result.session_id)
        assert made == [("c2", 1, "candidate"), ("r2", 0, "reference")]
        found = find_divergence(reference, candidate, inputs(), session=name, server=shared_server.url)
        assert found.session == f"{name} (2)" and found.asked_session == name
        assert runs(result.session_id) == made
        listed = {s["name"] for s in client.get("/api/sessions", params={"q": name}).json()}
    assert listed == {name, f"{name} (2)"}


class Waiting(nn.Module):
    """`Late`, whose first call waits at `barrier` for the other thread's: both calls have found the session name
    free (before their first pass) when either goes on to store."""

    def __init__(self, port: bool, barrier: threading.Barrier) -> None:
        super().__init__()
        self.inner, self.barrier, self.waited = Late(port), barrier, False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.waited:
            self.waited = True
            self.barrier.wait(timeout=120)
        out: torch.Tensor = self.inner(x)
        return out


def _two_at_once(name: str, where: dict[str, Any]) -> tuple[Any, Any]:
    """Two `find_divergence` calls with the new session name `name` at the same moment (each waits for the other
    before its first pass: both find the name free), storing where `where` says (`data_dir=` or `server=`): their
    answers, the one in `name` first, the one in "name (2)" second; neither may raise."""
    barrier = threading.Barrier(2)
    found: list[Any] = []
    failed: list[BaseException] = []

    def call() -> None:
        try:
            reference, candidate = Waiting(False, barrier).eval(), Waiting(True, barrier).eval()
            found.append(find_divergence(reference, candidate, inputs(), session=name, **where))
        except BaseException as exc:  # said below, with the other call's answer
            failed.append(exc)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not failed, failed
    assert sorted(f.session for f in found) == [name, f"{name} (2)"]
    first, second = sorted(found, key=lambda f: len(f.session))
    assert second.asked_session == name
    return first, second


def test_two_calls_with_one_new_session_name_at_once_each_get_a_session(settings: Settings) -> None:
    """Two `find_divergence` calls with one new session name, at the same moment, in one data dir: both found the
    name free, and the second to store met the first's runs ("already has a run labelled 'reference'") after all
    its passes. The name is taken as the first run is stored: the second call stores into "name (2)", says so, and
    its snippet names that session."""
    _, second = _two_at_once("at once", {"data_dir": settings.data_dir})
    assert second.next_capture is not None and "session='at once (2)'" in second.next_capture
    runs = [("reference", 0, "reference"), ("candidate", 1, "candidate")]
    assert runs_of(settings, "at once")[:2] == runs_of(settings, "at once (2)")[:2] == runs
    assert runs_of(settings, "at once") == runs_of(settings, "at once (2)")


def test_two_calls_with_one_new_session_name_at_once_on_a_server_each_get_a_session(shared_server: LiveServer) -> None:
    """The same two calls storing on a server: the name is taken there as the first run is uploaded (a run that was
    to make the session and found one of that name is not kept there), so the second call stores into "name (2)"."""
    name = "at once on a server"
    _two_at_once(name, {"server": shared_server.url})
    with httpx.Client(base_url=shared_server.url, timeout=30) as client:
        listed = {s["name"] for s in client.get("/api/sessions", params={"q": name}).json()}
    assert listed == {name, f"{name} (2)"}
