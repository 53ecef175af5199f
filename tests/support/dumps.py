"""Builders for test inputs: seeded tensors, dump folders and every archive kind."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path
from typing import Literal

import torch


def seeded(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def random_bits(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Every bit pattern is possible, NaN payloads included: the round trip must keep them all."""
    size = torch.empty((), dtype=dtype).element_size()
    numel = 1
    for d in shape:
        numel *= d
    raw = torch.randint(0, 256, (numel * size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))
    if dtype == torch.bool:
        return (raw % 2).to(torch.bool).reshape(shape)
    return raw.view(dtype).reshape(shape)


def make_zip(folder: Path, target: Path, prefix: str = "") -> Path:
    with zipfile.ZipFile(target, "w") as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.write(path, prefix + str(path.relative_to(folder)))
    return target


def make_tar(folder: Path, target: Path, mode: Literal["w", "w:gz", "w:bz2", "w:xz"] = "w", prefix: str = "") -> Path:
    with tarfile.open(target, mode) as archive:
        for path in sorted(folder.rglob("*")):
            if path.is_file():
                archive.add(path, prefix + str(path.relative_to(folder)))
    return target


def tar_with(target: Path, members: list[tarfile.TarInfo], data: bytes = b"x") -> Path:
    with tarfile.open(target, "w:gz") as archive:
        for info in members:
            if info.isfile():
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
            else:
                archive.addfile(info)
    return target


def named_dump(folder: Path, names: list[str], seed: int = 0) -> Path:
    """A folder of 4 x 4 seeded tensors, one `.pth` per name."""
    folder.mkdir(parents=True, exist_ok=True)
    for n, name in enumerate(names):
        torch.save(seeded((4, 4), seed + n), folder / f"{name}.pth")
    return folder


def layered_dump(
    folder: Path, bug_from: int | None, layers: int = 4, noise: float = 0.0, seed: int = 0, bug_to: int | None = None
) -> Path:
    """A run of `layers` layers, two stages each (`{layer}_attn.pth`, `{layer}_mlp.pth`, 8 x 16 float32, the same
    values for every seed's run); from layer `bug_from` on (up to `bug_to`, excluded) every tensor is 0.5 off, and
    every tensor carries uniform noise of `noise` (drawn from `seed`), as a rerun of nondeterministic kernels would."""
    folder.mkdir(parents=True)
    values = torch.Generator().manual_seed(0)
    jitter = torch.Generator().manual_seed(seed)
    for layer in range(layers):
        for stage in ("attn", "mlp"):
            tensor = torch.randn(8, 16, generator=values)
            if bug_from is not None and bug_from <= layer < (bug_to if bug_to is not None else layers):
                tensor = tensor + 0.5
            if noise:
                tensor = tensor + noise * (2 * torch.rand(8, 16, generator=jitter) - 1)
            torch.save(tensor, folder / f"{layer}_{stage}.pth")
    return folder
