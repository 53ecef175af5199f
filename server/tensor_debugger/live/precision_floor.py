"""The precision floor of `find_divergence`: where the candidate computes in a lower floating precision than the
reference (a float16 or bfloat16 port of a float32 model), a copy of the reference converted to the candidate's dtype,
run on the same inputs (their floating tensors cast to that dtype), is the noise floor of every pair, as a rerun of
the reference is for `compare --noise`: it is stored in the session as its rerun (role "noise": run "noise", its
summaries, and where a divergence is found "noise (full)", its full values, compared against "reference (full)"),
and every pair is judged by the session's noise rule (compare/reports/noise.py), here as the session's reports judge
it: a pair passes when the candidate's error is within NOISE_FACTOR times the floor's at that tensor, and fails when
it is more (where the floor is zero there, the tolerances judge). Rounding to the lower precision alone then names no
culprit; a bug that adds more than that does.

From summaries the errors compared are lower bounds (`summary_noise_verdict`: the largest |diff| among the sampled
elements, and the relative norm difference), the verdict's words saying so. From full values, each max |diff|. A NaN,
an Inf count that differs, or shapes that differ, are never within the floor.

The cost: a copy of the reference's parameters and buffers in the candidate's dtype, its forward passes (one with
summaries, and where a divergence is found one with the full values of the modules wanted), and its runs stored.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from tensor_debugger.compare.reports.noise import NOISE_FACTOR, noise_judges, summary_noise_verdict
from tensor_debugger.compare.reports.summary_reports import summary_report
from tensor_debugger.engine.lowered import least_precise
from tensor_debugger.engine.summary_compare import SketchVerdict
from tensor_debugger.live.capture_names import call_path, module_of

NOISE = NOISE_FACTOR  # a session's noise factor as find_divergence makes it (the default; no user sets another)


@dataclass(frozen=True)
class Floor:
    """The reference converted to the candidate's dtype, and how to call it on the inputs cast likewise."""

    model: torch.nn.Module
    call: Callable[[torch.nn.Module], Any]
    dtype: str  # "float16", "bfloat16"
    reference_dtype: str  # "float32"
    # True where the candidate's parameters are the reference's dtype but it computes parts in `dtype` under
    # torch.autocast: the floor is then the reference itself run under autocast to `dtype` (`autocast_floor`)
    autocast: bool = False
    # with `autocast`: the reference's modules whose forward runs under it (`autocast_region`); () for all of it
    region: tuple[str, ...] = ()


def autocast_floor(
    reference: torch.nn.Module,
    call: Callable[[torch.nn.Module], Any],
    lower: torch.dtype,
    reference_dtype: str,
    region: Region | None = None,
) -> Floor:
    """The precision floor of a candidate that computes parts of its forward in `lower` under torch.autocast (a
    bfloat16 region in a float32 port): the reference itself, called as `call` calls it but with autocast to
    `lower` on its parameters' device inside the forward of each of its submodules in `region` (where the candidate
    computes in `lower`: `autocast_region`), or around the whole call where there is none. Ops autocast leaves in
    float32 stay so; the ones it lowers round as the candidate's region does. Outside the region the floor is the
    reference's own values, so a difference there is judged by the tolerances, not passed as rounding."""
    device = next(itertools.chain(reference.parameters(), reference.buffers()), torch.empty(0)).device.type
    modules = [] if region is None else [(reference.get_submodule(p), p in region.kept_lower) for p in region.paths]
    raised_to = getattr(torch, reference_dtype)

    def under_autocast(model: torch.nn.Module) -> Any:
        if not modules:
            with torch.autocast(device, dtype=lower):
                return call(model)
        with contextlib.ExitStack() as restore:
            for module, kept in modules:
                restore.enter_context(_forward_under_autocast(module, device, lower, None if kept else raised_to))
            return call(model)

    return Floor(
        reference,
        under_autocast,
        str(lower).removeprefix("torch."),
        reference_dtype,
        autocast=True,
        region=() if region is None else region.paths,
    )


@dataclass(frozen=True)
class Region:
    """The reference's modules whose forward the autocast floor runs under autocast (paths inside the model, without
    its class name), and those of them whose outputs stay in the lower dtype (those inside another of them); the
    others' are cast back to the reference's dtype, as the candidate's region ends (`.float()` before a float32
    layer, or float32 code promoting them)."""

    paths: tuple[str, ...]
    kept_lower: frozenset[str]


@contextlib.contextmanager
def _forward_under_autocast(
    module: torch.nn.Module, device: str, lower: torch.dtype, raised_to: torch.dtype | None
) -> Iterator[None]:
    """Within the block, `module`'s forward runs under autocast to `lower` (its hooks, a capture's included, run
    outside it, as they run outside a region the module's caller opens), its outputs in `lower` cast to `raised_to`
    where that is given."""
    forward = module.forward
    had_own = "forward" in vars(module)

    @functools.wraps(forward)  # its signature read through `__wrapped__`: the inputs keep their names
    def lowered_forward(*args: Any, **kwargs: Any) -> Any:
        with torch.autocast(device, dtype=lower):
            out = forward(*args, **kwargs)
        return out if raised_to is None else _raised(out, lower, raised_to)

    module.forward = lowered_forward
    try:
        yield
    finally:
        if had_own:
            module.forward = forward
        else:
            del module.forward


def _raised(value: Any, lower: torch.dtype, dtype: torch.dtype) -> Any:
    """`value` with each tensor in `lower` in it (in tuples, lists and dicts, however nested) cast to `dtype`."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.dtype == lower else value
    if type(value) in (tuple, list):
        return type(value)(_raised(v, lower, dtype) for v in value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*(_raised(v, lower, dtype) for v in value))
    if type(value) is dict:
        return {k: _raised(v, lower, dtype) for k, v in value.items()}
    if isinstance(value, dict):  # a dict of its own class (transformers' ModelOutput): its values set in place
        for k, v in list(value.items()):
            value[k] = _raised(v, lower, dtype)
    return value


def autocast_region(lowered: Iterable[str], reference: torch.nn.Module) -> Region | None:
    """Where the autocast floor runs the reference under autocast, from the candidate's tensors `lowered` (its
    names, in a dtype the reference does not compute in there): the module calls of its ops' outputs (their paths
    inside the model, without its class name), those inside another of them keeping their outputs in it. None
    (the whole forward) where the candidate recorded no op there (module capture: its own code between the modules
    is not seen), or where one of them is the model itself or names no submodule of the reference (a port whose
    modules are named otherwise)."""
    names = list(lowered)
    ops = [n for n in names if "/" in n]
    paths = sorted({call_path(module_of(n))[0] for n in ops})
    if not paths or "" in paths:
        return None
    try:
        for path in paths:
            reference.get_submodule(path)
    except AttributeError:
        return None
    # a module inside another of the region hands its outputs to code under autocast, as the candidate's does; the
    # outermost cast theirs back (bfloat16 to float32 is exact, as the promotion by float32 code after a region is)
    kept = {p for p in paths if any(p.startswith(q + ".") for q in paths)}
    return Region(tuple(paths), frozenset(kept))


def lower_computed(dtypes: Iterable[str], reference: torch.nn.Module, candidate: torch.nn.Module) -> torch.dtype | None:
    """The least precise floating dtype among `dtypes` (those a candidate's capture recorded where the reference's
    did not: `divergence._lowered_dtypes`) where it is less precise than the reference's parameters' and the
    candidate's parameters are the reference's dtype (so an autocast region, not a converted model, computed in
    it), else None."""
    a, b = floating_dtype(reference), floating_dtype(candidate)
    if a is None or a != b:
        return None
    found = least_precise(dtypes, str(a).removeprefix("torch."))
    return None if found is None else getattr(torch, found)


def floating_dtype(model: torch.nn.Module) -> torch.dtype | None:
    """The dtype of a model's first floating parameter (else buffer); None where it holds none."""
    for tensor in itertools.chain(model.parameters(), model.buffers()):
        if tensor.is_floating_point():
            return tensor.dtype
    return None


def lower_precision(reference: torch.nn.Module, candidate: torch.nn.Module) -> torch.dtype | None:
    """The candidate's floating dtype where it is less precise than the reference's (a larger machine epsilon:
    float16 or bfloat16 against float32, bfloat16 against float16), else None."""
    a, b = floating_dtype(reference), floating_dtype(candidate)
    if a is None or b is None or a == b:
        return None
    return b if torch.finfo(b).eps > torch.finfo(a).eps else None


def cast_inputs(value: Any, dtype: torch.dtype) -> Any:
    """`value` with each floating tensor in it (in tuples, lists and dicts, however nested) cast to `dtype`."""
    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, tuple | list) and type(value) in (tuple, list):
        return type(value)(cast_inputs(v, dtype) for v in value)
    if isinstance(value, dict) and type(value) is dict:
        return {k: cast_inputs(v, dtype) for k, v in value.items()}
    return value


def floor_model(reference: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """A copy of `reference` (its parameters and buffers: as much memory again, in `dtype`) converted to `dtype`,
    in the reference's mode (eval or training)."""
    model = copy.deepcopy(reference).to(dtype)
    model.train(reference.training)
    return model


def judged_sketches(candidate: SketchVerdict, floor: SketchVerdict, numel: int) -> SketchVerdict:
    """A pair of summaries (`candidate`: the reference's against the candidate's) judged as the session judges it
    against its noise run (`floor`: the reference's against the floor's, at the same tensor): by the reports
    layer's noise rule for summaries (`compare/reports/noise.summary_noise_verdict`), through the JSON the session
    stores; `candidate` as it is where that rule does not apply (a floor of zero at the sampled elements: the
    tolerances judge)."""
    stored = summary_report(candidate.to_json())
    judged = None if stored is None else summary_noise_verdict(stored, summary_report(floor.to_json()), numel, NOISE)
    if judged is None:
        return candidate
    return dataclasses.replace(candidate, passed=judged.passed, reason=str(judged.reason))


def judged_full(tolerance_passed: bool, error: float, floor_error: float) -> bool:
    """A pair of full values judged as the session judges it against its noise run (`noise_judges`: its max |diff|
    `error` within NOISE_FACTOR times the floor's `floor_error`, both ways), by its tolerance where the floor is
    zero there."""
    verdict = noise_judges(error, floor_error, NOISE)
    return tolerance_passed if verdict is None else verdict
