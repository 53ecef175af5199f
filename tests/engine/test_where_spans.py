"""Where inside a failing pair its error is (engine/where.py), from planted differences in seeded data."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from tensor_debugger.engine.chunking import Region
from tensor_debugger.engine.dimension_names import dimension_names, parse_dims, parse_dims_option
from tensor_debugger.engine.error_spans import ErrorSpan
from tensor_debugger.engine.fused import FAMILIES, WHERE_ROW_LIMIT, Kernel, families
from tensor_debugger.engine.metrics import PairStats
from tensor_debugger.engine.streaming import PairJob, compare_stream, compare_views
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.engine.views import SourceView
from tensor_debugger.engine.where import SLAB_BYTES, block_masses, confine, locate_error


def views(a: NDArray[Any], b: NDArray[Any]) -> tuple[SourceView, SourceView]:
    return SourceView(a, lambda x: x.astype(np.float64)), SourceView(b, lambda x: x.astype(np.float64))


def attention(seed: int = 0) -> NDArray[Any]:
    return np.random.default_rng(seed).standard_normal((1, 16, 64, 32)).astype(np.float32)


def test_a_head_at_three_tokens() -> None:
    a = attention()
    b = a.copy()
    b[0, 5, 10:13, :] += 0.5
    with ThreadPoolExecutor(2) as pool:
        spans = locate_error(*views(a, b), pool)
    assert spans == [ErrorSpan(1, 16, ((5, 5),)), ErrorSpan(2, 64, ((10, 12),))]
    assert [s.to_json() for s in spans] == [
        {"dim": 1, "size": 16, "ranges": [[5, 5]]},
        {"dim": 2, "size": 64, "ranges": [[10, 12]]},
    ]


def test_everywhere_is_no_dimension() -> None:
    a = attention()
    b = a + np.random.default_rng(1).standard_normal(a.shape).astype(np.float32) * 0.01
    assert locate_error(*views(a, b)) == []


def test_two_separated_ranges_and_a_one_d_tensor() -> None:
    a = np.random.default_rng(2).standard_normal(1000)
    b = a.copy()
    b[100:110] += 1.0
    b[700] -= 2.0
    assert locate_error(*views(a, b)) == [ErrorSpan(0, 1000, ((100, 109), (700, 700)))]


def test_a_nan_outweighs_finite_error() -> None:
    a = np.random.default_rng(3).standard_normal((8, 8))
    b = a + 1e-3  # everywhere
    b[6, 2] = np.nan
    assert locate_error(*views(a, b)) == [ErrorSpan(0, 8, ((6, 6),)), ErrorSpan(1, 8, ((2, 2),))]


def test_blocks_cover_the_tensor_in_any_order() -> None:
    """A tensor larger than one block: the masses are folded from every block."""
    a = np.zeros((3, 600_000), dtype=np.float32)
    b = a.copy()
    b[2, 599_990:] = 1.0
    with ThreadPoolExecutor(2) as pool:
        assert locate_error(*views(a, b), pool) == [
            ErrorSpan(0, 3, ((2, 2),)),
            ErrorSpan(1, 600_000, ((599_990, 599_999),)),
        ]


@pytest.mark.parametrize(
    ("mass", "expected"),
    [
        ([0.0, 5.0, 0.0, 0.0], ((1, 1),)),
        ([1.0, 1.0, 1.0, 1.0], None),  # everywhere
        ([1.0, 1.0, 0.0, 0.0], ((0, 1),)),  # half of the indices: still confined
        ([0.0, 0.0, 0.0], None),  # no error
        ([3.0], None),  # size 1
        ([0.0, 1.0] * 20, None),  # 20 ranges: scattered
    ],
)
def test_confine(mass: list[float], expected: tuple[tuple[int, int], ...] | None) -> None:
    assert confine(np.array(mass)) == expected


def test_the_stream_locates_failing_pairs_only() -> None:
    a = attention()
    bad = a.copy()
    bad[0, 3, :, 7] = 0.0
    tolerance = Tolerance(1e-5, 1e-6)
    jobs = [PairJob("same", *views(a, a.copy()), tolerance, False), PairJob("bad", *views(a, bad), tolerance, False)]
    with ThreadPoolExecutor(2) as pool:
        results = dict(compare_stream(jobs, pool))
        alone = compare_views(*views(a, bad), tolerance, False, pool)
    same, failing = results["same"], results["bad"]
    assert isinstance(same, PairStats) and same.passed and same.where is None
    assert isinstance(failing, PairStats) and not failing.passed
    assert [s.to_json() for s in failing.where or []] == [
        {"dim": 1, "size": 16, "ranges": [[3, 3]]},
        {"dim": 3, "size": 32, "ranges": [[7, 7]]},
    ]
    assert alone.where == failing.where
    assert PairStats.from_json(failing.to_json()).where == failing.where


class CountingView:
    """A view that counts the elements read through it."""

    def __init__(self, array: NDArray[Any]) -> None:
        self.inner = SourceView(array, lambda x: x.astype(np.float64))
        self.shape = self.inner.shape
        self.elements = 0

    def read(self, region: Region) -> NDArray[Any]:
        values = self.inner.read(region)
        self.elements += values.size
        return values

    def locate(self, index: tuple[int, ...]) -> tuple[int, tuple[int, ...]]:
        return self.inner.locate(index)


def test_a_passing_pair_is_read_once_a_failing_one_twice() -> None:
    a = attention()
    close = a + np.float32(1e-7)
    bad = a.copy()
    bad[0, 1, 2, 3] += 1.0
    tolerance = Tolerance(1e-5, 1e-5)
    passing, failing = (CountingView(a), CountingView(close)), (CountingView(a), CountingView(bad))
    jobs = [PairJob("passing", *passing, tolerance, False), PairJob("failing", *failing, tolerance, False)]
    with ThreadPoolExecutor(2) as pool:
        results = dict(compare_stream(jobs, pool))
    assert [v.elements for v in passing] == [a.size, a.size]
    assert [v.elements for v in failing] == [2 * a.size, 2 * a.size]
    result = results["failing"]
    assert isinstance(result, PairStats) and result.where is not None and len(result.where) == 3


def test_dimension_names() -> None:
    dims = parse_dims({" *attn* ": "batch, heads,tokens,head_dim", "*": ["tokens", "hidden"]})
    assert dims == {"*attn*": "batch,heads,tokens,head_dim", "*": "tokens,hidden"}
    assert dimension_names(dims, ["layers.0.ATTN.out"], 4) == ["batch", "heads", "tokens", "head_dim"]
    assert dimension_names(dims, ["layers.0.attn.out"], 2) == ["tokens", "hidden"]  # the first of the right count
    assert dimension_names(dims, ["mlp"], 3) is None
    assert parse_dims({}) is None and parse_dims(None) is None
    assert parse_dims_option(["*a*=x,y", "b=c=z"]) == {"*a*": "x,y", "b=c": "z"}
    bad_values: list[object] = [[], {"*": ""}, {"*": "a b"}, {"": "a"}, {"*": "a,a"}, {"*": 3}]
    for bad in bad_values:
        with pytest.raises(ValueError, match="dims"):
            parse_dims(bad)


def whole_block_masses(a: NDArray[Any], b: NDArray[Any]) -> tuple[list[NDArray[Any]], list[NDArray[Any]]]:
    """What `block_masses` computed before it went a slab of rows at a time: the whole block's float64 squares at
    once, summed per dimension by numpy."""
    with np.errstate(invalid="ignore", over="ignore"):
        square = np.square(np.subtract(a, b, dtype=np.float64))
        square[np.asarray(a, dtype=np.float64) == np.asarray(b, dtype=np.float64)] = 0.0
    bad = ~np.isfinite(square)
    square[bad] = 0.0

    def sums(values: NDArray[Any]) -> list[NDArray[Any]]:
        along_last = values.reshape(-1, values.shape[-1]).sum(axis=0)
        if values.ndim == 1:
            return [along_last]
        rest = values.sum(axis=-1)
        return [*(rest.sum(axis=tuple(i for i in range(rest.ndim) if i != d)) for d in range(rest.ndim)), along_last]

    return sums(square), [s.astype(np.int64) for s in sums(bad.astype(np.float64))]


@pytest.mark.parametrize(
    "shape",
    [
        (1024, 1024),
        (4096, 256),
        (300_001,),
        (3, 700, 500),
        (2, 2, 3, 40000),
        (70000, 2),
        (50000, 3),
        (200_000, 1),
        (9, 5),
        (7,),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64"])
def test_block_masses_a_slab_at_a_time_are_those_of_the_whole_block_bit_for_bit(
    shape: tuple[int, ...], dtype: str
) -> None:
    """Many slabs a block (SLAB_BYTES of squares each), their edges inside rows of the last dimension's sums and
    not, with non-finite differences in some slabs only (a NaN, an infinity against a finite value, equal
    infinities) or none."""
    rng = np.random.default_rng(sum(shape))
    a = (rng.standard_normal(shape) * 1e3).astype(dtype)
    b = (a + rng.standard_normal(shape).astype(dtype)).astype(dtype)
    assert (a.size * 8 > SLAB_BYTES) == (a.size > 100)  # many slabs, or (the last two shapes) one
    got, want = block_masses(a, b), whole_block_masses(a, b)
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    flat_a[a.size // 3] = np.nan
    flat_a[a.size // 2], flat_b[a.size // 2] = np.inf, np.inf
    flat_b[a.size - 1] = -np.inf
    bad_got, bad_want = block_masses(a, b), whole_block_masses(a, b)
    for (squares, counts), (wanted_squares, wanted_counts) in ((got, want), (bad_got, bad_want)):
        assert len(squares) == len(wanted_squares) == len(counts) == a.ndim
        for found, wanted in zip(squares, wanted_squares, strict=True):
            assert found.dtype == wanted.dtype and found.tobytes() == wanted.tobytes()  # the same bits
        for found, wanted in zip(counts, wanted_counts, strict=True):
            assert found.dtype == np.int64 and np.array_equal(found, wanted)
    assert sum(int(c.sum()) for c in bad_got[1]) == 2 * a.ndim  # the NaN and the infinity against a finite value


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "shape",
    [(1525, 1024), (300, 128), (129, 129), (33, 31), (9, 8), (5, 7), (3, 2), (2, 8192), (2, 10_000), (2, 3, 5, 17)],
)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_block_masses_compiled_are_numpys_bit_for_bit(family: str, shape: tuple[int, ...], dtype: str) -> None:
    """The compiled row and column sums (`Kernel.where_sums`) of each family are numpy's, bit for bit: rows of
    under 8, up to 128, past 128 and at WHERE_ROW_LIMIT values (numpy's pairwise order changes at each; a longer
    row is summed by numpy), values over twelve decades;
    a block with a NaN, equal infinities or a square that overflows goes to numpy's path, the same answer."""
    if family not in families():
        pytest.skip(f"this kernel library or CPU has no {family} family (here: {', '.join(families()) or 'none'})")
    kernel = Kernel("compiled", family)
    rng = np.random.default_rng(sum(shape))
    a = (rng.standard_normal(shape) * 10.0 ** rng.integers(-6, 6, shape)).astype(dtype)
    b = (a + 1e-3 * rng.standard_normal(shape)).astype(dtype)
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    compiled = kernel.where_sums(a.reshape(-1, shape[-1]), b.reshape(-1, shape[-1]))
    assert (compiled is not None) == (shape[-1] <= WHERE_ROW_LIMIT)  # computed compiled; a longer row by numpy
    cases: list[tuple[NDArray[Any], NDArray[Any]]] = [(a, b)]
    for position, value_a, value_b in (
        (a.size // 3, np.nan, 1.0),
        (a.size // 2, np.inf, np.inf),
        (a.size - 1, 1e300, -1e300),
    ):
        bad_a, bad_b = flat_a.copy(), flat_b.copy()
        with np.errstate(over="ignore"):  # 1e300 is an infinity in float32
            bad_a[position], bad_b[position] = value_a, value_b
        cases.append((bad_a.reshape(shape), bad_b.reshape(shape)))
    for x, y in cases:
        with np.errstate(over="ignore"):
            (squares, counts), (wanted_squares, wanted_counts) = block_masses(x, y, kernel), block_masses(x, y)
        assert len(squares) == len(wanted_squares) == len(counts) == len(wanted_counts) == a.ndim
        for found, wanted in zip([*squares, *counts], [*wanted_squares, *wanted_counts], strict=True):
            assert found.dtype == wanted.dtype and found.shape == wanted.shape
            assert found.tobytes() == wanted.tobytes()  # the same bits
