"""Whether a tensor is worth compressing, judged by compressing a small sample of it with the store's codec.

Blosc lz4 with bit-shuffle saves about 9% on float32 activations and 19% on bfloat16 (bench/zarr_codecs.py), and
compressing costs ingest time that raw chunks do not, while reading raw chunks back is a plain read. A tensor whose
sample shrinks by less than `RAW_BELOW` is stored raw: random-looking float32 values, for instance; zeros, masks,
integers and most narrow floats are compressed. The choice is recorded where every reader looks, in the array's
zarr.json (its codecs: "bytes" alone, or "bytes" then "blosc").
"""

from __future__ import annotations

from typing import Any, Final

import numpy as np
from numpy.typing import NDArray

# The store's codec, Blosc with these settings (zarr_backend.DEFAULT_CODEC is built from them). Measured with
# bench/zarr_codecs.py (README): Blosc lz4 + bit-shuffle read back fastest (about 1.7-1.9 GB/s) while storing
# float32 activations at 0.91 and bfloat16 at 0.81 of their size; zstd saves a few percent more but reads two to
# three times slower.
CNAME: Final = "lz4"
CLEVEL: Final = 1
SHUFFLE: Final = "bitshuffle"
RAW_BELOW = 0.15  # stored raw when the codec saves less than this fraction of the sample's bytes
SAMPLE_PIECES = 8  # spread over the block: a tensor's start (padding, say) is not the whole tensor
PIECE_BYTES = 32 * 1024  # 256 KiB in all: about 0.3 ms of lz4 on one core


def _shuffle(name: str) -> int:
    """numcodecs' constant for Blosc's `name`d shuffle (numcodecs is imported by what encodes, when it does)."""
    from numcodecs import Blosc

    shuffles: dict[str, int] = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE}
    return shuffles[name]


def sample_bytes(block: NDArray[Any]) -> NDArray[Any]:
    """Up to `SAMPLE_PIECES` pieces of `PIECE_BYTES` bytes, evenly spaced over `block`'s C-order bytes and
    aligned to its items, joined (the whole block when it is smaller)."""
    flat = np.ascontiguousarray(block).reshape(-1).view(np.uint8)
    if flat.size <= SAMPLE_PIECES * PIECE_BYTES:
        return flat
    item = max(1, block.dtype.itemsize)
    stride = (flat.size - PIECE_BYTES) // (SAMPLE_PIECES - 1) // item * item
    return np.concatenate([flat[i * stride : i * stride + PIECE_BYTES] for i in range(SAMPLE_PIECES)])


def worth_compressing(block: NDArray[Any], cname: str, clevel: int, shuffle: str) -> bool:
    """Whether the codec (Blosc `cname` at `clevel` with `shuffle`) saves at least `RAW_BELOW` of a sample of
    `block`. An empty block is compressed (as every tensor was before this choice existed)."""
    sample = sample_bytes(block)
    if sample.size == 0:
        return True
    from numcodecs import Blosc

    codec = Blosc(cname=cname, clevel=clevel, shuffle=_shuffle(shuffle), typesize=max(1, block.dtype.itemsize))
    encoded = codec.encode(sample)
    return len(encoded) <= (1 - RAW_BELOW) * sample.size
