"""Culprits of a plain dump: stages ranked by the relative RMSE each adds to the tensor before it."""

from __future__ import annotations

import math

from tensor_debugger.engine.culprits import StageCulprit, rank_stages, stands_out


def test_the_stage_that_creates_an_error_outranks_those_that_carry_it() -> None:
    errors = [(0, 0.0), (1, 1e-3), (2, 1.1e-3), (3, 0.2), (4, 0.19), (5, math.inf), (6, math.inf)]
    ranked = rank_stages(errors)
    assert [c.position for c in ranked] == [5, 3, 1, 2, 0, 6, 4]  # every stage, those that lower the error last
    assert ranked[1] == StageCulprit(3, 2, 0.2 - 1.1e-3, 1.1e-3, 0.2)
    assert rank_stages([(0, 0.5)]) == [StageCulprit(0, None, 0.5, 0.0, 0.5)]
    assert [c.added_error for c in rank_stages([(0, 0.0), (1, 0.0)])] == [0.0, 0.0]
    # which of them are culprits: the NaN that appears (5) and the stage that multiplies the error it was given by
    # 180 (3); not the first small error (1), which nothing stands out against in so short a run
    marked = stands_out([c.added_error for c in ranked], [c.input_error for c in ranked])
    assert [c.position for c, m in zip(ranked, marked, strict=True) if m] == [5, 3]
