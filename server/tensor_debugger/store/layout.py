"""The layout of one stored array, read from its zarr.json as the Zarr v3 specification defines it.

The chunk reader and writer read and write chunk files themselves (see chunk_reader.py), so they need the array's
shape, chunk shape, chunk key encoding, fill value and codecs. Those come from the on-disk format, which is a
published specification (https://zarr-specs.readthedocs.io/en/latest/v3/core/index.html), not from Zarr's own
classes, which are private and change between releases. Only the layouts this store writes are `readable`: a regular
chunk grid of native-order bytes, then one Blosc codec or none (a tensor the codec would shrink by less than
`arrays.RAW_BELOW` is stored raw); anything else is read through Zarr's public API.

`array_document` writes the other way: the zarr.json of a new array as Zarr writes it for the same arguments
(`ArrayStore.writer` puts it on disk itself: importing Zarr and creating 64 arrays through its event loop cost a
first compare about 0.3 s of CPU). A test compares it with Zarr's own for every dtype.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# Zarr v3 data types that are numpy dtypes of the same name.
_NUMPY_TYPES = frozenset(
    {
        "bool",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "float16",
        "float32",
        "float64",
        "complex64",
        "complex128",
    }
)
_FLOAT_WORDS = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


@dataclass(frozen=True)
class BloscSettings:
    """The Blosc codec's configuration, as zarr.json records it."""

    cname: str
    clevel: int
    shuffle: str  # "noshuffle", "shuffle" or "bitshuffle"
    typesize: int
    blocksize: int


@dataclass(frozen=True)
class ArrayLayout:
    """What reading or writing the chunk files of one array needs, parsed from its zarr.json.

    `blosc` is None for raw chunks (`raw`: each chunk file is the chunk's native-order bytes) and for any layout
    other than those this store writes (`readable` False)."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    chunks: tuple[int, ...]
    separator: str
    v2_keys: bool  # the "v2" chunk key encoding ("0.1"), else "default" ("c/0/1")
    fill_value: Any
    blosc: BloscSettings | None
    attributes: dict[str, Any]
    raw: bool = False

    @property
    def readable(self) -> bool:
        """Whether the chunks are plain Blosc frames, or raw bytes, of native-order values that this package reads
        itself."""
        return (self.blosc is not None or self.raw) and len(self.shape) > 0

    @property
    def chunk_bytes(self) -> int:
        """Decoded size of one whole chunk."""
        return math.prod(self.chunks) * self.dtype.itemsize

    @property
    def every_chunk_written(self) -> bool:
        """Whether the writer recorded that it wrote every chunk of the array (all-zero ones included): then a
        chunk that is not there is damage (`missing_chunk`), never the fill value. Arrays written before the
        marker lack all-zero chunks legitimately, and read them as the fill value."""
        return self.attributes.get(EVERY_CHUNK_WRITTEN) is True

    def chunk_key(self, coords: tuple[int, ...]) -> str:
        """The chunk's key relative to the array, per the chunk key encoding."""
        if self.v2_keys:
            return self.separator.join(str(c) for c in coords) if coords else "0"
        return self.separator.join(("c", *(str(c) for c in coords)))


# The attribute new arrays carry in their zarr.json: the writer writes every chunk, so a missing one is damage.
EVERY_CHUNK_WRITTEN = "every_chunk_written"


class MissingChunkError(ValueError):
    """A chunk of an array written with every chunk is not there: the data dir (or bucket) is damaged. `chunk`
    names it ("file /data/arrays/runs/1/0/c.2.0", "object s3://bucket/runs/1/0/c/2/0")."""

    chunk: str = ""


def missing_chunk(name: str) -> MissingChunkError:
    """The error for the chunk file or object `name` (its path or URL, which names the run and tensor's array)
    that is missing from an array whose writer wrote every chunk."""
    error = MissingChunkError(
        f"the stored chunk {name} is missing: the data dir is damaged (its array was written with every chunk)"
    )
    error.chunk = name
    return error


# New arrays in a local folder name their chunks "c.0.0" (the "default" encoding with "." between coordinates), all
# in the array's folder: with "/" (Zarr's default) every chunk made a folder of its own ("c/0/0"), a directory inode
# and a mkdir per chunk, which cost a first compare (2 x 200 MB) about 0.15 s. Readers follow each zarr.json.
CHUNK_SEPARATOR = "."


def array_document(
    shape: tuple[int, ...],
    dtype: np.dtype[Any],
    chunks: tuple[int, ...],
    blosc: BloscSettings | None,
    attributes: dict[str, Any],
    separator: str = CHUNK_SEPARATOR,
) -> dict[str, Any] | None:
    """The zarr.json document of a new array of `dtype` (a numpy type of `_NUMPY_TYPES`) filled with zeros, in a
    regular grid of `chunks`, its chunks raw (`blosc` None) or Blosc-coded, named with `separator` between their
    coordinates; None for what `ArrayLayout` would not call `readable` (a 0-d array, another dtype): Zarr writes
    those."""
    if not shape or dtype.name not in _NUMPY_TYPES or dtype.byteorder not in ("=", "|"):
        return None
    fill: Any = False if dtype.kind == "b" else [0.0, 0.0] if dtype.kind == "c" else 0.0 if dtype.kind == "f" else 0
    data_bytes: dict[str, Any] = {"name": "bytes"}
    if dtype.itemsize > 1:
        data_bytes["configuration"] = {"endian": sys.byteorder}
    codecs: list[dict[str, Any]] = [data_bytes]
    if blosc is not None:
        configuration = {
            "typesize": blosc.typesize,
            "cname": blosc.cname,
            "clevel": blosc.clevel,
            "shuffle": blosc.shuffle,
            "blocksize": blosc.blocksize,
        }
        codecs.append({"name": "blosc", "configuration": configuration})
    return {
        "shape": list(shape),
        "data_type": dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(chunks)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": separator}},
        "fill_value": fill,
        "codecs": codecs,
        "attributes": attributes,
        "zarr_format": 3,
        "node_type": "array",
        "storage_transformers": [],
    }


def group_document() -> dict[str, Any]:
    """The zarr.json Zarr writes at every level above an array it creates that has none (an implicit group)."""
    return {"attributes": {}, "zarr_format": 3, "node_type": "group"}


def read_layout(folder: Path, key: str) -> ArrayLayout:
    """The layout of the array stored in `folder` (`key` names it in errors)."""
    path = folder / "zarr.json"
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"no array {key!r} in the store ({path} is missing)") from None
    except OSError as exc:
        raise ValueError(f"array {key!r}: {path} is not readable JSON ({exc})") from None
    return layout_of(text, str(path), key)


def layout_of(text: bytes, where: str, key: str) -> ArrayLayout:
    """The layout in `text`, the zarr.json at `where` (a file or an object) of the array `key`."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"array {key!r}: {where} is not readable JSON ({exc})") from None
    try:
        return parse_layout(document)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"array {key!r}: {where} is not Zarr v3 array metadata ({exc!r})") from None


def parse_layout(document: dict[str, Any]) -> ArrayLayout:
    """An `ArrayLayout` from a parsed zarr.json document (Zarr format 3, node type "array")."""
    if document.get("zarr_format") != 3 or document.get("node_type") != "array":
        raise ValueError("not a Zarr format 3 array")
    shape = tuple(int(d) for d in document["shape"])
    data_type = document["data_type"]
    dtype = np.dtype(data_type) if isinstance(data_type, str) and data_type in _NUMPY_TYPES else np.dtype("V1")
    grid = document["chunk_grid"]
    regular = _name(grid) == "regular"
    chunks = tuple(int(c) for c in grid["configuration"]["chunk_shape"]) if regular else shape
    encoding = document.get("chunk_key_encoding", {"name": "default"})
    v2_keys = _name(encoding) == "v2"
    separator = encoding.get("configuration", {}).get("separator", "." if v2_keys else "/")
    codecs = document.get("codecs", [])
    plain = regular and dtype.kind != "V" and not document.get("storage_transformers")
    blosc = _blosc(codecs, dtype) if plain else None
    raw = plain and len(codecs) == 1 and _native_bytes(codecs[0], dtype)
    return ArrayLayout(
        shape,
        dtype,
        chunks,
        separator,
        v2_keys,
        _fill_value(document["fill_value"], dtype),
        blosc,
        dict(document.get("attributes", {})),
        raw,
    )


def _name(entry: Any) -> str:
    return entry if isinstance(entry, str) else str(entry["name"])


def _blosc(codecs: list[Any], dtype: np.dtype[Any]) -> BloscSettings | None:
    """The Blosc settings where the codecs are exactly native-order bytes, then Blosc; else None."""
    if len(codecs) != 2 or not _native_bytes(codecs[0], dtype) or _name(codecs[1]) != "blosc":
        return None
    config = codecs[1].get("configuration", {}) if isinstance(codecs[1], dict) else {}
    shuffle = config.get("shuffle", "noshuffle")
    if shuffle not in ("noshuffle", "shuffle", "bitshuffle"):
        return None
    return BloscSettings(
        str(config.get("cname", "zstd")),
        int(config.get("clevel", 5)),
        shuffle,
        int(config.get("typesize") or dtype.itemsize),
        int(config.get("blocksize") or 0),
    )


def _native_bytes(codec: Any, dtype: np.dtype[Any]) -> bool:
    """Whether `codec` is the "bytes" codec in this machine's byte order (any order for one-byte values)."""
    if _name(codec) != "bytes":
        return False
    endian = codec.get("configuration", {}).get("endian") if isinstance(codec, dict) else None
    return dtype.itemsize == 1 or endian == sys.byteorder


def _fill_value(value: Any, dtype: np.dtype[Any]) -> Any:
    """The fill value as a numpy scalar of `dtype` (numbers, booleans and the spec's "NaN"/"Infinity" words)."""
    if dtype.kind == "V":
        return value
    if isinstance(value, str):
        if value in _FLOAT_WORDS:
            return np.asarray(_FLOAT_WORDS[value]).astype(dtype)[()]
        if value.startswith("0x"):  # the value's bytes, big-endian, as hex
            raw = int(value, 16).to_bytes(dtype.itemsize, "big")
            return np.frombuffer(raw, dtype=dtype.newbyteorder(">"))[0].astype(dtype)
        raise ValueError(f"fill value {value!r}")
    if isinstance(value, list):  # complex: [real, imaginary]
        real, imaginary = (_FLOAT_WORDS[v] if isinstance(v, str) else float(v) for v in value)
        return np.asarray(complex(real, imaginary)).astype(dtype)[()]
    return np.asarray(value).astype(dtype)[()]
