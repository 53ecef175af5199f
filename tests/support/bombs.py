"""Archives that expand far beyond their size, built without compressing (or writing) what they expand to."""

from __future__ import annotations

import io
import struct
import zipfile
import zlib
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
