"""PyTorch files read without torch (ingest/pth_files.py) give, bit for bit, what torch.load gives: every dtype,
views that share or skip parts of their storage, parameters, scalars and nestings, a module's state dict; and what
the reader leaves to torch (the legacy format, code in the pickle) still goes through torch.load."""

from __future__ import annotations

import io
import zipfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from numpy.typing import NDArray
from tensor_debugger.engine.chunking import Region
from tensor_debugger.errors import FileProblem
from tensor_debugger.ingest.pth_files import NeedsTorch, PthTensor, read_pth
from tensor_debugger.ingest.tensor_files import open_tensor_file
from tensor_debugger.store.dtypes import all_dtypes, torch_to_storage

from tests.support.dumps import random_bits


def _whole(shape: tuple[int, ...]) -> Region:
    return tuple(slice(0, n) for n in shape)


def _read_all(path: Path) -> dict[tuple[str, ...], tuple[str, NDArray[Any]]]:
    """Every leaf of `path` as the ingest reads it: (logical dtype, stored values)."""
    found = {}
    with open_tensor_file(path, path.name) as opened:
        for leaf in opened.leaves:
            region = _whole(leaf.shape)
            values = np.array(leaf.reader.read(region), copy=True)
            leaf.reader.done(region)
            found[leaf.key_path] = (leaf.dtype.name, values)
    return found


def _expected(obj: Any, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], tuple[str, NDArray[Any]]]:
    if isinstance(obj, torch.Tensor):
        return {prefix: (str(obj.dtype).removeprefix("torch."), torch_to_storage(obj.contiguous()))}
    if isinstance(obj, dict):
        return {k: v for key, value in obj.items() for k, v in _expected(value, (*prefix, str(key))).items()}
    if isinstance(obj, list | tuple):
        return {k: v for i, value in enumerate(obj) for k, v in _expected(value, (*prefix, str(i))).items()}
    return {}


def _same(path: Path, saved: Any) -> None:
    got, expected = _read_all(path), _expected(torch.load(path, weights_only=True))
    assert got.keys() >= expected.keys()
    for key, (dtype, values) in expected.items():
        assert got[key][0] == dtype, key
        assert got[key][1].dtype == values.dtype and got[key][1].shape == values.shape, key
        assert got[key][1].tobytes() == values.tobytes(), key


@pytest.mark.parametrize("dtype", [d.name for d in all_dtypes()])
def test_every_dtype_and_layout_reads_as_torch_loads_it(tmp_path: Path, dtype: str) -> None:
    base = random_bits((6, 10), getattr(torch, dtype), seed=3)
    saved = {
        "whole": base,
        "transposed": base.t(),  # strides (1, 10): a view of the same storage
        "rows": base[2:5],  # an offset into the storage
        "columns": base[:, 3:7],  # gaps between rows
        "strided": base[::2, ::3],
        "scalar": base[1, 1],
        "empty": base[:0],
        "expanded": base[0:1].expand(4, 10),  # stride 0
    }
    path = tmp_path / f"{dtype}.pth"
    torch.save(saved, path)
    assert all(isinstance(v, PthTensor) for v in read_pth(path).values())  # no torch needed for any of them
    _same(path, saved)


def test_parameters_nestings_scalars_and_a_state_dict(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.LayerNorm(4))
    saved = {
        "state": model.state_dict(),
        "param": torch.nn.Parameter(torch.ones(3)),
        "nested": [1, 2.5, True, complex(1, 2), None, ("text", torch.arange(4))],
        "ordered": OrderedDict(a=torch.zeros(2, dtype=torch.int8)),
    }
    path = tmp_path / "mixed.pth"
    torch.save(saved, path)
    got = _read_all(path)
    _same(path, saved)
    assert got[("nested", "0")] == ("int64", np.asarray(1))
    assert got[("nested", "1")][1].tobytes() == np.float64(2.5).tobytes()
    assert got[("nested", "3")][0] == "complex128"
    assert ("nested", "4") not in got  # None is dropped
    with open_tensor_file(path, "mixed.pth") as opened:
        assert [p.reason for p in opened.skipped] == ["not a tensor (str); skipped"]


def test_pickle_protocols_and_bin_files(tmp_path: Path) -> None:
    for protocol in (2, 3):
        path = tmp_path / f"p{protocol}.bin"
        torch.save({"w": torch.randn(3, 5)}, path, pickle_protocol=protocol)
        _same(path, None)
    for protocol in (4, 5):  # torch's weights-only unpickler refuses their frames (a plain framing opcode)
        path = tmp_path / f"p{protocol}.bin"
        saved = torch.randn(3, 5)
        torch.save({"w": saved}, path, pickle_protocol=protocol)
        assert _read_all(path)[("w",)][1].tobytes() == saved.numpy().tobytes()


def test_what_only_torch_reads_goes_to_torch(tmp_path: Path) -> None:
    legacy = tmp_path / "legacy.pth"
    torch.save({"w": torch.arange(3)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(NeedsTorch):
        read_pth(legacy)
    assert _read_all(legacy)[("w",)][1].tolist() == [0, 1, 2]  # torch.load read it
    sparse = tmp_path / "sparse.pth"
    torch.save({"s": torch.eye(3).to_sparse()}, sparse)
    with pytest.raises(NeedsTorch):
        read_pth(sparse)
    with open_tensor_file(sparse, "sparse.pth") as opened:
        assert "not supported" in opened.skipped[0].reason


def test_a_storage_shorter_than_its_tensor_is_named(tmp_path: Path) -> None:
    path = tmp_path / "short.pth"
    torch.save({"w": torch.arange(100, dtype=torch.float32)}, path)
    rebuilt = io.BytesIO()
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(rebuilt, "w", zipfile.ZIP_STORED) as target:
        for info in source.infolist():
            data = source.read(info)
            target.writestr(info, data[:40] if info.filename.endswith("/data/0") else data)
    path.write_bytes(rebuilt.getvalue())
    with pytest.raises(FileProblem, match="reaches past its storage"):
        open_tensor_file(path, "short.pth")
