"""The compiled "fold64" sum (fused_stats.c: alone, and in one pass with a tensor's summary statistics) against its
definition in torch ops (`fold64.content_hash`), for every vector family this CPU runs; and the summaries built on it
(`sketches.fold64_sketch`, `sketches.reshaped`) against those computed without the kernel."""

from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from tensor_debugger.engine.fused import Kernel, families
from tensor_debugger.engine.summary_compare import compare_sketches
from tensor_debugger.engine.tolerances import Tolerance
from tensor_debugger.ingest.fold64 import Fold64, content_hash, dtype_name, fold64_digest
from tensor_debugger.ingest.sketches import fold64_sketch, reshaped, sketch
from tensor_debugger.ingest.summary import summarise_folded, summarise_stored
from tensor_debugger.store.dtypes import from_torch, torch_to_storage

FAMILIES = families()
pytestmark = pytest.mark.skipif(not FAMILIES, reason="the compiled kernel is not built here")

# every dtype family a capture meets: the floats the summary kernels read, float8, ints, bool, complex
DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    *[getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)],
    torch.int8,
    torch.uint8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
    torch.complex128,
]
SUMMARISED = {torch.float32: "float32", torch.float64: "float64", torch.float16: "float16", torch.bfloat16: "bfloat16"}
# element counts: empty, under a word, odd byte lengths, a vector's worth and one over, across a 2048-value sub-block
COUNTS = [0, 1, 3, 5, 7, 8, 9, 15, 17, 2047, 2048, 2049, 4099, 70001]


def values(dtype: torch.dtype, n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.rand(n, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(n, generator=g, dtype=dtype) * 50
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 50).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64).to(dtype)


def compiled_hash(t: torch.Tensor, kernel: Kernel) -> str:
    data = torch_to_storage(t.contiguous()).reshape(-1).view(np.uint8)
    total = kernel.fold64(np.ascontiguousarray(data))
    assert total is not None
    return fold64_digest(dtype_name(t.dtype), tuple(t.shape), t.numel() * t.element_size(), total)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_compiled_fold_is_content_hash_on_every_dtype_and_length(family: str, dtype: torch.dtype) -> None:
    kernel = Kernel(family=family)
    for n in COUNTS:
        t = values(dtype, n, n)
        assert compiled_hash(t, kernel) == content_hash(t), (dtype, n)
        if n:  # one bit changed anywhere changes it
            flipped = t.clone()
            flipped.view(torch.uint8).reshape(-1)[-1] ^= 1
            assert compiled_hash(flipped, kernel) != compiled_hash(t, kernel), (dtype, n)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_summary_hashed_with_fold64_equals_the_torch_path_on_strided_and_empty_tensors(
    family: str, dtype: torch.dtype
) -> None:
    kernel = Kernel(family=family)
    for shape in ((0,), (3, 0), (7,), (33, 65), (5, 1031)):
        t = values(dtype, math.prod(shape), 7).reshape(shape)
        for form in (t, t.t(), t[:, ::2] if t.dim() > 1 else t[::2]):  # contiguous, transposed, strided
            summary, total = fold64_sketch(form, kernel)
            assert summary.hash == content_hash(form), (dtype, shape)
            assert total is not None
            # the statistics and sample of the kernel path that hashes with BLAKE3, bit for bit
            assert summary == sketch(form, "fold64", kernel)
            assert summary.to_json() == {**sketch(form, "blake3", kernel).to_json(), "hash": summary.hash}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", list(SUMMARISED), ids=str)
def test_the_one_pass_summary_is_the_summary_kernels_bit_for_bit(family: str, dtype: torch.dtype) -> None:
    """With NaN and Inf too: the statistics fall to numpy (counted and skipped), the hash is still the kernel's."""
    kernel = Kernel(family=family)
    logical = from_torch(dtype)
    for n in COUNTS[1:]:
        for special in (None, math.nan, math.inf):
            t = values(dtype, n, n + 1)
            if special is not None:
                t[n // 2] = special
            stored = torch_to_storage(t)
            block, total = summarise_folded(stored, logical, kernel)
            assert block == summarise_stored(stored, logical, kernel), (dtype, n, special)
            assert total is not None
            assert fold64_digest(dtype_name(dtype), (n,), t.numel() * t.element_size(), total) == content_hash(t)
            fused = kernel.sketch(stored, SUMMARISED[dtype])
            assert fused is not None and (fused[0] is None) == (special is not None)


KERNELS = [Kernel(), Kernel("numpy")]  # compiled, and numpy's arithmetic where the kernel is not in use


def test_the_fold_taken_in_blocks_of_any_size_is_the_whole_ones() -> None:
    """Ingest's blocks and a read back's may end inside a word: the bytes carried over, the index kept; the same
    with the kernel and without it."""
    t = values(torch.float16, 20001, 3)
    data = torch_to_storage(t).view(np.uint8)
    for cuts, kernel in itertools.product(([1], [3, 5, 7], [8, 16], [4097, 1], [13] * 50), KERNELS):
        fold = Fold64(kernel)
        start = 0
        for size in cuts:
            fold.update(data[start : start + size])
            start += size
        fold.update(data[start:])
        assert fold.digest("float16", (20001,), data.size) == content_hash(t), (cuts, kernel)


def test_a_view_of_the_same_bytes_has_the_summary_of_the_tensor_reshaped() -> None:
    t = values(torch.float32, 6 * 1024, 5).reshape(6, 1024)
    summary, total = fold64_sketch(t)
    assert total is not None
    for view in (t.view(-1), t.reshape(3, 2048), t.unsqueeze(0)):
        derived = reshaped(summary, total, tuple(view.shape), view.element_size())
        assert derived == fold64_sketch(view)[0] == sketch(view, "fold64")
        assert derived.hash != summary.hash  # the shape is in the hash
    with pytest.raises(ValueError, match="cannot be of shape"):
        reshaped(summary, total, (5, 1024), 4)


def test_a_fold64_summary_is_never_called_bit_identical_to_a_blake3_one() -> None:
    """The same tensor hashed both ways (a summary run of an earlier version against one of this): compared on the
    rest, and said so."""
    t = values(torch.float32, 4096, 9)
    old, new = sketch(t, "blake3"), sketch(t, "fold64")
    for a, b in ((old, new), (new, old)):
        verdict = compare_sketches(a, b, Tolerance(rtol=1e-5, atol=1e-8))
        assert verdict.passed and not verdict.identical and verdict.hashes_differ is None
        assert "bit-identity is not checked" in verdict.reason
    same = compare_sketches(new, sketch(t.clone(), "fold64"), Tolerance(rtol=1e-5, atol=1e-8))
    assert same.identical and same.hashes_differ is False


def test_ingest_keeps_fold64_hashes_without_importing_torch(tmp_path: Path) -> None:
    """Ingest of a safetensors file, in a process of its own: the row keeps the fold64 hash of the bytes, and torch
    (1 to 2 CPU seconds to import) was never imported for it."""
    from safetensors.numpy import save_file

    array = np.random.default_rng(0).standard_normal((301, 7)).astype(np.float32)  # 8,428 bytes: a word cut short
    save_file({"x": array}, str(tmp_path / "w.safetensors"))
    script = f"""
import json, sys
from pathlib import Path
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.services import open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import TensorRecord
services = open_services(Settings.from_environ(data_dir=Path({str(tmp_path / "data")!r})))
try:
    path = Path({str(tmp_path / "w.safetensors")!r})
    services.ingestor.ingest("s", "r", [InputFile(path, path.name)])
    with services.sessions() as db:
        (row,) = db.query(TensorRecord).all()
        print(json.dumps({{"fold64": row.sketch["fold64"], "torch": "torch" in sys.modules}}))
finally:
    services.close()
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TENSOR_DEBUGGER_")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {"fold64": content_hash(torch.from_numpy(array)), "torch": False}
