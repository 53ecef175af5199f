"""Archives that expand far beyond their size, built without compressing (or writing) what they expand to."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

MiB = 1 << 20


def zeros_zip(member: str, mebibytes: int) -> bytes:
    """A valid zip of one deflated member of `mebibytes` MiB of zeros (under 4 GiB), built from one compressed MiB
    repeated: after a full flush, deflate refers to nothing before it, so the copies chain into one stream."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    piece = compressor.compress(bytes(MiB)) + compressor.flush(zlib.Z_FULL_FLUSH)
    data = piece * mebibytes + zlib.compressobj(9, zlib.DEFLATED, -15).flush()  # + the empty final block
    crc = 0
    zero = bytes(MiB)
    for _ in range(mebibytes):
        crc = zlib.crc32(zero, crc)
    size = mebibytes * MiB
    name = member.encode()
    fields = (20, 0, 8, 0, 0x21, crc, len(data), size, len(name), 0)  # version, flags, deflate, time, date, ...
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, *fields) + name
    central = struct.pack("<IH", 0x02014B50, 20) + struct.pack("<HHHHHIIIHHHHHII", *fields, 0, 0, 0, 0, 0) + name
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), len(local) + len(data), 0)
    return local + data + central + end


def nested_zip_bomb(path: Path, inner: int = 8, mebibytes: int = 1024) -> Path:
    """A zip of `inner` zips, each expanding to `mebibytes` MiB of zeros (the defaults: about 16 KB expanding to
    8 GiB). Returns `path`."""
    one = zeros_zip("zeros.pth", mebibytes)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as outer:
        for i in range(inner):
            outer.writestr(f"inner{i}.zip", one)
    path.write_bytes(buffer.getvalue())
    return path


def laughs_pickle(levels: int = 40) -> bytes:
    """A pickle of `levels` nested lists, each holding the one below twice (`x = [x, x]`, by the memo): a few hundred
    bytes that unpickle to `levels + 1` small lists and are a tree of 2^(levels+1) - 1 lists to a walk that follows
    each reference ("billion laughs")."""
    out = bytearray(b"\x80\x02]q\x00")  # protocol 2; an empty list, memo 0
    for i in range(levels):  # a new list; MARK, memo i, memo i, APPENDS; memo i + 1
        out += b"](h" + bytes([i]) + b"h" + bytes([i]) + b"eq" + bytes([i + 1])
    return bytes(out + b".")


def hashed_laughs_pickle(levels: int = 40) -> bytes:
    """A pickle of a dict whose one key is `levels` nested tuples, each holding the one below twice: unpickling it
    hashes the key, which takes 2^levels steps (a tuple's hash is not kept)."""
    out = bytearray(b"\x80\x02})q\x000")  # protocol 2; the dict; an empty tuple, memo 0, popped
    for i in range(levels):  # memo i twice, TUPLE2; memo i + 1; popped
        out += b"h" + bytes([i]) + b"h" + bytes([i]) + b"\x86q" + bytes([i + 1]) + b"0"
    return bytes(out + b"h" + bytes([levels]) + b"K\x01s.")  # the key, the value 1; SETITEM


def laughs_pth(path: Path, legacy: bool = False, levels: int = 40, bomb: bytes | None = None) -> Path:
    """A PyTorch file whose object is `bomb` (by default `laughs_pickle(levels)`): torch.save's zip format with its
    data.pkl replaced, or (`legacy`) the pre-1.6 format (`_use_new_zipfile_serialization=False`: magic, protocol
    and system pickles, the object's pickle, then the pickle of its storages' keys, none here) with the object's
    pickle replaced.
    Returns `path`."""
    import pickle

    import torch

    bomb = laughs_pickle(levels) if bomb is None else bomb
    buffer = io.BytesIO()
    torch.save([], buffer, _use_new_zipfile_serialization=not legacy)
    if legacy:
        empty = pickle.dumps([], protocol=2)
        saved = buffer.getvalue()
        assert saved.endswith(empty + empty), "the legacy format ends with the object's pickle and its keys'"
        path.write_bytes(saved[: -2 * len(empty)] + bomb + empty)
        return path
    buffer.seek(0)
    out = io.BytesIO()
    with zipfile.ZipFile(buffer) as saved_zip, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as bombed:
        for info in saved_zip.infolist():
            data = bomb if info.filename.endswith("/data.pkl") else saved_zip.read(info)
            bombed.writestr(info, data)
    path.write_bytes(out.getvalue())
    return path


def oversized_legacy_pth(path: Path, numel: int = 1 << 30) -> Path:
    """A legacy-format PyTorch file (`_use_new_zipfile_serialization=False`) of a few hundred bytes whose one float32
    storage says it holds `numel` elements (4 GiB by default): torch.load allocates that much before it reads the
    storage's bytes (and finds 12). Returns `path`."""
    import torch

    buffer = io.BytesIO()
    torch.save(torch.zeros(3), buffer, _use_new_zipfile_serialization=False)
    saved = buffer.getvalue()
    declared = b"K\x03"  # BININT1 3: the storage's element count, in its persistent id, before the tensor's size
    at = saved.index(b"cpuq", 0) + 5  # the location 'cpu', memoized (BINPUT n), then the count
    assert saved[at : at + 2] == declared, saved[at - 8 : at + 8]
    path.write_bytes(saved[:at] + b"J" + struct.pack("<i", numel) + saved[at + 2 :])
    return path


def fortran_zeros_zip(path: Path, mebibytes: int) -> Path:
    """A zip of one deflated Fortran-order .npy, `zeros.npy`, of `mebibytes` MiB of float32 zeros (shape
    (256 * mebibytes, 1024)), built from one compressed MiB repeated as `zeros_zip` does: 900 MiB take 0.9 MB.
    Returns `path`."""
    import numpy as np

    rows = 256 * mebibytes
    header_buffer = io.BytesIO()
    write_header: Callable[..., None] = np.lib.format.write_array_header_1_0  # typed from numpy 2.1
    write_header(header_buffer, {"descr": "<f4", "fortran_order": True, "shape": (rows, 1024)})
    header = header_buffer.getvalue()
    compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = compressor.compress(header) + compressor.flush(zlib.Z_FULL_FLUSH)
    piece_compressor = zlib.compressobj(9, zlib.DEFLATED, -15)
    piece = piece_compressor.compress(bytes(MiB)) + piece_compressor.flush(zlib.Z_FULL_FLUSH)
    data = head + piece * mebibytes + zlib.compressobj(9, zlib.DEFLATED, -15).flush()
    crc = zlib.crc32(header)
    zero = bytes(MiB)
    for _ in range(mebibytes):
        crc = zlib.crc32(zero, crc)
    size = len(header) + mebibytes * MiB
    name = b"zeros.npy"
    fields = (20, 0, 8, 0, 0x21, crc, len(data), size, len(name), 0)
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, *fields) + name
    central = struct.pack("<IH", 0x02014B50, 20) + struct.pack("<HHHHHIIIHHHHHII", *fields, 0, 0, 0, 0, 0) + name
    end = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 1, 1, len(central), len(local) + len(data), 0)
    path.write_bytes(local + data + central + end)
    return path
