"""Logical dtypes (what the tensor was) and storage dtypes (what Zarr holds).

Zarr 3 has no bfloat16, float8, float4 or complex32: those are stored as their raw bits in an unsigned integer
array of the same item size, and the logical dtype is kept in metadata, so the round trip is bit-exact.

torch is imported only by the functions that need it (PyTorch files, float8/complex32 widening): importing it
takes about a second, and ingesting .npy or .safetensors files, or listing sessions, never does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    import torch

Kind = Literal["float", "int", "bool", "complex"]


@dataclass(frozen=True)
class LogicalDtype:
    name: str  # torch's name without the "torch." prefix: "bfloat16", "int64", "float8_e4m3fn"
    storage: str  # numpy dtype of the stored array: "uint16" for bfloat16
    kind: Kind
    itemsize: int  # bytes per element
    raw_bits: bool  # stored as an unsigned integer holding the bit pattern

    @property
    def torch_dtype(self) -> torch.dtype:
        import torch

        return getattr(torch, self.name)  # type: ignore[no-any-return]

    @property
    def numpy_storage(self) -> np.dtype[np.generic]:
        return np.dtype(self.storage)


def _plain(name: str, kind: Kind, itemsize: int) -> LogicalDtype:
    return LogicalDtype(name, name, kind, itemsize, False)


def _bits(name: str, kind: Kind, itemsize: int) -> LogicalDtype:
    return LogicalDtype(name, f"uint{itemsize * 8}", kind, itemsize, True)


_TABLE: dict[str, LogicalDtype] = {
    d.name: d
    for d in (
        _plain("float64", "float", 8),
        _plain("float32", "float", 4),
        _plain("float16", "float", 2),
        _bits("bfloat16", "float", 2),
        _bits("float8_e4m3fn", "float", 1),
        _bits("float8_e5m2", "float", 1),
        _bits("float8_e4m3fnuz", "float", 1),
        _bits("float8_e5m2fnuz", "float", 1),
        _bits("float8_e8m0fnu", "float", 1),
        _bits("float4_e2m1fn_x2", "float", 1),
        _plain("int8", "int", 1),
        _plain("int16", "int", 2),
        _plain("int32", "int", 4),
        _plain("int64", "int", 8),
        _plain("uint8", "int", 1),
        _plain("uint16", "int", 2),
        _plain("uint32", "int", 4),
        _plain("uint64", "int", 8),
        _plain("bool", "bool", 1),
        _bits("complex32", "complex", 4),
        _plain("complex64", "complex", 8),
        _plain("complex128", "complex", 16),
    )
}


def parse_dtype(name: str) -> LogicalDtype:
    """The logical dtype called `name` (torch's spelling, with or without "torch.")."""
    key = name.removeprefix("torch.")
    try:
        return _TABLE[key]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}") from None


def from_torch(dtype: torch.dtype) -> LogicalDtype:
    return parse_dtype(str(dtype))


def from_numpy(dtype: np.dtype[np.generic]) -> LogicalDtype:
    if dtype.byteorder == ">" or dtype.kind not in "fiubc" or dtype.name not in _TABLE:
        raise ValueError(f"unsupported numpy dtype {dtype.str!r} ({dtype.name})")
    return _TABLE[dtype.name]


def all_dtypes() -> list[LogicalDtype]:
    return list(_TABLE.values())


def torch_to_storage(tensor: torch.Tensor) -> NDArray[Any]:
    """`tensor` as a C-contiguous numpy array in its storage dtype (bit patterns for raw-bit dtypes).

    A contiguous CPU tensor is not copied: the array shares its memory (a memory-mapped file, say)."""
    import torch

    logical = from_torch(tensor.dtype)
    t = tensor.detach().cpu().contiguous()
    if logical.raw_bits:
        signed = {1: torch.int8, 2: torch.int16, 4: torch.int32}[logical.itemsize]
        return t.view(signed).numpy().view(logical.storage)
    return t.numpy()


def storage_to_torch(array: NDArray[Any], logical: LogicalDtype) -> torch.Tensor:
    """The tensor whose storage form is `array`, bit for bit."""
    import torch

    array = np.array(array, order="C", copy=True)  # keeps 0-d arrays 0-d, unlike ascontiguousarray
    if logical.raw_bits:
        signed = {1: np.int8, 2: np.int16, 4: np.int32}[logical.itemsize]
        return torch.from_numpy(array.view(signed)).view(logical.torch_dtype)
    return torch.from_numpy(array)


def storage_to_compute(array: NDArray[Any], logical: LogicalDtype) -> NDArray[Any]:
    """Values numpy can compute with: raw-bit floats widen to float32 (exactly), complex32 to complex64.

    bfloat16 widens by a bit shift; float8 and float4 go through torch. Other dtypes are returned as they are.
    """
    if not logical.raw_bits:
        return array
    if logical.name == "bfloat16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    if logical.name == "float4_e2m1fn_x2":
        # Two packed 4-bit floats per byte: torch has no arithmetic for them, so they compare as raw bytes.
        return array
    import torch

    target = torch.complex64 if logical.kind == "complex" else torch.float32
    return storage_to_torch(array, logical).to(target).numpy()
