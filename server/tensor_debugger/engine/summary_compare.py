"""Verdicts of pairs known by their summaries (a capture with `values="summary"`), not by their elements.

A summary (`Sketch`, computed by `ingest/sketches.py` on the tensor's own device) keeps a tensor's shape and
dtype, a content hash of its bytes, its element count, NaN and Inf counts, and over its finite values the sum, the
sum of squares, the minimum and the maximum (float64), and the values at a fixed sample of positions (the same
positions for every tensor with as many elements: `sample_positions`).

Two summaries of the same shape compare on what they allow, with the pair's tolerance (|b - a| <= atol + rtol * |a|
per element, the rule full comparisons use):
- equal hashes: bit-identical (up to a 64-bit hash's collisions), a pass, but for a tensor holding a NaN;
- different NaN or Inf counts, or a NaN on either side: a divergence (a NaN is a mismatch, as full comparisons and
  torch.testing's default, equal_nan=False, hold: NaN against NaN too);
- the sampled elements: the largest |b - a| among them is a LOWER BOUND of the pair's max |diff|; one sampled
  element outside the tolerance is a divergence;
- the norms: |‖b‖ - ‖a‖| <= ‖b - a‖, and if every element were within tolerance, ‖b - a‖ <= atol·√n + rtol·‖a‖; so
  a relative norm difference |‖b‖ - ‖a‖| / ‖a‖ above rtol + atol·√n / ‖a‖ proves an element outside the tolerance;
- the means: likewise |mean b - mean a| <= atol + rtol·‖a‖/√n if every element were within tolerance.
Every failing check proves a divergence. Passing them all proves nothing about the elements not sampled: the
verdict is "no difference found in the summary", never a full pass.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import math
import textwrap
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from tensor_debugger.engine.metrics import json_number
from tensor_debugger.engine.op_alignment import Likeness
from tensor_debugger.engine.tolerances import Tolerance

SAMPLE_SIZE = 256  # elements a summary keeps the values of
SAMPLE_SEED = 0x5D_0C_CA_7E
_ROUNDING = 1e-12  # relative slack for float64 sums computed in a different order on each side


def sample_positions(numel: int, size: int = SAMPLE_SIZE) -> list[int]:
    """Flat indices a summary samples, ascending: every element of a tensor of at most `size`, else `size` (fewer
    where two draws coincide) chosen by a seeded hash of the draw's number (splitmix64 of SAMPLE_SEED + k, modulo
    `numel`); the same for every tensor of `numel`. In numpy's wrapping uint64 arithmetic: about 4 times faster than
    a Python loop (0.1 ms against 0.5 on a loaded machine), which ingest pays for every tensor it stores."""
    if numel <= size:
        return list(range(numel))
    return list(_drawn_positions(numel, size))


@functools.lru_cache(maxsize=1024)
def _drawn_positions(numel: int, size: int) -> tuple[int, ...]:
    """`sample_positions` of a tensor of more than `size` elements, drawn once per size (a model's tensors come in
    a few sizes, each met many times)."""
    with np.errstate(over="ignore"):
        x = np.arange(size, dtype=np.uint64) + np.uint64(SAMPLE_SEED + 0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    # the distinct draws, ascending: what np.unique gives, which imports numpy.ma (0.04 CPU s of a first compare)
    drawn = np.sort(x % np.uint64(numel))
    distinct = np.ones(drawn.size, dtype=bool)
    distinct[1:] = drawn[1:] != drawn[:-1]
    return tuple(drawn[distinct].tolist())


@dataclass(frozen=True)
class Sketch:
    """What a summary keeps of one tensor (see the module docstring)."""

    shape: tuple[int, ...]
    dtype: str
    hash: str  # "fold64:<hex>" of the dtype, the shape and the bytes
    numel: int
    count: int  # finite values
    sum: float
    sumsq: float
    min: float | None
    max: float | None
    nan: int
    inf: int
    sample: tuple[float, ...]  # the values at `sample_positions(numel)`, float64 (NaN and Inf kept)
    # a stored tensor's (ingest keeps both): its "fold64:<hex>" hash besides `hash`, its BLAKE3 digest, so that a
    # summary hashed with fold64 is compared with the hash of its own kind
    fold64: str | None = None

    def with_hash(self, kind: str) -> Sketch | None:
        """This summary with its hash of `kind` ("blake3", "fold64") as `hash`; None where it has none of it."""
        if self.hash.partition(":")[0] == kind:
            return self
        if kind == "fold64" and self.fold64 is not None:
            return dataclasses.replace(self, hash=self.fold64, fold64=None)
        return None

    @property
    def mean(self) -> float | None:
        return self.sum / self.count if self.count else None

    @property
    def std(self) -> float | None:
        if not self.count:
            return None
        mean = self.sum / self.count
        return math.sqrt(max(self.sumsq / self.count - mean * mean, 0.0))

    def to_json(self, compact: bool = False) -> dict[str, Any]:
        """The summary as JSON; `compact` writes the sample as one string ("sample_f64", `pack_sample`: 2.7 kB for 256
        values) in place of a list of numbers ("sample": 256 float objects, 8 kB held): a stored row's form, which
        ingest holds for every tensor of a run until its rows are written. `from_json` reads both."""
        if compact:
            return SketchJson({**self.head_json(), "sample_f64": pack_sample(self.sample)}, self)
        return {**self.head_json(), "sample": _json_numbers(self.sample)}

    def head_json(self) -> dict[str, Any]:
        """`to_json` without the sample."""
        return {
            "shape": list(self.shape),
            "dtype": self.dtype,
            "hash": self.hash,
            "numel": self.numel,
            "count": self.count,
            "sum": json_number(self.sum),
            "sumsq": json_number(self.sumsq),
            "min": None if self.min is None else json_number(self.min),
            "max": None if self.max is None else json_number(self.max),
            "nan": self.nan,
            "inf": self.inf,
            **({"fold64": self.fold64} if self.fold64 is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Sketch:
        """Raises ValueError (KeyError, TypeError) on a malformed summary."""
        if type(data) is SketchJson:  # made by `to_json` in this process, unchangeable since: its summary
            return data.sketch
        packed = data.get("sample_f64")  # a stored row's compact form; a capture's and older rows' list
        sample = unpack_sample(packed) if packed is not None else tuple(map(float, data["sample"]))
        number = float  # "nan", "inf" and "-inf" parse as floats
        numel = int(data["numel"])
        if len(sample) != len(sample_positions(numel)):
            raise ValueError(f"a summary of {numel} elements holds {len(sample)} sampled values")
        return cls(
            tuple(int(d) for d in data["shape"]),
            str(data["dtype"]),
            str(data["hash"]),
            numel,
            int(data["count"]),
            number(data["sum"]),
            number(data["sumsq"]),
            None if data.get("min") is None else number(data["min"]),
            None if data.get("max") is None else number(data["max"]),
            int(data["nan"]),
            int(data["inf"]),
            sample,
            None if data.get("fold64") is None else str(data["fold64"]),
        )


class SketchJson(dict[str, Any]):
    """`Sketch.to_json(compact=True)`: the JSON, read-only, holding the summary it was made from, so that
    `Sketch.from_json` of it in the same process gives that summary back without parsing it again (a summary capture
    makes hundreds into JSON as its block ends, and its run's rows read them back at once). Written by `json` as
    any dict; a copy (`dict(...)`, `copy`, pickle) is a plain dict."""

    __slots__ = ("sketch",)

    def __init__(self, data: dict[str, Any], sketch: Sketch) -> None:
        super().__init__(data)
        self.sketch = sketch

    def __reduce__(self) -> tuple[type[dict[str, Any]], tuple[dict[str, Any]]]:
        return dict, (dict(self),)

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a summary's JSON (SketchJson) is read-only: change a copy of it, dict(...)")

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = __ior__ = _read_only


def sketch_hashes(sketch: Sketch) -> frozenset[str]:
    """A summary's content hashes, each "<kind>:<hex>" (a stored tensor's BLAKE3 digest and its fold64 hash): equal
    hashes of one kind are bit-identical tensors (dtype, shape and bytes)."""
    return frozenset(h for h in (sketch.hash, sketch.fold64) if h is not None)


def pack_sample(values: tuple[float, ...] | NDArray[Any]) -> str:
    """Sampled values as one string: base64 of their little-endian float64 bytes (NaN, Inf and -0.0 kept bit for
    bit)."""
    return base64.b64encode(np.asarray(values, dtype="<f8").tobytes()).decode("ascii")


def unpack_sample(packed: Any) -> tuple[float, ...]:
    """`pack_sample`'s values back. Raises ValueError (TypeError) on a string that is not one."""
    if not isinstance(packed, str):
        raise TypeError(f"a packed sample is a string, not {type(packed).__name__}")
    raw = base64.b64decode(packed.encode("ascii"), validate=True)
    if len(raw) % 8:
        raise ValueError(f"a packed sample of {len(raw)} bytes is not of float64 values")
    return tuple(np.frombuffer(raw, dtype="<f8").tolist())


def _json_numbers(values: tuple[float, ...]) -> list[float | str]:
    """`json_number` of each value; at C speed where all are finite, as they mostly are."""
    if all(map(math.isfinite, values)):
        return list(values)
    return [json_number(v) for v in values]


@dataclass(frozen=True)
class SketchVerdict:
    """A summary comparison's outcome. `passed` False proves a divergence; True means no difference was found in
    the summary (`identical` when the hashes are equal)."""

    passed: bool
    identical: bool
    shapes_equal: bool
    reason: str  # in words, starting "from summaries: "
    sampled: int  # elements compared by value
    sampled_max_abs_diff: float | None  # a lower bound of the pair's max |diff|
    sampled_mismatched: int  # sampled elements outside the tolerance
    norm_a: float | None
    norm_b: float | None
    rel_norm_diff: float | None  # |‖b‖ - ‖a‖| / ‖a‖: a lower bound of the relative L2 error
    mean_shift: float | None  # |mean b - mean a|
    nan: tuple[int, int]
    inf: tuple[int, int]
    tolerance: str
    # whether the two hashes differ: None where they are of different kinds (a host's BLAKE3 against a device's
    # fold64, or shards' digests), which tells nothing of the bytes
    hashes_differ: bool | None = None

    def to_json(self) -> dict[str, Any]:
        def number(value: float | None) -> float | str | None:
            return None if value is None else json_number(value)

        return {
            "basis": "summary",
            "has_values": False,
            "passed": self.passed,
            "identical": self.identical,
            "shapes_equal": self.shapes_equal,
            "reason": self.reason,
            "sampled": self.sampled,
            "sampled_max_abs_diff": number(self.sampled_max_abs_diff),  # a lower bound
            "sampled_mismatched": self.sampled_mismatched,
            "norm_a": number(self.norm_a),
            "norm_b": number(self.norm_b),
            "rel_norm_diff": number(self.rel_norm_diff),
            "mean_shift": number(self.mean_shift),
            "nan": list(self.nan),
            "inf": list(self.inf),
            "tolerance": self.tolerance,
            "hashes_differ": self.hashes_differ,
        }


def _effective(tolerance: Tolerance) -> tuple[float, float]:
    """(rtol, atol) with bound(x) <= atol + rtol·|x| for every x: the pair's own, or for a ULP rule its bound at 1
    and at 0 (a spacing is at most eps·|x| above the normal range)."""
    if not tolerance.ulp:
        return tolerance.rtol, tolerance.atol
    at = tolerance.bound(np.array([0.0, 1.0]))
    return float(at[1]), float(at[0])


def compare_sketches(a: Sketch, b: Sketch, tolerance: Tolerance) -> SketchVerdict:
    """The verdict on two summaries, `a` the reference's (see the module docstring)."""
    described = tolerance.describe()
    counts = ((a.nan, b.nan), (a.inf, b.inf))
    if a.shape != b.shape:
        reason = f"from summaries: shapes differ ({list(a.shape)} vs {list(b.shape)})"
        return SketchVerdict(False, False, False, reason, 0, None, 0, None, None, None, None, *counts, described)
    # a NaN is a mismatch wherever it is, NaN against NaN too, as the pair's full values would be judged
    nans = f"{max(a.nan, b.nan)} NaN elements: a NaN is a mismatch, NaN against NaN too" if a.nan or b.nan else None
    if a.hash == b.hash and a.dtype == b.dtype:
        norm = math.sqrt(a.sumsq)
        reason = "from summaries: bit-identical (equal content hashes)"
        if nans is not None:
            sampled_nan = sum(1 for v in a.sample if math.isnan(v))
            reason += f", but {nans}"
            return SketchVerdict(
                False, True, True, reason, len(a.sample), math.inf if sampled_nan else 0.0, sampled_nan,
                norm, norm, 0.0, 0.0, *counts, described, False,
            )  # fmt: skip
        return SketchVerdict(
            True, True, True, reason, len(a.sample), 0.0, 0, norm, norm, 0.0, 0.0, *counts, described, False
        )
    hashes_differ = True if a.hash.partition(":")[0] == b.hash.partition(":")[0] else None
    xa = np.array(a.sample, dtype=np.float64)
    xb = np.array(b.sample, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(xb - xa)
        same_inf = np.isinf(xa) & (xa == xb)
        diff = np.where(same_inf, 0.0, diff)
        # a NaN on either side (NaN against NaN too) is a mismatch
        bad = np.isnan(diff) | (diff > tolerance.bound(np.abs(np.nan_to_num(xa, nan=0.0, posinf=0.0, neginf=0.0))))
    sampled_max = float(np.nanmax(np.where(np.isnan(diff), np.inf, diff))) if diff.size else None
    mismatched = int(np.count_nonzero(bad))
    norm_a, norm_b = math.sqrt(a.sumsq), math.sqrt(b.sumsq)
    rtol, atol = _effective(tolerance)
    finite = math.isfinite(norm_a) and math.isfinite(norm_b)
    rel = abs(norm_b - norm_a) / norm_a if finite and norm_a > 0 else (0.0 if norm_a == norm_b else math.inf)
    mean_a, mean_b = a.mean, b.mean
    shift = abs(mean_b - mean_a) if mean_a is not None and mean_b is not None else None
    n = max(a.count, 1)
    failures: list[str] = []
    if a.nan != b.nan or a.inf != b.inf:
        failures.append(f"NaN/Inf counts differ ({a.nan}/{a.inf} vs {b.nan}/{b.inf})")
    elif nans is not None:
        failures.append(nans)
    if mismatched:
        failures.append(f"{mismatched} of {diff.size} sampled elements outside {described}")
    if finite and abs(norm_b - norm_a) > (atol * math.sqrt(n) + rtol * norm_a) * (1 + _ROUNDING) + _ROUNDING * norm_a:
        failures.append(f"norms differ by {rel:.3g} relative, more than {described} allows")
    mean_bound = atol + rtol * norm_a / math.sqrt(n)
    if finite and shift is not None and shift > mean_bound * (1 + _ROUNDING) + _ROUNDING * norm_a / math.sqrt(n):
        failures.append(f"means differ by {shift:.3g}, more than {described} allows")
    if failures:
        reason = "from summaries: " + "; ".join(failures)
    else:
        reason = (
            f"from summaries: no difference found in the summary ({diff.size} sampled elements within {described}, "
            f"norms {rel:.3g} apart); not every element was compared"
        )
    kinds = (a.hash.partition(":")[0], b.hash.partition(":")[0])
    if hashes_differ is None and kinds[0] != kinds[1]:  # a blake3 summary (an older CPU capture's) against fold64
        reason += f"; the hashes are of different kinds ({kinds[0]} and {kinds[1]}): bit-identity is not checked"
    return SketchVerdict(
        not failures,
        False,
        True,
        reason,
        int(diff.size),
        sampled_max,
        mismatched,
        norm_a,
        norm_b,
        rel,
        shift,
        *counts,
        described,
        hashes_differ,
    )


def sketch_likeness(a: Sketch, b: Sketch, tolerance: Tolerance) -> Likeness:
    """What two summaries tell of their tensors' likeness, for pairing ops by content (`op_alignment.Likeness`):
    whether they agree (`compare_sketches` passes, or fails: proved different), and the relative distance of their
    sampled values, ‖b − a‖ / ‖a‖ over the positions where both are finite (None where none is, or the shapes
    differ)."""
    if a.hash == b.hash and a.dtype == b.dtype and a.shape == b.shape:
        return Likeness(True, 0.0)
    same = compare_sketches(a, b, tolerance).passed
    xa, xb = np.array(a.sample, dtype=np.float64), np.array(b.sample, dtype=np.float64)
    if a.shape != b.shape or xa.shape != xb.shape:
        return Likeness(same, None)
    finite = np.isfinite(xa) & np.isfinite(xb)
    if not finite.any():
        return Likeness(same, None)
    apart = float(np.linalg.norm(xb[finite] - xa[finite]))
    norm = float(np.linalg.norm(xa[finite]))
    return Likeness(same, apart / norm if norm > 0 else (0.0 if apart == 0 else math.inf))


@dataclass(frozen=True)
class NextCapture:
    """The capture that settles a divergence found from summaries: full values of the modules named, the model's
    class name left out (the glob `capture(modules=)` takes), ops included."""

    modules: tuple[str, ...]  # glob patterns: "model.layers.17.self_attn*"
    python: str  # the snippet to run, for the reference and the candidate

    def to_json(self) -> dict[str, Any]:
        return {"modules": list(self.modules), "values": "full", "level": "op", "python": self.python}


def module_pattern(module_path: str) -> str:
    """The `modules=` pattern of a tensor's module: `LlamaForCausalLM.model.layers.17.self_attn#2/softmax#1` ->
    "model.layers.17.self_attn*"; "*" for the model itself."""
    module = module_path.partition("/")[0].partition("#")[0]
    inner = module.partition(".")[2]
    return f"{inner}*" if inner else "*"


def next_capture(
    session: str,
    module_paths: list[str],
    *,
    arguments: str = "*inputs",
    runs: tuple[str, str] = ("reference (full)", "candidate (full)"),
    where: str = "",
    calls: tuple[str, ...] = (),
    divergent_call: str = "",
    against: tuple[str | None, str | None] = (None, None),
    given: str = "",
) -> NextCapture:
    """The second capture to run where a divergence was found from summaries at a tensor of the first of
    `module_paths` (the others: modules just before it, kept for their inputs). `arguments`: how each model is
    called on `inputs` ("*inputs", "**inputs" for keyword arguments, "inputs" for one); `runs`: the two runs' labels;
    `where`: more of capture()'s keywords, as Python (", data_dir='/data'"). `calls`: the model's calls the runs
    compared held, in order, where more than one (`Net`, `Net#2`, ...: generate's forwards, a loop of steps), and
    `divergent_call` the one the divergence is in: the snippet runs one forward of each model, and says so at its
    top, with what that means for the modules it names. `against`: the label of the run each new run is to be compared
    against (`capture(against=)`), None for the session's reference: where the run that diverged is compared against
    another run than the reference, the new candidate run is compared against its counterpart, not the reference.
    `given`: what the snippet's `inputs` (or `args` and `kwargs`) must hold, a comment at its top where not ""."""
    patterns = tuple(dict.fromkeys(module_pattern(m) for m in module_paths if m))
    modules = repr(patterns[0]) if len(patterns) == 1 else repr(list(patterns))
    lines = [_one_forward(calls, divergent_call, modules)] if len(calls) > 1 else []
    if given:
        lines.append("\n".join(textwrap.wrap(given, 116, initial_indent="# ", subsequent_indent="# ")))
    for model, run, other in zip(("reference", "candidate"), runs, against, strict=True):
        versus = f", against={other!r}" if other is not None else ""
        lines.append(
            f'with torch.no_grad(), capture({model}, session={session!r}, run={run!r}, values="full", level="op", '
            f"modules={modules}{where}{versus}):\n    {model}({arguments})"
        )
    return NextCapture(patterns, "import torch\nfrom tensor_debugger import capture\n\n" + "\n".join(lines))


def _one_forward(calls: tuple[str, ...], divergent_call: str, modules: str) -> str:
    """The comment that opens a next capture's snippet where the runs compared called the model more than once: the
    snippet's one forward is not what was captured."""
    first = calls[0]
    number = calls.index(divergent_call) + 1 if divergent_call in calls else None
    where = (
        f"its first call ({first}): one forward on that call's inputs records it"
        if number == 1
        else f"its call {number} ({divergent_call})"
        if number is not None
        else "a call not known"
    )
    text = (
        f"The runs compared called the model {len(calls)} times ({', '.join(calls)}: generate's forwards, a loop of "
        f"steps); the first divergence is in {where}. This snippet runs ONE forward of each model on `inputs`: the "
        f"tensors of modules={modules} it records are named as the first call's ({first}...), and hold the values of "
        f"a later call only where `inputs` (and the model's state, a cache) are that call's. To record every call "
        f"again, put the code that made them (the same generate or loop) in each block in place of the one call."
    )
    return "\n".join(textwrap.wrap(text, 116, initial_indent="# ", subsequent_indent="# "))
