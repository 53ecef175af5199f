"""The parameters and buffers of the module that made the first divergence, compared between the two models: a
rotary whose `inv_freq` is made in `__init__` from another base, or a weight loaded wrong, is named by name with its
figures, in find_divergence's answer and as a note on the session's candidate run. Before, the answer named the
first op reading the buffer and said the module's inputs agree, and no recorded op showed what it read."""

from __future__ import annotations

import copy

import torch
from sqlalchemy import select
from tensor_debugger import find_divergence
from tensor_debugger.live.state_differences import LISTED, differing_state
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import ProblemRecord, RunRecord, SessionRecord
from torch import nn

DIM = 16


class Rope(nn.Module):
    inv_freq: torch.Tensor

    def __init__(self, base: float) -> None:
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, DIM, 2).float() / DIM))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.arange(x.shape[1], dtype=torch.float32)
        freqs = torch.outer(t, self.inv_freq)  # the first op reading the buffer
        emb = torch.cat((freqs, freqs), dim=-1)
        out: torch.Tensor = x * emb.cos() + x * emb.sin()
        return out


class Block(nn.Module):
    def __init__(self, base: float = 10000.0) -> None:
        super().__init__()
        self.up = nn.Linear(DIM, DIM)
        self.rope = Rope(base)
        self.out = nn.Linear(DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.out(self.rope(self.up(x)))
        return out


def _pair(base: float) -> tuple[Block, Block]:
    torch.manual_seed(0)
    reference = Block().eval()
    candidate = Block(base).eval()
    candidate.load_state_dict(reference.state_dict())
    return reference, candidate


def _notes(settings: Settings, session: str, run: str) -> list[str]:
    services = open_services(settings)
    try:
        with services.sessions() as db:
            return list(
                db.scalars(
                    select(ProblemRecord.reason)
                    .join(RunRecord, ProblemRecord.run_id == RunRecord.id)
                    .join(SessionRecord)
                    .where(SessionRecord.name == session, RunRecord.label == run)
                )
            )
    finally:
        services.close()


def test_a_buffer_made_from_another_base_is_named_in_the_answer_and_the_session(settings: Settings) -> None:
    reference, candidate = _pair(20000.0)
    x = torch.randn(2, 8, DIM, generator=torch.Generator().manual_seed(1))
    found = find_divergence(reference, candidate, (x,), session="rope base", data_dir=settings.data_dir)
    assert found.first is not None and found.first.reference == "Block.rope/outer#1_outputs", found.words()
    assert found.culprits == ["Block.rope"], found.words()
    assert found.state is not None, found.words()
    module, other, differences = found.state
    assert (module, other) == ("Block.rope", "Block.rope")
    assert [(d.name, d.kind, d.mismatched, d.numel) for d in differences] == [("inv_freq", "buffer", 7, 8)]
    truth = (reference.rope.inv_freq - candidate.rope.inv_freq).abs()
    assert differences[0].max_abs_diff == float(truth.double().max())
    assert differences[0].argmax == (int(truth.argmax()),)
    words = found.words()
    assert "In Block.rope, the candidate holds parameters or buffers that differ" in words, words
    assert "inv_freq (a buffer, max |diff| " in words, words
    notes = _notes(settings, "rope base", "candidate (full)")
    assert any("inv_freq (a buffer, max |diff| " in n for n in notes), notes
    assert not any("inv_freq" in n for n in _notes(settings, "rope base", "reference (full)"))


def test_a_weight_loaded_wrong_is_named_and_equal_models_say_nothing(settings: Settings) -> None:
    reference, candidate = _pair(10000.0)
    with torch.no_grad():
        candidate.out.weight[3, 5] += 0.5  # one element loaded wrong
    x = torch.randn(2, 8, DIM, generator=torch.Generator().manual_seed(1))
    found = find_divergence(reference, candidate, (x,), session="one weight", data_dir=settings.data_dir)
    assert found.first is not None and found.first.module == "Block.out", found.words()
    assert found.state is not None, found.words()
    assert [(d.name, d.kind, d.argmax, d.mismatched) for d in found.state[2]] == [("weight", "parameter", (3, 5), 1)]
    assert abs(found.state[2][0].max_abs_diff - 0.5) < 1e-6
    # a bug in the forward, the state equal: nothing is said of parameters or buffers
    reference, candidate = _pair(10000.0)
    candidate.rope.forward = lambda x: Rope.forward(candidate.rope, x) * 1.01  # type: ignore[method-assign]
    found = find_divergence(reference, candidate, (x,), session="equal state", data_dir=settings.data_dir)
    assert found.first is not None and found.state is None, found.words()
    assert "parameters or buffers" not in found.words()


def test_which_parameters_and_buffers_are_compared() -> None:
    torch.manual_seed(0)
    reference = Block()
    # rounded to a lower precision only: the reference's values cast to bfloat16 are the candidate's
    assert differing_state(reference, copy.deepcopy(reference).to(torch.bfloat16), "", "") == ()
    # the other way round: a bfloat16 reference against a float32 port loaded from the float32 weights
    assert differing_state(copy.deepcopy(reference).to(torch.bfloat16), reference, "", "") == ()
    # other kinds of dtype (complex against real, float against bool) and tensors without values are not compared
    kinds, others = nn.Module(), nn.Module()
    kinds.register_buffer("z", torch.tensor([1 + 2j, 3 + 0j]))
    others.register_buffer("z", torch.tensor([1.0, 3.0]))
    kinds.register_buffer("mask", torch.tensor([0.5, 1.0]))
    others.register_buffer("mask", torch.tensor([True, True]))
    kinds.register_buffer("empty_weights", torch.empty(3, device="meta"))
    others.register_buffer("empty_weights", torch.empty(3, device="meta"))
    assert differing_state(kinds, others, "", "") == ()
    # integers compared as integers: one apart past 2**53, where float64 holds no difference
    big, bigger = nn.Module(), nn.Module()
    big.register_buffer("step", torch.tensor([2**53 + 1, 7], dtype=torch.int64))
    bigger.register_buffer("step", torch.tensor([2**53, 7], dtype=torch.int64))
    (step,) = differing_state(big, bigger, "", "")
    assert (step.max_abs_diff, step.argmax, step.mismatched) == (1.0, (0,), 1)
    # NaN on both sides at one place is no difference; a NaN on one side is, and its |diff| is infinite
    one_sided = copy.deepcopy(reference)
    with torch.no_grad():
        one_sided.up.bias[0] = float("nan")
    assert differing_state(one_sided, copy.deepcopy(one_sided), "", "") == ()
    (nan,) = differing_state(reference, one_sided, "up", "up")
    assert (nan.name, nan.max_abs_diff, nan.argmax) == ("bias", float("inf"), (0,))
    # a parameter of another shape, or a name the other side lacks (a fused port): not compared, nothing said
    fused = copy.deepcopy(reference)
    fused.up = nn.Linear(DIM, 2 * DIM)
    assert differing_state(reference, fused, "up", "up") == ()
    # a buffer of another shape (an `inv_freq` made in `__init__` for another rotary width): said, with both shapes
    narrow, wide = nn.Module(), nn.Module()
    narrow.register_buffer("inv_freq", torch.ones(2), persistent=False)
    wide.register_buffer("inv_freq", torch.ones(4), persistent=False)
    (shaped,) = differing_state(narrow, wide, "", "")
    assert (shaped.kind, shaped.shape, shaped.other_shape) == ("buffer", (2,), (4,)), shaped
    assert shaped.words() == "inv_freq (a buffer of shape [2], [4] in the candidate)"
    # the same elements in another shape (a rotary cache kept with broadcast dimensions): compared as the
    # reference's shape, said only where the values differ
    flat, broadcast = nn.Module(), nn.Module()
    flat.register_buffer("cos_cached", torch.arange(8.0).reshape(2, 4))
    cached_values = torch.arange(8.0).reshape(1, 1, 2, 4)
    broadcast.register_buffer("cos_cached", cached_values)
    assert differing_state(flat, broadcast, "", "") == ()
    cached_values[0, 0, 1, 2] = 0.5
    (cached,) = differing_state(flat, broadcast, "", "")
    assert (cached.max_abs_diff, cached.argmax, cached.mismatched) == (5.5, (1, 2), 1), cached
    # as many elements in another layout ([2, 3] against [3, 2]) is another shape, said as such
    rows, columns = nn.Module(), nn.Module()
    rows.register_buffer("table", torch.arange(6.0).reshape(2, 3))
    columns.register_buffer("table", torch.arange(6.0).reshape(2, 3).T.contiguous())
    (table,) = differing_state(rows, columns, "", "")
    assert table.words() == "table (a buffer of shape [2, 3], [3, 2] in the candidate)", table
    assert differing_state(reference, reference, "nowhere", "up") == ()
    # paths are each side's own: the candidate's module of another name
    proj = copy.deepcopy(reference.up)
    with torch.no_grad():
        proj.weight.mul_(2)
    renamed = nn.Sequential()
    renamed.add_module("proj", proj)
    (weight,) = differing_state(reference, renamed, "up", "proj")
    assert weight.name == "weight" and weight.mismatched == weight.numel == DIM * DIM
    # at most LISTED, in the module's order
    many = nn.Sequential(*(nn.Linear(2, 2) for _ in range(LISTED + 2)))
    shifted = copy.deepcopy(many)
    with torch.no_grad():
        for p in shifted.parameters():
            p.add_(1)
    listed = differing_state(many, shifted, "", "")
    assert [d.name for d in listed] == ["0.weight", "0.bias", "1.weight", "1.bias", "2.weight"][:LISTED]
