"""The "fold64" content hash: a tensor's bytes as little-endian 64-bit words (the last one padded with zero bytes),
each mixed with its 1-based index (multiply, xor-shift; int64 arithmetic, which wraps the same on every device) and
added up; blake2b of the dtype, the shape, the byte count and that sum is the hash ("fold64:<hex>"). Equal tensors
hash equal; a tensor differing in one word always hashes differently; in more, by chance with probability about
2^-64.

`content_hash` is its definition, in torch ops on the tensor's own device (a GPU summary's hash). On the host the
compiled kernel computes the same sum (`engine.fused.Kernel.fold64`, and `Kernel.sketch` with a tensor's summary
statistics in the same pass), about five times faster than BLAKE3 on one thread; `Fold64` takes a tensor's bytes a
block at a time (ingest's blocks, a stored tensor read back), without torch. The sum is over words in any order, so
only each word's index matters, never the order the blocks come in.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.fused import Kernel, default_kernel

if TYPE_CHECKING:
    import torch

CHUNK = 1 << 22  # words per step of the torch path: bounded int64 temporaries on the device
_K1 = 0x1F3D5B79A3C1E2F7  # odd 64-bit constants, below 2^63 so that they are int64s
_K2 = 0x2545F4914F6CDD1D
_K3 = 0x3C6EF372FE94F82B
_MASK = (1 << 64) - 1
PREFIX = "fold64"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def content_hash(tensor: torch.Tensor) -> str:
    """ "fold64:<hex>" of the tensor's dtype, shape and bytes (see the module docstring), computed with torch ops
    where the tensor lives."""
    import torch

    t = tensor.detach().contiguous().reshape(-1)
    data = t.view(torch.uint8) if t.numel() else torch.empty(0, dtype=torch.uint8, device=t.device)
    if data.storage_offset() % 8:
        data = data.clone()
    nbytes = data.numel()
    whole = nbytes // 8 * 8
    total = torch.zeros((), dtype=torch.int64, device=data.device)
    words = data[:whole].view(torch.int64)
    for start in range(0, words.numel(), CHUNK):
        total += mixed(words[start : start + CHUNK], start)
    if whole < nbytes:
        tail = torch.zeros(8, dtype=torch.uint8, device=data.device)
        tail[: nbytes - whole] = data[whole:]
        total += mixed(tail.view(torch.int64), whole // 8)
    return fold64_digest(dtype_name(tensor.dtype), tuple(tensor.shape), nbytes, int(total.item()))


def fold64_digest(dtype: str, shape: tuple[int, ...], nbytes: int, total: int) -> str:
    """The hash of a tensor of `dtype` (torch's name: "float32"), `shape` and `nbytes` bytes whose mixed words sum
    to `total` (modulo 2^64)."""
    header = f"{dtype}|{list(shape)}|{nbytes}|{total & _MASK:016x}".encode()
    return f"{PREFIX}:" + hashlib.blake2b(header, digest_size=16).hexdigest()


def mixed(words: torch.Tensor, first: int) -> torch.Tensor:
    """The sum of int64 `words` mixed with their indices, the first word being number `first` (0-based)."""
    import torch

    index = torch.arange(first + 1, first + 1 + words.numel(), dtype=torch.int64, device=words.device)
    x = words * _K1 + index * _K2
    x ^= x >> 31
    x *= _K3
    x ^= x >> 29
    return x.sum()


class Fold64:
    """`content_hash` of a tensor's bytes taken a block at a time, in order (a word may straddle two blocks), with
    `kernel`'s compiled fold where it has one, else numpy's wrapping uint64 arithmetic (`mixed_words`). Ingest hashes
    every tensor it stores with it: it never imports torch, which ingest does not otherwise need."""

    def __init__(self, kernel: Kernel | None = None) -> None:
        self.total = 0
        self.words = 0  # words folded so far
        self.carry = np.empty(0, dtype=np.uint8)  # the bytes of a word begun in the block before
        self.kernel = kernel if kernel is not None else default_kernel()

    def update(self, data: NDArray[Any]) -> None:
        """The next bytes (a flat uint8 array)."""
        if self.carry.size:
            data = np.concatenate([self.carry, data])
        whole = data.size // 8 * 8
        self._fold(np.ascontiguousarray(data[:whole]))
        self.carry = data[whole:].copy()

    def digest(self, dtype: str, shape: tuple[int, ...], nbytes: int) -> str:
        """The hash, once every byte was taken: `dtype` is torch's name ("float32"; ingest's logical names are
        the same)."""
        if self.carry.size:
            tail = np.zeros(8, dtype=np.uint8)
            tail[: self.carry.size] = self.carry
            self._fold(tail)
            self.carry = tail[:0]
        return fold64_digest(dtype, shape, nbytes, self.total)

    def _fold(self, words: NDArray[Any]) -> None:
        """Whole words (contiguous bytes, a multiple of 8), the next after those folded."""
        compiled = self.kernel.fold64(words, self.words)
        if compiled is None:
            as_int = words.view(np.int64)
            compiled = sum(mixed_words(as_int[s : s + CHUNK], self.words + s) for s in range(0, as_int.size, CHUNK))
        self.total += compiled
        self.words += words.size // 8


def mixed_words(words: NDArray[Any], first: int) -> int:
    """`mixed` in numpy (int64 `words`, the first being word number `first`), modulo 2^64."""
    with np.errstate(over="ignore"):
        index = np.arange(first + 1, first + 1 + words.size, dtype=np.uint64)
        x = words.view(np.uint64) * np.uint64(_K1) + index * np.uint64(_K2)
        x ^= (x.view(np.int64) >> 31).view(np.uint64)
        x *= np.uint64(_K3)
        x ^= (x.view(np.int64) >> 29).view(np.uint64)
        return int(x.sum(dtype=np.uint64))
