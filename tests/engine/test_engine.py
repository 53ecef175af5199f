"""The pure engine on in-memory arrays: pairing, alignment, lazy views, statistics against numpy in float64."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from tensor_debugger.engine.alignment import ReferenceCut, align, cut_verdict, reference_cut
from tensor_debugger.engine.chunking import Region
from tensor_debugger.engine.fused import configure, kernel_name
from tensor_debugger.engine.logical_tensors import TensorRef, group_shards, shard_of
from tensor_debugger.engine.metrics import HIST_HIGH, HIST_LOW, PairStats
from tensor_debugger.engine.pairing import normalize, pair_runs
from tensor_debugger.engine.streaming import PairJob, compare_stream, compare_views
from tensor_debugger.engine.tolerances import Tolerance, default_tolerance
from tensor_debugger.engine.views import SourceView, View, build_view, flat_boxes


@pytest.fixture(params=["compiled", "numpy"])
def pool(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[ThreadPoolExecutor]:
    """Threads for the comparison, once with each statistics kernel (the compiled one must be the one in use)."""
    configure(kernel=request.param)
    assert kernel_name().split()[0] == request.param, kernel_name()
    with ThreadPoolExecutor(2) as executor:
        yield executor


def views(a: list[NDArray[Any]], b: list[NDArray[Any]]) -> tuple[View, View]:
    alignment = align([x.shape for x in a], [x.shape for x in b])
    assert alignment is not None
    va = build_view([SourceView(x, lambda v: v, k) for k, x in enumerate(a)], alignment.side_steps("a"))
    vb = build_view([SourceView(x, lambda v: v, k) for k, x in enumerate(b)], alignment.side_steps("b"))
    return va, vb


def reference_stats(a: NDArray[Any], b: NDArray[Any], tol: Tolerance) -> dict[str, float]:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    d = np.abs(a64 - b64)
    nz = a64 != 0
    return {
        "max_abs_diff": d.max(),
        "mean_abs_diff": d.mean(),
        "mse": (d**2).mean(),
        "max_rel_diff": (d[nz] / np.abs(a64[nz])).max(),
        "mean_rel_diff": (d[nz] / np.abs(a64[nz])).mean(),
        "cosine": a64 @ b64 / np.sqrt((a64 @ a64) * (b64 @ b64)),
        "mismatched": int((d > tol.atol + tol.rtol * np.abs(a64)).sum()),
        "snr_db": 10 * np.log10((a64 @ a64) / (d @ d)),
    }


def test_statistics_equal_a_float64_reference(pool: ThreadPoolExecutor) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((300, 700)).astype(np.float32)  # several blocks
    b = (a + rng.standard_normal(a.shape).astype(np.float32) * 1e-4).astype(np.float32)
    b[123, 456] += 2.0
    tol = Tolerance(1.3e-6, 1e-5)
    va, vb = views([a], [b])
    stats = compare_views(va, vb, tol, False, pool)
    expected = reference_stats(a, b, tol)
    for name, value in expected.items():
        assert getattr(stats, name) == pytest.approx(value, rel=1e-9), name
    assert stats.argmax == (123, 456) and stats.numel == a.size
    assert sum(stats.histogram) == a.size


class BrokenView:
    """A view whose every read fails, as a corrupt chunk would."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        self.shape = shape

    def read(self, region: Region) -> NDArray[Any]:
        raise OSError("chunk file c/0/0 is corrupt")

    def locate(self, index: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        return 0, index


def test_a_stream_of_pairs_gives_each_its_own_result_in_order(pool: ThreadPoolExecutor) -> None:
    """Blocks of consecutive pairs are in flight together; every result still belongs to its own pair, and one
    pair's failure (a read error, views of different shapes) stays its own."""
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in [(700, 900), (3,), (), (1200, 1000)]]
    others = [np.asarray(x + np.float32(0.5) * (k + 1) if x.ndim else np.float32(x + 2)) for k, x in enumerate(arrays)]
    tol = Tolerance(1.3e-6, 1e-5)
    jobs = [PairJob(k, *views([x], [y]), tol, False) for k, (x, y) in enumerate(zip(arrays, others, strict=True))]
    jobs.insert(2, PairJob(90, BrokenView((500, 900)), BrokenView((500, 900)), tol, False))
    unaligned = SourceView(arrays[0], lambda v: v), SourceView(arrays[0][:10], lambda v: v)
    jobs.insert(4, PairJob(91, *unaligned, tol, False))
    results = list(compare_stream(jobs, pool, in_flight=3))
    assert [key for key, _ in results] == [job.key for job in jobs]
    by_key = dict(results)
    assert isinstance(by_key[90], OSError) and "corrupt" in str(by_key[90])
    assert isinstance(by_key[91], ValueError) and "differ in shape" in str(by_key[91])
    for k, (x, y) in enumerate(zip(arrays, others, strict=True)):
        stats = by_key[k]
        assert isinstance(stats, PairStats) and stats.numel == x.size
        assert stats == compare_views(*views([x], [y]), tol, False, pool)
        assert stats.max_abs_diff == pytest.approx(float(np.abs(x.astype(np.float64) - y).max()), rel=1e-12)


class GatedView:
    """A view whose reads wait for `gate`, as a slow disk would."""

    def __init__(self, values: NDArray[Any], gate: threading.Event) -> None:
        self.shape = values.shape
        self._values = values
        self._gate = gate

    def read(self, region: Region) -> NDArray[Any]:
        assert self._gate.wait(timeout=10)
        return self._values[region]

    def locate(self, index: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        return 0, index


def test_ticks_while_a_block_is_awaited_and_a_failed_pair_reads_no_more(pool: ThreadPoolExecutor) -> None:
    gate = threading.Event()
    ticks: list[float] = []

    def tick() -> None:
        ticks.append(time.monotonic())
        if len(ticks) == 3:
            gate.set()

    values = np.arange(12.0).reshape(3, 4)
    job = PairJob("slow", GatedView(values, gate), GatedView(values + 1, gate), Tolerance(0, 0), False)
    ((_, stats),) = compare_stream([job], pool, on_tick=tick)
    assert isinstance(stats, PairStats) and stats.max_abs_diff == 1.0 and len(ticks) >= 4  # 3 waiting, 1 after
    # a pair whose first block fails submits no more of its blocks
    reads: list[Region] = []

    class CountingBroken(BrokenView):
        def read(self, region: Region) -> NDArray[Any]:
            reads.append(region)
            return super().read(region)

    big = (4096, 1024)  # 4 blocks of 1M values
    ((_, error),) = compare_stream(
        [PairJob("bad", CountingBroken(big), CountingBroken(big), Tolerance(0, 0), False)], pool, in_flight=1
    )
    assert isinstance(error, OSError) and len(reads) <= 2


@pytest.mark.parametrize("scale", [(-13.0, 5.0), (-9.0, -7.0)])
def test_histogram_and_mismatches_equal_a_direct_count(pool: ThreadPoolExecutor, scale: tuple[float, float]) -> None:
    """Differences spread over many decades, or all inside the tolerance, with exact zeros and zero references."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((300, 500)).astype(np.float32)
    a[3, :10] = 0.0
    b = (a + a * 10.0 ** rng.uniform(*scale, a.shape)).astype(np.float32)
    b[::7] = a[::7]
    tol = Tolerance(1e-3, 1e-6)
    stats = compare_views(*views([a], [b]), tol, False, pool)
    d = np.abs(a.astype(np.float64) - b.astype(np.float64)).ravel()
    edges = (10.0 ** np.arange(HIST_LOW + 1, HIST_HIGH + 1)).astype(np.float32)  # binned at float32 precision
    d32 = d.astype(np.float32)
    expected = [int((d == 0).sum()), int(((d > 0) & (d32 < edges[0])).sum())]
    expected += [int(((d32 >= lo) & (d32 < hi)).sum()) for lo, hi in zip(edges, edges[1:], strict=False)]
    expected.append(int((d32 >= edges[-1]).sum()))
    assert stats.histogram == expected
    assert stats.mismatched == int((d > tol.atol + tol.rtol * np.abs(a.astype(np.float64).ravel())).sum())
    assert (stats.mismatched > 0) == (scale[1] > -7.0)


def test_nan_and_inf_are_counted_never_hidden(pool: ThreadPoolExecutor) -> None:
    a = np.array([1.0, np.nan, 3.0, np.inf, 5.0, np.nan, -np.inf], dtype=np.float32)
    b = np.array([1.0, 2.0, np.nan, np.inf, 5.0, np.nan, 0.0], dtype=np.float32)
    stats = compare_views(*views([a], [b]), Tolerance(1e-5, 1e-8), False, pool)
    assert (stats.nan_a, stats.nan_b, stats.inf_a, stats.inf_b) == (2, 2, 2, 1)
    assert stats.nan_one_side == 2
    assert stats.mismatched == 4  # three NaN positions and -inf against 0
    assert math.isnan(stats.cosine) and math.isnan(stats.max_abs_diff)
    assert stats.argmax == (1,)  # the first NaN outranks every finite difference
    assert not stats.passed


def test_identical_tensors_pass_with_similarity_one(pool: ThreadPoolExecutor) -> None:
    a = np.linspace(-1, 1, 1000, dtype=np.float32).reshape(10, 100)
    stats = compare_views(*views([a], [a.copy()]), Tolerance(0, 0), False, pool)
    assert stats.passed and stats.max_abs_diff == 0 and stats.cosine == 1.0 and stats.snr_db == math.inf


def test_integers_and_bools_compare_exactly(pool: ThreadPoolExecutor) -> None:
    a = np.array([2**62, 5, 7], dtype=np.int64)
    b = np.array([2**62 + 1, 5, 7], dtype=np.int64)  # differs below float64's resolution
    stats = compare_views(*views([a], [b]), default_tolerance("int64", "int64"), True, pool)
    assert stats.mismatched == 1
    flags = compare_views(*views([np.array([True, False])], [np.array([True, True])]), Tolerance(0, 0), True, pool)
    assert flags.mismatched == 1 and flags.max_abs_diff == 1.0


def test_scalars_compare_like_any_tensor(pool: ThreadPoolExecutor) -> None:
    stats = compare_views(*views([np.array(0.125)], [np.array(0.25)]), Tolerance(0, 0), False, pool)
    assert stats.numel == 1 and stats.max_abs_diff == 0.125 and stats.argmax == ()


def test_tp8_layouts_align_and_compare(pool: ThreadPoolExecutor) -> None:
    rng = np.random.default_rng(2)
    full = rng.standard_normal((76, 8, 64)).astype(np.float32)
    # leading 1 and permuted heads: [1, 8, 76, 64] against [76, 8, 64]
    permuted = full.transpose(1, 0, 2)[None].copy()
    permuted[0, 5, 70, 3] += 1.0
    alignment = align([full.shape], [permuted.shape])
    assert alignment is not None and [s.kind for s in alignment.steps] == ["squeeze", "permute"]
    va, vb = views([full], [permuted])
    stats = compare_views(va, vb, Tolerance(1.3e-6, 1e-5), False, pool)
    assert stats.argmax == (70, 5, 3) and stats.mismatched == 1
    assert vb.locate((70, 5, 3)) == (0, (0, 5, 70, 3))
    # four shards of two heads each, concatenated along the head dimension
    shards = [full[:, 2 * k : 2 * k + 2, :].copy() for k in range(4)]
    shards[2][10, 1, 7] = 9.0
    alignment = align([s.shape for s in shards], [full.shape])
    assert alignment is not None and alignment.steps[0].kind == "concat" and alignment.steps[0].axis == 1
    va, vb = views(shards, [full])
    stats = compare_views(va, vb, Tolerance(1.3e-6, 1e-5), False, pool)
    assert stats.argmax == (10, 5, 7) and stats.mismatched == 1
    assert va.locate((10, 5, 7)) == (2, (10, 1, 7))
    # one rank's extra rows: [80, 8, 64] against [76, 8, 64]
    extra = np.concatenate([full, rng.standard_normal((4, 8, 64)).astype(np.float32)])
    alignment = align([extra.shape], [full.shape])
    assert alignment is not None and [s.kind for s in alignment.steps] == ["truncate"] and alignment.shape == full.shape
    stats = compare_views(*views([extra], [full]), Tolerance(0, 0), False, pool)
    assert stats.passed and stats.numel == full.size


def test_transpose_then_last_resort_and_incomparable(pool: ThreadPoolExecutor) -> None:
    # a weight stored transposed (a Conv1D's against a Linear's): the last dimension moves, before any flattening
    weight = np.random.default_rng(3).standard_normal((10, 6)).astype(np.float32)
    alignment = align([(10, 6)], [(6, 10)])
    assert alignment is not None and not alignment.last_resort
    assert alignment.words() == "candidate dims permuted [1, 0] -> [10, 6]"
    stats = compare_views(*views([weight], [weight.T.copy()]), Tolerance(0, 0), False, pool)
    assert stats.passed and stats.numel == weight.size
    alignment = align([(10, 6)], [(4, 15)])  # as many elements, no permutation fits: flattened, and said so
    assert alignment is not None and alignment.last_resort and "last resort" in alignment.words()
    assert align([(3, 5)], [(4, 4)]) is None


def test_flat_boxes_cover_ranges_exactly() -> None:
    shape = (3, 4, 5)
    whole = np.arange(60).reshape(shape)
    for start, stop in [(0, 60), (7, 43), (19, 21), (20, 40), (59, 60)]:
        boxes = flat_boxes(shape, start, stop)
        got = np.concatenate([whole[box].ravel() for box in boxes])
        assert got.tolist() == list(range(start, stop))


def test_pairing_chain_and_execution_order() -> None:
    def ref(
        i: int, name: str, shape: tuple[int, ...] = (2,), layer: int | None = None, stage: str | None = None
    ) -> TensorRef:
        return TensorRef(i, name, shape, "float32", i, layer, stage)

    a = [
        ref(0, "1_post_mlp", layer=1, stage="post_mlp"),
        ref(1, "0_query", layer=0, stage="query"),
        ref(2, "0_post_ln_pre_attn", layer=0, stage="post_ln_pre_attn"),
        ref(3, "model.Embed", (9,)),
        ref(4, "lonely", (3,)),
        ref(5, "odd_one", (7, 7)),
        ref(6, "0_zeta", layer=0, stage="zeta"),
    ]
    b = [
        ref(0, "port/1_post_mlp", layer=1, stage="post_mlp"),
        ref(1, "0_query", layer=0, stage="query"),
        ref(2, "0_post_ln_pre_attn", layer=0, stage="post_ln_pre_attn"),
        ref(3, "module.embed", (9,)),
        ref(4, "something_else", (7, 7)),
        ref(5, "only_b", (5,)),
        ref(6, "0_zeta", layer=0, stage="zeta"),
    ]
    pairing = pair_runs(a, b)
    assert [(p.a.name, p.b.name, p.strategy) for p in pairing.pairs] == [
        ("0_post_ln_pre_attn", "0_post_ln_pre_attn", "layer_stage"),
        ("0_query", "0_query", "layer_stage"),
        ("0_zeta", "0_zeta", "layer_stage"),
        ("1_post_mlp", "port/1_post_mlp", "layer_stage"),
        ("model.Embed", "module.embed", "normalized"),
        ("odd_one", "something_else", "shape"),
    ]
    assert [t.name for t in pairing.unmatched_a] == ["lonely"]
    assert [t.name for t in pairing.unmatched_b] == ["only_b"]
    manual = pair_runs(a, b, manual=[("lonely", "only_b")], unpaired=[("odd_one", "something_else")])
    assert ("lonely", "only_b", "manual") in [(p.a.name, p.b.name, p.strategy) for p in manual.pairs]
    assert [t.name for t in manual.unmatched_a] == ["odd_one"]


def test_shards_merge_into_one_logical_tensor() -> None:
    assert shard_of("rank3/0_query") == ("0_query", 3)
    assert shard_of("tp/rank3/0_query") == ("tp/0_query", 3)
    assert shard_of("0_query_rank2") == ("0_query", 2)
    assert shard_of("0_query_tp7.out") == ("0_query.out", 7)
    assert shard_of("0_query") == ("0_query", None)
    refs = [TensorRef(i, f"rank{r}/0_query", (2,), "float32", i) for i, r in enumerate([1, 0, 2])]
    (merged,) = group_shards(refs)
    assert merged.name == "0_query" and [s.id for s in merged.shards] == [1, 0, 2]
    assert normalize("Module._orig_mod.Model.Layers-0/MLP") == "layers.0.mlp"


def test_stats_json_round_trip_keeps_nan_and_inf() -> None:
    stats = PairStats(
        1, math.nan, (0,), math.inf, 0.0, 0.0, 0.0, 0.0, math.nan, -math.inf, 1, 1.0, 1, 0, 0, 0, 1, [0] * 18, 0.0, 0.0
    )
    data = stats.to_json()
    assert data["max_abs_diff"] == "nan" and data["mean_abs_diff"] == "inf" and data["snr_db"] == "-inf"
    again = PairStats.from_json(data)
    assert math.isnan(again.max_abs_diff) and again.mean_abs_diff == math.inf and again.argmax == (0,)


def test_default_tolerances_follow_torch_testing() -> None:
    assert default_tolerance("float32", "bfloat16") == Tolerance(1.6e-2, 1e-5)
    assert default_tolerance("float32", "float32") == Tolerance(1.3e-6, 1e-5)
    assert default_tolerance("float16", "float64") == Tolerance(1e-3, 1e-5)
    assert default_tolerance("int64", "float32") == Tolerance(0, 0)


def test_reference_rows_cut_away_are_never_a_pass() -> None:
    # the reference's extra rows cut away: only the rows the candidate has face it
    fewer = align([(1, 6, 8)], [(4, 8)])
    assert fewer is not None and fewer.shape == (4, 8)
    assert fewer.words() == (
        "reference size-1 dims dropped -> [6, 8]; reference cut to its first 4 of 6 rows along dim 0 "
        "(2 reference rows not compared)"
    )
    cut = reference_cut(list(fewer.shapes_a), fewer.steps)
    assert cut == ReferenceCut(4, 6, 0)
    assert cut_verdict(True, cut.words()) == (
        "incomparable",
        "not a pass: compared 4 of the reference's 6 rows along dim 0: the candidate has 4, so 2 reference rows "
        "were not compared; the rows compared are within tolerance",
    )
    assert cut_verdict(False, cut.words()) == ("fail", None)
    # the words say by which rule what was compared passed: the noise rule's, or summaries' (nothing found)
    assert str(cut_verdict(True, cut.words(), "noise")[1]).endswith("; the rows compared are within the noise floor")
    assert str(cut_verdict(True, cut.words(), "summaries")[1]).endswith(
        "; the rows compared, on summaries: nothing found outside tolerance"
    )
    # a reference in shards, concatenated first: the rows counted after the concat
    shards = align([(3, 8), (3, 8)], [(5, 8)])
    assert shards is not None and reference_cut(list(shards.shapes_a), shards.steps) == ReferenceCut(5, 6, 0)
    # the candidate's extra rows (a padded vocabulary): every reference element compared, a pass stands
    padded = align([(6, 8)], [(8, 8)])
    assert padded is not None and reference_cut(list(padded.shapes_a), padded.steps) is None
    assert cut_verdict(True, None) == ("pass", None)
    # no rows on one side: 0 elements against some is incomparable
    assert align([(1, 6, 8)], [(1, 0, 8)]) is None and align([(0, 8)], [(6, 8)]) is None
    assert align([(0, 8)], [(0, 8)]) is not None  # both empty: nothing left out
