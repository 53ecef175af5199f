"""The statistics path is an object per engine instance (engine/fused.py's Kernel), not a process-wide choice: one
process computes the same pair with the compiled kernel and with numpy, at the same time, and gets the same
statistics, and ingest's writers summarise each with their own kernel, while the default kernel (what `configure`
sets, for callers handed none) stays as it was."""

from __future__ import annotations

import math
import pickle
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy.typing import NDArray
from tensor_debugger.engine.chunking import iter_blocks, plan_chunks
from tensor_debugger.engine.fused import Kernel, default_kernel
from tensor_debugger.engine.metrics import PairStats, edges
from tensor_debugger.engine.streaming import PairJob, compare_stream, compare_views
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.engine.views import SourceView
from tensor_debugger.ingest.block_readers import ArrayReader, Leaf
from tensor_debugger.ingest.stored_sketches import CHUNKS_PER_BLOCK
from tensor_debugger.ingest.summary import SummaryAccumulator
from tensor_debugger.ingest.writer import TensorWriter, WritePools
from tensor_debugger.store.arrays import ArrayStore
from tensor_debugger.store.dtypes import parse_dtype

TOLERANCE = Tolerance(1e-3, 1e-5)


def _pair(nonfinite: bool) -> tuple[NDArray[Any], NDArray[Any]]:
    """Dyadic values (multiples of 2**-10 below 4): every sum is exact in float64 whatever its order, so the two
    kernels must agree to the last bit, not only within rounding."""
    rng = np.random.default_rng(7)
    a = (rng.integers(-4096, 4096, size=(300, 517)) / 1024).astype(np.float32)
    b = (a + rng.integers(-3, 4, size=a.shape) / 1024).astype(np.float32)
    b[17, 400] += 2.0
    if nonfinite:
        a[5, 5], b[250, 3] = np.nan, np.inf
    return a, b


def _same(got: PairStats, want: PairStats) -> None:
    for name, value in want.to_json().items():
        mine = got.to_json()[name]
        if name == "mean_rel_diff":  # quotients rounded, then summed in each kernel's order
            assert float(mine) == pytest.approx(float(value), rel=1e-12), name
        else:
            assert mine == value, (name, mine, value)


@pytest.mark.parametrize("nonfinite", [False, True])
def test_one_process_computes_a_pair_with_both_kernels_at_once(nonfinite: bool) -> None:
    compiled, numpy_only = Kernel("compiled"), Kernel("numpy")
    if compiled.name() != "compiled":
        pytest.fail(f"the compiled kernel is not in use here: {compiled.name()}")
    assert numpy_only.name().startswith("numpy")
    before = default_kernel()
    a, b = _pair(nonfinite)
    view_a, view_b = SourceView(a, lambda v: v), SourceView(b, lambda v: v)
    with ThreadPoolExecutor(4) as pool:
        # both pairs in one stream, their blocks interleaved on the same threads
        jobs = [
            PairJob(kernel.path, view_a, view_b, TOLERANCE, False, None, 8, kernel) for kernel in (compiled, numpy_only)
        ]
        results = dict(compare_stream(jobs, pool))
        alone = compare_views(view_a, view_b, TOLERANCE, False, pool, kernel=numpy_only)
    assert default_kernel() is before  # nothing process-wide was changed
    got, want = results["compiled"], results["numpy"]
    assert isinstance(got, PairStats) and isinstance(want, PairStats)
    _same(got, want)
    _same(alone, want)
    assert got.mismatched > 0 and (math.isnan(got.max_abs_diff) if nonfinite else got.max_abs_diff == 2.0)


def test_the_compiled_kernel_computes_blocks_the_numpy_one_does_not() -> None:
    """The two objects really take different paths: only the compiled one returns a kernel's partial."""
    a, b = _pair(False)
    flat_a, flat_b = a.reshape(-1), b.reshape(-1)
    assert Kernel("numpy").partial(flat_a, flat_b, 1e-5, 1e-3, True, edges()) is None
    part = Kernel("compiled").partial(flat_a, flat_b, 1e-5, 1e-3, True, edges())
    assert part is not None and part.max_abs == 2.0


def test_a_kernel_names_a_known_path() -> None:
    with pytest.raises(ValueError, match="not one of"):
        Kernel("fast")
    assert Kernel("compiled", " AVX2 ").family == "avx2"


def test_a_kernel_sent_to_another_process_resolves_its_family_there() -> None:
    kernel = Kernel("compiled")
    assert kernel.family_in_use is not None  # resolved here, for this CPU
    copy = pickle.loads(pickle.dumps(kernel))
    assert copy == kernel and "family_in_use" not in vars(copy)


def test_ingest_summarises_with_the_kernel_it_is_handed(tmp_path: Path) -> None:
    """Two writers in one process, one handed the compiled kernel and one numpy, store the same tensor at once: each
    tensor's summary is the one its own kernel gives block by block (they differ in the last bits, the sums taken in
    another order), and the default kernel is not touched."""
    compiled, numpy_only = Kernel("compiled"), Kernel("numpy")
    if compiled.name() != "compiled":
        pytest.fail(f"the compiled kernel is not in use here: {compiled.name()}")
    values = (np.random.default_rng(11).standard_normal(300_007) * 3 + 1).astype(np.float32)
    dtype = parse_dtype("float32")
    chunk_bytes = 64 * 1024
    store = ArrayStore((tmp_path / "arrays").as_uri())
    before = default_kernel()
    pools = WritePools.open(4)
    try:
        with (
            TensorWriter(store, chunk_bytes, pools, compiled) as by_kernel,
            TensorWriter(store, chunk_bytes, pools, numpy_only) as by_numpy,
        ):
            leaf = Leaf(("t",), values.shape, dtype, ArrayReader(values))
            results = [by_kernel.add("compiled", leaf), by_numpy.add("numpy", leaf)]
            by_kernel.finish()
            by_numpy.finish()
        got = [result().summary for result in results]
    finally:
        pools.close()
    assert default_kernel() is before
    layout = plan_chunks(values.shape, dtype.itemsize, chunk_bytes)
    want = []
    for kernel in (compiled, numpy_only):
        accumulator = SummaryAccumulator()
        for region in iter_blocks(layout, CHUNKS_PER_BLOCK):
            accumulator.add_stored(values[region], dtype, kernel)
        want.append(accumulator.result())
    assert compiled.summary(values, "float32") is not None and numpy_only.summary(values, "float32") is None
    assert got == want
    assert got[0].mean != got[1].mean  # the two paths really differ here: the test tells which one ran
    assert got[0].mean == pytest.approx(got[1].mean, rel=1e-12)
