"""Numerics at the edges through `tensor-debugger compare --json` on files saved by torch: infinities, float64 past
the range of its squares, 64-bit integers past float64's precision, and float8's default tolerance as the README
states it, against torch.testing.assert_close."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from tensor_debugger.engine.tolerances import default_tolerance

from tests.support.cli_main import main_cli

README = Path(__file__).resolve().parents[2] / "README.md"
INF = float("inf")
FLOAT8 = ["float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz"]


def compare(root: Path, pairs: dict[str, tuple[torch.Tensor, torch.Tensor]], *options: str) -> tuple[int, list[Any]]:
    """Each (reference, candidate) saved as `<n>_<name>.pth` in two run folders, compared by the CLI: its exit code and
    its pairs in the order given."""
    ref, cand = root / "ref", root / "cand"
    ref.mkdir(exist_ok=True)
    cand.mkdir(exist_ok=True)
    for n, (name, (a, b)) in enumerate(pairs.items()):
        torch.save(a, ref / f"{n}_{name}.pth")
        torch.save(b, cand / f"{n}_{name}.pth")
    done = main_cli("--data-dir", str(root / "data"), "compare", str(ref), str(cand), "--json", *options)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    found = {p["stage"]: p for p in json.loads(done.stdout)["pairs"]}
    return done.returncode, [found[name] for name in pairs]


@pytest.mark.parametrize("options", [(), ("--ulp", "1"), ("--rtol", "0", "--atol", "0")])
def test_identical_tensors_holding_infinities_pass(tmp_path: Path, options: tuple[str, ...]) -> None:
    values = torch.tensor([[1.5, INF, -INF, 0.0], [-INF, -2.0, INF, 3.0]])
    dtypes = ("float32", "float16", "bfloat16", "float64")
    pairs = {d: (values.to(getattr(torch, d)), values.to(getattr(torch, d)).clone()) for d in dtypes}
    for a, b in pairs.values():
        torch.testing.assert_close(b, a, rtol=0, atol=0)  # torch: equal
    code, found = compare(tmp_path, pairs, *options)
    assert code == 0 and [p["status"] for p in found] == ["pass"] * 4
    assert all(p["stats"]["max_abs_diff"] == 0 and (p["stats"]["inf_a"], p["stats"]["inf_b"]) == (4, 4) for p in found)


def test_an_infinity_of_the_other_sign_fails(tmp_path: Path) -> None:
    a = torch.tensor([1.0, INF, -INF])
    code, (found,) = compare(tmp_path, {"x": (a, torch.tensor([1.0, -INF, -INF]))}, "--ulp", "1")
    assert code == 1 and found["status"] == "fail" and found["stats"]["mismatched"] == 1


@pytest.mark.parametrize("scale", [1e200, 1e-200])
def test_float64_cosine_at_any_magnitude(tmp_path: Path, scale: float) -> None:
    """x against -x is exactly -1, orthogonal tensors exactly 0, a near copy just under 1: values whose squares
    overflow (1e200) or underflow (1e-200) float64."""
    x = torch.randn(64, 33, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * scale
    even, odd = x.clone(), x.clone()
    even[:, 1::2], odd[:, ::2] = 0.0, 0.0
    near = x * (1 + 1e-6 * torch.randn(x.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(4)))
    _, found = compare(tmp_path, {"opposite": (x, -x), "orthogonal": (even, odd), "near": (x, near)})
    opposite, orthogonal, close = (p["stats"]["cosine"] for p in found)
    assert (opposite, orthogonal) == (-1.0, 0.0)
    unscaled = torch.nn.functional.cosine_similarity((x / scale).flatten(), (near / scale).flatten(), dim=0)
    assert close == pytest.approx(float(unscaled), abs=1e-12) and 0.999 < close < 1.0


def test_64_bit_integers_differ_exactly(tmp_path: Path) -> None:
    """int64 near 2**62 and uint64 past 2**63 differing by one at one index fail with max |diff| the JSON integer 1
    at that index and the exact values; int32 and int8 as before, their differences integers too."""
    big = torch.full((6, 7), 2**62 + 3, dtype=torch.int64)
    big_b = big.clone()
    big_b[4, 5] += 1
    unsigned = np.full((6, 7), 2**63 + 1000, dtype=np.uint64)
    unsigned_b = unsigned.copy()
    unsigned_b[1, 2] -= 1
    small = torch.arange(42, dtype=torch.int32).reshape(6, 7)
    small_b = small.clone()
    small_b[2, 3] += 5
    tiny = torch.arange(42, dtype=torch.int8).reshape(6, 7)
    tiny_b = tiny.clone()
    tiny_b[0, 6] -= 2
    pairs = {
        "int64": (big, big_b),
        "uint64": (torch.from_numpy(unsigned), torch.from_numpy(unsigned_b)),
        "int32": (small, small_b),
        "int8": (tiny, tiny_b),
    }
    code, found = compare(tmp_path, pairs)
    assert code == 1 and [p["status"] for p in found] == ["fail"] * 4
    want = [
        ([4, 5], 2**62 + 3, 2**62 + 4, 1),
        ([1, 2], 2**63 + 1000, 2**63 + 999, 1),
        ([2, 3], 17, 22, 5),
        ([0, 6], 6, 4, 2),
    ]
    raw = json.dumps([p["stats"] for p in found])
    assert '"max_abs_diff": 1,' in raw and "e+18" not in raw  # integers in the JSON text, not floats
    for pair, (index, a, b, diff) in zip(found, want, strict=True):
        stats = pair["stats"]
        assert stats["max_abs_diff"] == diff and type(stats["max_abs_diff"]) is int, pair["stage"]
        assert stats["argmax"] == index and stats["mismatched"] == 1
        assert stats["worst"] == [{"index": index, "a": a, "b": b, "abs_diff": diff}]


def test_the_readme_states_each_float8_default_the_code_uses() -> None:
    text = " ".join(README.read_text().split())
    stated: dict[str, tuple[float, float]] = {}
    for first, second, rtol, atol in re.findall(
        r"(float8_\w+)(?: and (float8_\w+))?: rtol ([\d.e-]+), atol ([\d.e-]+)", text
    ):
        for name in filter(None, (first, second)):
            stated[name] = (float(rtol), float(atol))
    assert set(stated) >= set(FLOAT8)
    for name, (rtol, atol) in stated.items():
        tolerance = default_tolerance(name, name)
        assert (tolerance.rtol, tolerance.atol) == (rtol, atol), name


def neighbours(values: torch.Tensor, steps: int) -> torch.Tensor:
    """Each float8 value `steps` representable values further from zero (one more in its bits per step)."""
    return (values.view(torch.uint8) + steps).view(values.dtype)


@pytest.mark.parametrize("name", FLOAT8)
def test_float8_default_tolerance_is_the_readme_rule_as_torch_testing_applies_it(tmp_path: Path, name: str) -> None:
    """Identical float8 tensors pass, as torch.testing's bit-for-bit default has it; neighbours at normal magnitude
    pass, two steps fail, and among subnormals each verdict is torch.testing.assert_close's with the README's rtol
    and atol on the values widened to float32 (torch takes no tolerance for float8 itself)."""
    dtype = getattr(torch, name)
    info = torch.finfo(dtype)
    normal = torch.tensor([1.0, 1.75, -3.0, 0.5, 12.0, -0.0625]).to(dtype)
    subnormal = torch.tensor([info.smallest_normal * s for s in (0.25, 0.5, 0.75)]).to(dtype)
    pairs = {
        "same": (normal, normal.clone()),
        "one_step": (normal, neighbours(normal, 1)),
        "two_steps": (normal, neighbours(normal, 2)),
        "subnormal_step": (subnormal, neighbours(subnormal, 1)),
    }
    torch.testing.assert_close(normal.clone(), normal)  # torch's default for float8: bit for bit
    readme_rtol, readme_atol = (0.125, 1e-3) if "e4m3" in name else (0.25, 1e-3)
    tolerance = default_tolerance(name, name)
    assert (tolerance.rtol, tolerance.atol) == (readme_rtol, readme_atol)
    want = []
    for a, b in pairs.values():
        try:
            torch.testing.assert_close(b.float(), a.float(), rtol=readme_rtol, atol=readme_atol)
            want.append("pass")
        except AssertionError:
            want.append("fail")
    assert want[:3] == ["pass", "pass", "fail"]
    _, found = compare(tmp_path, pairs)
    assert [p["status"] for p in found] == want
