"""A tensor-parallel tensor one run holds fewer ranks' shards of than the other, where that run has those ranks.

Both runs split `0_query` across ranks 0 and 1, but the candidate's `0_query_rank1` is missing (a rank's dump that
never finished): its lone `0_query_rank0` has the shape of one reference shard, which by shape alone reads as one
whole copy of a tensor the reference replicates on 2 ranks, and a comparison would say "the reference's rank 1's
replica differs". Where the run lacking the shard has that rank elsewhere (another tensor's `_rank1`), the shard is
missing: the pair is not comparable as it stands, and saying so is all that is known.
"""

from __future__ import annotations

import re

from tensor_debugger.engine.logical_tensors import LogicalTensor, TensorRef, shard_of


def run_ranks(tensors: list[TensorRef], pattern: re.Pattern[str] | None = None) -> set[int]:
    """The ranks any of a run's tensors is marked with (`_rank1`, `rank1/`, a name pattern's `rank`)."""
    return {rank for t in tensors if (rank := shard_of(t.name, pattern)[1]) is not None}


def _ranks(tensor: LogicalTensor, pattern: re.Pattern[str] | None) -> set[int]:
    return {rank for s in tensor.shards if (rank := shard_of(s.name, pattern)[1]) is not None}


def missing_shards(
    a: LogicalTensor,
    b: LogicalTensor,
    ranks_a: set[int],
    ranks_b: set[int],
    pattern: re.Pattern[str] | None = None,
) -> str | None:
    """Why the pair of `a` (the reference side) and `b` cannot be compared as it stands: one side holds shards of
    only some of the ranks the other's are split across, ranks its own run has (`ranks_a`, `ranks_b`: `run_ranks`
    of each run); None where neither lacks one."""
    for side, mine, other, ranks in (("candidate", b, a, ranks_b), ("reference", a, b, ranks_a)):
        have, want = _ranks(mine, pattern), _ranks(other, pattern)
        if not have or len(want) < 2 or not have < want:
            continue
        lacking = sorted((want - have) & ranks)
        if lacking:
            words = ", ".join(str(r) for r in lacking)
            return (
                f"the {side} lacks the shard{'s' if len(lacking) > 1 else ''} of rank{'s' if len(lacking) > 1 else ''}"
                f" {words} of {mine.name} (it holds rank{'s' if len(have) > 1 else ''} "
                f"{', '.join(str(r) for r in sorted(have))} of the {len(want)} the other run splits it across, and "
                f"has rank {lacking[0]} elsewhere)"
            )
    return None
