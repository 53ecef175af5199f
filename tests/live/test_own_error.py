"""`find_divergence`'s own-error replay (live/own_error.py): a module whose outputs are within the precision floor
(the rounding accumulated before it) while its inputs pass is called again on the reference's arguments to it, the
candidate's module against the floor copy's, and named a culprit where its own error stands out. Tiny widths: 12
residual blocks of width 32 on 16 tokens, where the last block's SiLU is within 4 times the floor at its output
(as at width 512, bench/RESULTS.md) but 8 times the floor copy's own error."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from tensor_debugger import find_divergence
from tensor_debugger.demo.models import Residual, ResidualStack
from tensor_debugger.live.divergence_answer import OWN_RUNS
from tensor_debugger.settings import Settings

HIDDEN, TOKENS = 32, 16
LAST = "ResidualStack.layers.11"


def _x() -> torch.Tensor:
    return torch.randn(1, TOKENS, HIDDEN, generator=torch.Generator().manual_seed(1))


def test_a_bug_in_the_last_of_12_bfloat16_blocks_is_named_by_its_own_error(settings: Settings) -> None:
    found = find_divergence(
        ResidualStack(hidden=HIDDEN).eval(),
        ResidualStack(hidden=HIDDEN, bug=True).to(torch.bfloat16).eval(),
        (_x(),),
        session="own",
        data_dir=settings.data_dir,
    )
    assert found.first is not None and found.first.module == LAST, found.words()
    # the case the replay is for: the block's output is within the floor, so the rule on outputs names nothing
    assert f"{LAST}_outputs" in found.floored_outputs, found.words()
    assert found.culprits == [LAST], found.words()
    own = {e.module: e for e in found.own_errors}
    assert own[LAST].culprit and own[LAST].reason is None
    assert own[LAST].ratio > 4
    # the blocks before it, replayed too, are rounding: within 1.3 times the floor copy's own error
    others = [e for e in found.own_errors if e.module != LAST]
    assert others and all(not e.culprit and e.ratio <= 1.3 for e in others), others
    words = found.words()
    assert f"its own error, given the reference's inputs, is {own[LAST].ratio:.1f}x the precision floor's" in words
    assert f"Culprit: {LAST} (its own error" in words
    assert all(r in found.runs for r in OWN_RUNS)
    # the outputs within the floor whose modules no culprit is named on: not the block's, which its replay named
    floored = words.partition("so no culprit is named on their modules for them: ")[2].partition(". ")[0]
    assert floored and f"{LAST}_outputs" not in floored.split(", "), floored


def test_a_bfloat16_port_with_no_bug_replays_nothing_and_names_nothing(settings: Settings) -> None:
    found = find_divergence(
        ResidualStack(hidden=HIDDEN).eval(),
        ResidualStack(hidden=HIDDEN).to(torch.bfloat16).eval(),
        (_x(),),
        session="own",
        data_dir=settings.data_dir,
    )
    assert found.first is None and found.culprits == [], found.words()
    assert found.own_errors == ()
    assert not set(OWN_RUNS) & set(found.runs)


def test_a_float32_bug_is_named_as_before_with_no_replay(settings: Settings) -> None:
    """No precision floor, no replay: the culprit by its outputs and inputs alone."""
    found = find_divergence(
        ResidualStack(hidden=HIDDEN).eval(),
        ResidualStack(hidden=HIDDEN, bug=True).eval(),
        (_x(),),
        session="own",
        data_dir=settings.data_dir,
    )
    assert found.floor is None
    assert found.culprits == [LAST], found.words()
    assert found.own_errors == ()
    assert f"Culprit: {LAST} (its inputs agree, its outputs do not)." in found.words()
    assert not set(OWN_RUNS) & set(found.runs)


class Counting(Residual):
    """The block, counting its calls: a call changes its state."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return super().forward(x)


class Options:
    """An object passed to a block: not a value a replay can copy."""

    scale = 1.0


class WithOptions(Residual):
    def forward(self, x: torch.Tensor, options: Options | None = None) -> torch.Tensor:
        return super().forward(x) * (options.scale if options is not None else 1.0)


class OptionsStack(ResidualStack):
    """The last block is called with `options=`, an object."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.to(next(self.parameters()).dtype)
        for layer in self.layers[:-1]:
            x = layer(x)
        out: torch.Tensor = self.layers[-1](x, options=Options())
        return out


def _stateful(bug: bool) -> Any:
    model = ResidualStack(hidden=HIDDEN, bug=bug)
    model.layers[-1].__class__ = Counting
    return model


def _optioned(bug: bool) -> Any:
    model = OptionsStack(hidden=HIDDEN, bug=bug)
    model.layers[-1].__class__ = WithOptions
    return model


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (_stateful, "the candidate's module changed its own state when called (calls)"),
        (_optioned, "its argument kwargs['options'] is a Options, which cannot be copied"),
    ],
    ids=["state changed by a call", "an argument that cannot be copied"],
)
def test_a_module_that_cannot_be_replayed_is_named_no_culprit_and_says_so(
    settings: Settings, make: Any, reason: str
) -> None:
    reference = (make if make is _optioned else lambda bug: ResidualStack(hidden=HIDDEN, bug=bug))(False).eval()
    candidate = make(True).to(torch.bfloat16).eval()
    calls = candidate.layers[-1].calls if make is _stateful else None
    found = find_divergence(reference, candidate, (_x(),), session="own", data_dir=settings.data_dir)
    last = f"{type(reference).__name__}.layers.11"
    assert found.first is not None and found.first.module == last, found.words()
    assert f"{last}_outputs" in found.floored_outputs, found.words()
    own = {e.module: e for e in found.own_errors}
    assert own[last].reason is not None and reason in own[last].reason, own[last]
    assert not own[last].culprit
    assert found.culprits == [], found.words()
    assert f"{last}'s outputs are within the precision floor, and its own error could not be measured" in found.words()
    assert reason in found.words()
    if calls is not None:  # the replay put its state back: only the candidate's two forwards counted
        assert candidate.layers[-1].calls - calls == 2
