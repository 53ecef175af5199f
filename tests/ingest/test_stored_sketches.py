"""Ingest keeps each stored tensor's summary (its row's `sketch`), computed from the blocks it writes: the same, bit
for bit, as the summary read back from the stored array (what the judge computes for a row stored before), and the
same as a capture's summary of the tensor in everything but the last bits of the sum and the sum of squares."""

from __future__ import annotations

import copy
import json
import math
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from numpy.typing import NDArray
from safetensors.torch import save_file
from sqlalchemy import text, update
from tensor_debugger.engine.summary_compare import Sketch, sample_positions
from tensor_debugger.ingest.fold64 import content_hash
from tensor_debugger.ingest.inputs import InputFile
from tensor_debugger.ingest.runs import Ingestor
from tensor_debugger.ingest.sketches import record_sketch, sketch
from tensor_debugger.services import Services, open_services
from tensor_debugger.settings import Settings
from tensor_debugger.store.models import TensorRecord

from tests.support.dumps import random_bits, seeded
from tests.support.s3 import STORES
from tests.support.stored import stored

CHUNK_BYTES = 4096  # small chunks: a tensor of a few hundred KB is many blocks of 16 chunks


def with_specials(t: torch.Tensor) -> torch.Tensor:
    """`t` with a NaN, an Inf and a -Inf planted away from its start (some sampled, some not)."""
    flat = t.clone().reshape(-1)
    n = flat.numel()
    for at, value in ((n // 3, math.nan), (n // 2 + 1, math.inf), (n - 2, -math.inf)):
        flat[at] = value
    return flat.reshape(t.shape)


def torch_tensors() -> dict[str, torch.Tensor]:
    """Every dtype family, with shapes of one block, many blocks, a split axis past the first, 0-d and empty."""
    big = (300, 257)  # 77,100 elements: many 16-chunk blocks at CHUNK_BYTES, more elements than the sample
    tensors = {
        "f32": with_specials(seeded(big, 1)),
        "f32_deep": seeded((3, 5, 4000), 2),  # chunks of part of the last axis: blocks within each (i, j)
        "f16": with_specials(seeded(big, 3).to(torch.float16)),
        "bf16": with_specials(seeded(big, 4).to(torch.bfloat16)),
        "f64": with_specials(seeded(big, 5).to(torch.float64)),
        "f64_huge": torch.full((4, 1000), 1e300, dtype=torch.float64),  # its float64 sums overflow
        "i8": random_bits(big, torch.int8, 6),
        "i8_deep": random_bits((3, 5, 4001), torch.int8, 17),  # blocks of 20,005 bytes: words straddle them
        "i32": random_bits(big, torch.int32, 7),
        "i64": random_bits((2000,), torch.int64, 8),
        "u8": random_bits((40, 33), torch.uint8, 9),
        "mask": random_bits(big, torch.bool, 10),
        "c64": with_specials(torch.complex(seeded(big, 11), seeded(big, 12))),
        "c128": torch.complex(seeded((50, 40), 13), seeded((50, 40), 14)).to(torch.complex128),
        "small": seeded((7, 3), 15),  # fewer elements than the sample: all of them
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros((0, 8)),
        "all_nan": torch.full((600,), math.nan),
    }
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, name):
            tensors[name] = with_specials(seeded(big, 16)).to(getattr(torch, name))
    return tensors


def safetensors_tensors() -> dict[str, torch.Tensor]:
    big = (260, 301)
    return {
        "f32": with_specials(seeded(big, 21)),
        "bf16": seeded(big, 22).to(torch.bfloat16),
        "f16": seeded(big, 23).to(torch.float16),
        "i64": random_bits((5000,), torch.int64, 24),
        "mask": random_bits(big, torch.bool, 25),
    }


def numpy_arrays() -> dict[str, NDArray[Any]]:
    rng = np.random.default_rng(31)
    f64 = rng.standard_normal((256, 311))
    f64[100, 7] = np.nan
    return {
        "f64": f64,
        "f32_fortran": np.asfortranarray(rng.standard_normal((311, 250)).astype(np.float32)),
        "i16": rng.integers(-30000, 30000, (400, 111), dtype=np.int16),
        "c64": (rng.standard_normal((200, 150)) + 1j * rng.standard_normal((200, 150))).astype(np.complex64),
    }


def written(folder: Path) -> tuple[list[Path], dict[str, torch.Tensor]]:
    """Files saved by torch, safetensors and numpy, and each tensor by the last part of its row's name."""
    folder.mkdir()
    originals: dict[str, torch.Tensor] = {}
    pth = torch_tensors()
    torch.save(pth, folder / "dump.pth")
    originals.update({f"dump.{k}": v for k, v in pth.items()})
    st = safetensors_tensors()
    save_file(st, str(folder / "weights.safetensors"))
    originals.update({f"weights.{k}": v for k, v in st.items()})
    files = [folder / "dump.pth", folder / "weights.safetensors"]
    for name, array in numpy_arrays().items():
        np.save(folder / f"{name}.npy", array)
        files.append(folder / f"{name}.npy")
        originals[name] = torch.from_numpy(np.ascontiguousarray(array))
    return files, originals


def original_of(name: str, originals: dict[str, torch.Tensor]) -> torch.Tensor:
    return next(t for key, t in originals.items() if name.endswith(key))


def same(a: Sketch, b: Sketch) -> bool:
    """Bit for bit: JSON spells floats by repr, which round-trips them exactly (NaN and Inf as strings)."""
    return json.dumps(a.to_json()) == json.dumps(b.to_json())


def same_floats(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return len(a) == len(b) and all(x == y or (math.isnan(x) and math.isnan(y)) for x, y in zip(a, b, strict=True))


@pytest.fixture
def small_chunks(settings: Settings, store_environ: dict[str, str]) -> Services:
    tight = Settings(
        data_dir=settings.data_dir,
        demo=False,
        database_url=settings.database_url,
        store_url=settings.store_url,
        chunk_bytes=CHUNK_BYTES,
        workers=2,
    )
    return open_services(tight, store_environ)


@pytest.mark.parametrize("store_url", STORES, indirect=True)
def test_ingest_keeps_the_summary_read_back_gives_bit_for_bit(small_chunks: Services, tmp_path: Path) -> None:
    services = small_chunks
    try:
        files, originals = written(tmp_path / "dump")
        inputs = [InputFile(f, f.name) for f in files]
        result = Ingestor(services.settings, services.sessions, services.store).ingest("s", "ref", inputs)
        rows = stored(services, result.run_id)
        assert len(rows) == len(originals)
        for name, row in rows.items():
            assert row.sketch is not None and row.has_values, name
            assert "sample" not in row.sketch and isinstance(row.sketch["sample_f64"], str), name  # compact
            kept = Sketch.from_json(row.sketch)
            # read back as a row stored before ingest kept summaries: its blocks, as ingest cut them
            before = services.store.chunk_reads
            unkept = TensorRecord(**{c: getattr(row, c) for c in ("store_key", "digest", "dtype", "has_values")})
            back = record_sketch(services.store, unkept)
            assert back is not None and same(replace(kept, fold64=None), back), name
            if row.numel > 0:
                assert services.store.chunk_reads > before, name  # it did read the array
            # the row's own summary is used as it is: no chunk read
            before = services.store.chunk_reads
            again = record_sketch(services.store, row, "blake3")
            assert again is not None and same(again, kept), name
            assert services.store.chunk_reads == before, name
            # what a capture's summary of the original tensor holds
            original = original_of(name, originals)
            captured = sketch(original)
            assert kept.hash == captured.hash == row.digest, name
            assert (kept.shape, kept.dtype, kept.numel) == (captured.shape, captured.dtype, captured.numel), name
            assert (kept.count, kept.nan, kept.inf) == (captured.count, captured.nan, captured.inf), name
            assert (kept.min, kept.max) == (captured.min, captured.max), name
            assert same_floats(kept.sample, captured.sample), name
            assert len(kept.sample) == len(sample_positions(kept.numel)), name
            # against a summary hashed with fold64: the one ingest kept beside the digest, computed as it wrote the
            # blocks (a word may straddle two of these small blocks), no chunk read; or read back from its blocks
            before = services.store.chunk_reads
            folded = record_sketch(services.store, row, "fold64")
            assert folded is not None and folded.hash == kept.fold64 == content_hash(original), name
            assert services.store.chunk_reads == before, name
            assert same(replace(folded, hash=kept.hash, fold64=kept.fold64), kept), name
            unfolded = record_sketch(services.store, unkept, "fold64")
            assert unfolded is not None and unfolded.hash == content_hash(original), name
            for ours, theirs in ((kept.sum, captured.sum), (kept.sumsq, captured.sumsq)):
                if math.isfinite(theirs):
                    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-300), name
            # and the row's statistics agree with it
            assert (row.nan_count, row.inf_count) == (kept.nan, kept.inf), name
            assert row.min == kept.min and row.max == kept.max, name
    finally:
        services.close()


SPECIALS = [math.nan, math.inf, -math.inf, -0.0, 0.0, 5e-324, -1.5, 1e308, 2.0**-1074 * 3]


def bits(values: tuple[float, ...] | list[float]) -> list[int]:
    codes: list[int] = np.asarray(values, dtype="<f8").view("<u8").tolist()  # numpy 2.0 says Any, 2.5 a list
    return codes


def test_a_kept_summary_in_the_compact_form_reads_back_bit_for_bit(services: Services, tmp_path: Path) -> None:
    """A float64 tensor of NaN, Inf, -Inf, -0.0 and subnormals, every element sampled: its row's JSON, as the
    database holds it as text, keeps the sample as one string and reads back the same bits."""
    folder = tmp_path / "dump"
    folder.mkdir()
    original = torch.tensor(SPECIALS, dtype=torch.float64)
    save_file({"x": original}, str(folder / "w.safetensors"))
    result = Ingestor(services.settings, services.sessions, services.store).ingest(
        "s", "ref", [InputFile(folder / "w.safetensors", "w.safetensors")]
    )
    with services.sessions() as db:
        raw = db.execute(text("SELECT sketch FROM tensors WHERE run_id = :r"), {"r": result.run_id}).scalar_one()
    data = json.loads(raw) if isinstance(raw, str) else raw
    assert "sample" not in data and isinstance(data["sample_f64"], str)
    kept = Sketch.from_json(data)
    assert bits(kept.sample) == bits(original.tolist()) == bits(SPECIALS)
    assert bits(Sketch.from_json(json.loads(json.dumps(kept.to_json(compact=True)))).sample) == bits(SPECIALS)
    assert (kept.nan, kept.inf, kept.count) == (1, 2, len(SPECIALS) - 3)
    assert same(replace(kept, fold64=None), sketch(original, "blake3"))  # a capture's summary, in the list form
    assert kept.fold64 == content_hash(original) == sketch(original, "fold64").hash


def test_a_summary_in_the_list_form_still_reads(services: Services, tmp_path: Path) -> None:
    """A row holding its summary as older versions (and summary captures) write it: "sample" a list of numbers,
    NaN and Inf as strings. It reads as before, and comparing it does not read the array."""
    folder = tmp_path / "dump"
    folder.mkdir()
    original = torch.tensor(SPECIALS, dtype=torch.float64)
    save_file({"x": original}, str(folder / "w.safetensors"))
    result = Ingestor(services.settings, services.sessions, services.store).ingest(
        "s", "ref", [InputFile(folder / "w.safetensors", "w.safetensors")]
    )
    (row,) = stored(services, result.run_id).values()
    assert row.sketch is not None
    old = {k: v for k, v in row.sketch.items() if k != "sample_f64"}
    old["sample"] = ["nan", "inf", "-inf", -0.0, 0.0, 5e-324, -1.5, 1e308, 1.5e-323]  # as json.dumps spells them
    with services.sessions.begin() as db:
        db.execute(update(TensorRecord).where(TensorRecord.id == row.id).values(sketch=old))
    (row,) = stored(services, result.run_id).values()
    assert row.sketch is not None and "sample_f64" not in row.sketch
    before = services.store.chunk_reads
    read = record_sketch(services.store, row, "blake3")
    assert read is not None and services.store.chunk_reads == before
    assert bits(read.sample) == bits(SPECIALS)
    assert same(read, Sketch.from_json(row.sketch)) and same(replace(read, fold64=None), sketch(original, "blake3"))


@pytest.mark.parametrize(
    ("sample", "reason"),
    [("AAAA", "not of float64"), ("not base64!", "base64"), (7, "a string"), ("AAAAAAAAAAA=", "holds 1")],
)
def test_a_malformed_compact_sample_is_refused(sample: object, reason: str) -> None:
    data = sketch(torch.tensor([1.0, 2.0])).to_json(compact=True)
    assert Sketch.from_json(data) == sketch(torch.tensor([1.0, 2.0]))
    with pytest.raises((ValueError, TypeError), match=reason):
        Sketch.from_json({**data, "sample_f64": sample})


def test_the_compact_json_is_read_only_and_gives_its_summary_back_as_parsing_would() -> None:
    """`to_json(compact=True)` keeps the summary it was made from (`SketchJson`), which `from_json` gives back
    without parsing: so it must equal what parsing gives, bit for bit, and the JSON cannot be changed under it. A
    copy (json, pickle, `dict`) is a plain dict, parsed as any other."""
    made = sketch(with_specials(seeded((33, 65), 3)), "fold64")
    data = made.to_json(compact=True)
    written = json.loads(json.dumps(data))
    assert written == dict(data) and type(written) is dict
    parsed = Sketch.from_json(written)
    assert Sketch.from_json(data) is made
    assert bits(parsed.sample) == bits(made.sample) and same(parsed, made) and parsed.hash == made.hash
    with pytest.raises(TypeError, match="read-only"):
        data["sum"] = 0.0
    with pytest.raises(TypeError, match="read-only"):
        data.update(sum=0.0)
    assert Sketch.from_json(data) is made
    copied = pickle.loads(pickle.dumps(data))
    assert type(copied) is dict and copied == written
    assert type(copy.deepcopy(data)) is dict
    changed = {**data, "sum": 0.0}  # a changed copy is parsed, not taken for the summary it was made from
    assert Sketch.from_json(changed).sum == 0.0
