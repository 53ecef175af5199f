"""Culprits of a plain dump: stages ranked by the relative RMSE each adds to the tensor before it."""

from __future__ import annotations

import math

from tensor_debugger.engine.culprits import StageCulprit, rank_stages


def test_the_stage_that_creates_an_error_outranks_those_that_carry_it() -> None:
    errors = [(0, 0.0), (1, 1e-3), (2, 1.1e-3), (3, 0.2), (4, 0.19), (5, math.inf), (6, math.inf)]
    ranked = rank_stages(errors)
    assert [c.position for c in ranked] == [5, 3, 1, 2]
    assert ranked[1] == StageCulprit(3, 2, 0.2 - 1.1e-3, 1.1e-3, 0.2)
    assert rank_stages([(0, 0.5)]) == [StageCulprit(0, None, 0.5, 0.0, 0.5)]
    assert rank_stages([(0, 0.0), (1, 0.0)]) == []
