"""Files that lie about themselves, written here byte by byte from ones numpy, safetensors and torch saved, given to
the CLI: each is a failed input named with its reason, one line per file, exit status 2 and no traceback, whatever
the reader raised (each file alone through `main(argv)` in this process, where an exception that escaped would fail
the test too). Beside a good file, as a process: the good one is stored, each other named, and `compare` of them
exits 2 (an input failed)."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from numpy.typing import NDArray
from safetensors.torch import save_file

from tests.support.cli_main import main_cli
from tests.support.servers import run_cli


def lying_npy(folder: Path) -> Path:
    """A .npy whose header says 999 values where 16 follow."""
    path = folder / "lying.npy"
    np.save(path, np.arange(16, dtype=np.float32))
    data = path.read_bytes()
    length = struct.unpack("<H", data[8:10])[0]
    header = data[10 : 10 + length].decode("latin1").replace("(16,)", "(999,)")
    path.write_bytes(data[:10] + header[: length - 1].ljust(length - 1).encode("latin1") + b"\n" + data[10 + length :])
    return path


def offset_past_the_end(folder: Path) -> Path:
    """A safetensors file whose header puts its tensor's bytes past the end of the file."""
    path = folder / "past.safetensors"
    save_file({"w": torch.zeros(4)}, str(path))
    data = path.read_bytes()
    length = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8 : 8 + length])
    header["w"]["data_offsets"] = [1000, 1016]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length :])
    return path


def missing_storage(folder: Path) -> Path:
    """A torch.save file whose data.pkl names a storage its archive no longer holds."""
    saved = folder / "saved.pth"
    torch.save({"w": torch.arange(4.0)}, saved)
    path = folder / "missing.pth"
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(path, "w") as target:
        for info in source.infolist():
            if not info.filename.endswith("/data/0"):
                target.writestr(info, source.read(info))
    saved.unlink()
    return path


def damaged_member(folder: Path) -> Path:
    """A zip whose deflated .npy member is cut and overwritten mid-stream (its directory intact)."""
    path = folder / "damaged.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("big.npy", _npy_bytes(np.random.default_rng(0).random(5000, dtype=np.float32)))
    with zipfile.ZipFile(path) as archive:
        info = archive.infolist()[0]
    data = bytearray(path.read_bytes())
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)
    middle = start + info.compress_size // 2
    data[middle : middle + 200] = bytes(200)
    path.write_bytes(bytes(data))
    return path


def _npy_bytes(array: NDArray[Any]) -> bytes:
    import io

    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


HOSTILE = {
    "lying.npy": (lying_npy, "truncated: 3996 bytes of data expected"),
    "past.safetensors": (offset_past_the_end, "invalid offset"),
    # its zip directory reads: the words say the contents are wrong, not that it was cut short
    "missing.pth": (missing_storage, "whose contents are damaged or inconsistent (ValueError: storage 0 is missing"),
    "damaged.zip/big.npy": (damaged_member, "could not be read"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_file_is_a_failed_input_named_with_its_reason(tmp_path: Path, name: str) -> None:
    make, reason = HOSTILE[name]
    path = make(tmp_path)
    done = main_cli("--data-dir", str(tmp_path / "data"), "ingest", "--session", "s", "--run", "r", str(path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("  ")]
    assert f"{tmp_path}/{name}:" in line and reason in line, done.stderr


def test_hostile_files_beside_a_good_one(tmp_path: Path) -> None:
    """`ingest` stores the good file and names each other with its reason (exit 0: stored, with problems);
    `compare` of that folder against the good file alone is INCOMPLETE, exit 2, each file named once."""
    folder = tmp_path / "reference"
    folder.mkdir()
    good = folder / "good.npy"
    np.save(good, np.ones(3, dtype=np.float32))
    for make, _ in HOSTILE.values():
        make(folder)
    data = str(tmp_path / "data")
    done = run_cli("--data-dir", data, "ingest", "--session", "s", "--run", "r", *map(str, sorted(folder.iterdir())))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    for name, (_, reason) in HOSTILE.items():
        [line] = [line for line in done.stdout.splitlines() if f"{folder}/{name}:" in line]
        assert line.strip().startswith("problem: ") and reason in line, done.stdout
    candidate = tmp_path / "candidate.npy"
    np.save(candidate, np.ones(3, dtype=np.float32))
    compared = run_cli("--data-dir", data, "compare", str(folder), str(candidate))
    assert compared.returncode == 2, compared.stdout + compared.stderr
    assert "Traceback" not in compared.stderr, compared.stderr
    for name, (_, reason) in HOSTILE.items():
        assert reason in compared.stdout + compared.stderr, (name, compared.stdout + compared.stderr)
