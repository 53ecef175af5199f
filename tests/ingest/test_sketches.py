"""A CPU tensor's summary (`ingest/sketches.sketch`) is made from one C-order copy of a tensor that is not contiguous,
hashed on one thread, and sampled through a cached index; it must be bit for bit the summary computed the plain
way, for every dtype family and layout. A summary capture reuses a summary only for a tensor unchanged since."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from tensor_debugger import capture
from tensor_debugger.engine.fused import Kernel
from tensor_debugger.engine.summary_compare import Sketch, sample_positions
from tensor_debugger.ingest.sketches import sketch
from tensor_debugger.ingest.stored_sketches import sampled_values
from tensor_debugger.ingest.summary import SummaryAccumulator
from tensor_debugger.ingest.writer import DIGEST_ALGORITHM, new_hasher
from tensor_debugger.settings import Settings
from tensor_debugger.store.dtypes import from_torch, torch_to_storage
from torch import nn


def plain_sketch(t: torch.Tensor) -> Sketch:
    """The summary as computed before: torch's own copies (one per use), blake3 on its own threads, positions
    drawn afresh."""
    logical = from_torch(t.dtype)
    totals = SummaryAccumulator()
    array = torch_to_storage(t)
    if array.size:
        totals.add_stored(array.reshape(-1), logical, Kernel())
    count, mean = totals.count, totals.mean
    flat = t.reshape(-1)
    positions = sample_positions(flat.numel())
    values = sampled_values(array.reshape(-1)[positions], logical) if positions else []
    hasher = new_hasher(logical, tuple(t.shape))
    stored = torch_to_storage(t)
    hasher.update(stored.reshape(-1).view("uint8") if stored.size else b"")
    return Sketch(
        tuple(t.shape),
        str(t.dtype).removeprefix("torch."),
        f"{DIGEST_ALGORITHM}:{hasher.hexdigest()}",
        flat.numel(),
        count,
        mean * count if count else 0.0,
        totals.m2 + count * mean * mean if count else 0.0,
        float(totals.lo) if count else None,
        float(totals.hi) if count else None,
        totals.nan,
        totals.inf,
        tuple(float(v) for v in values),
    )


DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
]
LAYOUTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "contiguous": lambda x: x,
    "transposed": lambda x: x.transpose(0, 2),
    "split": lambda x: x[:, :, 5:10],  # as torch.split makes it
    "strided": lambda x: x[:, 1:, ::3],
    "expanded": lambda x: x[:1].expand(4, *x.shape[1:]),
    "one element": lambda x: x[1, 2, 3],
    "empty": lambda x: x[:, :0],
}


def values(dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(3, 40, 17, generator=torch.Generator().manual_seed(3)) * 20
    if dtype.is_floating_point:
        x[0, 3, 4], x[1, 5, 6], x[2, 7, 8] = float("nan"), float("inf"), float("-inf")
    elif dtype == torch.uint8:
        x = x.abs()
    return x.to(dtype)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_summary_is_bit_identical_to_the_plain_computation(dtype: torch.dtype, layout: str) -> None:
    t = LAYOUTS[layout](values(dtype))
    assert sketch(t).to_json() == plain_sketch(t).to_json()  # floats compared exactly; NaN as "nan"
    assert sketch(t).to_json() == sketch(t.contiguous()).to_json()  # the layout never matters


def test_nan_and_inf_among_many_elements_are_counted_and_sampled_as_before() -> None:
    t = torch.randn(64, 1024, generator=torch.Generator().manual_seed(5)).t()  # not contiguous, > 256 elements
    t[::7, ::5] = float("nan")
    t[3, :] = float("inf")
    ours, plain = sketch(t), plain_sketch(t)
    assert ours.to_json() == plain.to_json()
    assert (ours.nan, ours.inf) == (int(torch.isnan(t).sum()), int(torch.isinf(t).sum()))


class Doubler(nn.Module):
    """Changes its input in place and returns it: the same tensor object as its input, with new values."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return x


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.twice = Doubler()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        z = self.twice(y)  # z is y
        z.view(-1)[0] = 1000.0  # through a view: the version counter is shared
        out: torch.Tensor = z + 0
        return out


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_tensor_changed_in_place_is_summarised_again(settings: Settings, mode: str) -> None:
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = model.lin(x)
    context: Any = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with (
        context,
        capture(model, "s", mode, data_dir=settings.data_dir, level="op", values="summary") as result,
    ):
        model(x)
    s = result.summaries
    assert s["Net.lin_outputs"] == sketch(y, "fold64")
    assert s["Net.twice_inputs_args_0"] == sketch(y, "fold64")  # the same tensor, unchanged: the same summary
    assert s["Net.twice/mul_#1_outputs"] == sketch(y * 2, "fold64")  # changed in place: summarised again
    assert s["Net.twice_outputs"] == sketch(y * 2, "fold64")
    changed = y * 2
    changed.view(-1)[0] = 1000.0
    assert s["Net_outputs"] == sketch(changed, "fold64")


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz])
def test_a_float8_fnuz_nan_is_sampled_as_a_nan_without_a_warning(dtype: torch.dtype) -> None:
    """torch widens the "fnuz" NaN (bits 0x80) to a signalling NaN, whose cast to float64 raised numpy's "invalid
    value encountered in cast" on every such tensor ingested: it is sampled as a NaN, silently."""
    every = torch.arange(256, dtype=torch.uint8).view(dtype)
    values = sampled_values(torch_to_storage(every), from_torch(dtype))
    assert [i for i, v in enumerate(values) if v != v] == [0x80]
    assert sketch(every).nan == 1
