"""A module's own error, for `find_divergence`'s precision floor: the module called again on the reference's own
arguments to it, the candidate's module and the floor copy's, each output against the reference module's.

Where the candidate computes in a lower precision, each pair is judged against the precision floor at that tensor
(`precision_floor.py`): the reference converted to the candidate's dtype, run on the same inputs. At a module's
output that floor is the rounding accumulated by every module before it; a bug in a module late in a deep model (the
last of 12 residual blocks) can add less than 4 times that, and the existing rule (outputs fail, inputs pass) names
no culprit. Given the reference's inputs, every module starts from the same values, so what differs at its output is
its own doing: the SiLU planted in the last of 12 bfloat16 blocks adds 6.7 times the floor copy's own error there,
bug-free blocks at most 1.3 times (bench/RESULTS.md).

During the reference's second pass, a forward pre-hook (`with_kwargs=True`) keeps a copy of the arguments of each
module call in the window (its tensors detached and cloned). Each is then called again, under `torch.no_grad()`, on
those arguments: the reference's module, as its forward gave them, whose output must equal the one its forward
recorded, bit for bit; the candidate's (floating tensors cast to the module's own parameter dtype, on its device, as
its own forward would receive them), twice, whose two outputs must be equal; and the floor copy's, cast likewise. A
call is not replayed, and no culprit is named on it, where its arguments hold a value that cannot be copied soundly
(an object other than a tensor, a number, a string, None, a dtype or a device, in tuples, lists and dicts), where a
call changes a parameter, a buffer or a plain attribute of the module (a cache, a step counter: its buffers and
plain attributes are put back), or where a second call gives other values: the module keeps state between calls, and
its replay is not the call the forward made.

The culprit rule is the one the session's module view applies to the runs stored from these calls
(`compare/reports/module_reports.module_report` with the rerun "noise (own)"): the candidate's output fails the
noise rule (its max |diff| more than NOISE_FACTOR times the floor's) and its added relative RMSE (output's less the
input's, the inputs as cast) stands out against the floor's at the output (`engine/culprits.stands_out`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from tensor_debugger.compare.reports.noise import noise_judges
from tensor_debugger.engine.culprits import stands_out
from tensor_debugger.live.capture_names import call_path
from tensor_debugger.live.module_names import slots_followed
from tensor_debugger.live.ops import OpSink
from tensor_debugger.live.precision_floor import NOISE
from tensor_debugger.live.recorder import HeldRun, record

_PLAIN = (bool, int, float, complex, str, type(None), torch.dtype, torch.device)


@dataclass(frozen=True)
class Arguments:
    """A module call's positional and keyword arguments, tensors detached and cloned as the call began."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True)
class OwnError:
    """A module call replayed on the reference's arguments (`module`: its call's name in the reference's run). Where
    `reason` is set, it was not replayed (or not soundly) and every figure is NaN."""

    module: str
    candidate_error: float  # max |diff| of the candidate's output against the reference's, float64
    floor_error: float  # the floor copy's
    candidate_rmse: float  # relative RMSE of the candidate's output (the largest among its output tensors)
    floor_rmse: float
    input_rmse: float  # the arguments as cast for the candidate against the reference's (the largest)
    culprit: bool
    reason: str | None = None

    @property
    def ratio(self) -> float:
        """The candidate's own error in times the floor's (max |diff|)."""
        if self.floor_error > 0:
            return self.candidate_error / self.floor_error
        return math.inf if self.candidate_error > 0 else 1.0


def _copied(value: Any, path: str) -> Any:
    """`value` with each tensor detached and cloned; ValueError naming `path` where it holds a value that cannot be
    copied soundly (any object other than the plain ones, in tuples, lists and dicts of their own types)."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, _PLAIN):
        return value
    if type(value) in (tuple, list):
        return type(value)(_copied(v, f"{path}[{i}]") for i, v in enumerate(value))
    if type(value) is dict:
        return {k: _copied(v, f"{path}[{k!r}]") for k, v in value.items()}
    raise ValueError(f"its argument {path} is a {type(value).__name__}, which cannot be copied and passed again")


@contextmanager
def kept_arguments(
    model: torch.nn.Module, calls: Sequence[str], sink: OpSink | None = None
) -> Iterator[dict[str, Arguments | str]]:
    """Within the block, keep the arguments of `model`'s module calls `calls` (their names in its run: `Net.attn`,
    `Net.attn#2`), by name: an `Arguments`, or why they cannot be kept. `sink`: the recorder whose op capture runs
    in the block, kept busy while the arguments are copied (their clones are not the model's ops)."""
    kept: dict[str, Arguments | str] = {}
    wanted: dict[str, dict[int, str]] = {}
    for call in calls:
        path, number = call_path(call)
        wanted.setdefault(path, {})[number] = call
    with slots_followed(model) as slot:  # a module in several slots: its calls counted by slot, as recorded
        yield from _kept(model, wanted, kept, sink, slot)


def _kept(
    model: torch.nn.Module,
    wanted: Mapping[str, Mapping[int, str]],
    kept: dict[str, Arguments | str],
    sink: OpSink | None,
    slot: Callable[[torch.nn.Module], str] | None,
) -> Iterator[dict[str, Arguments | str]]:
    """`kept_arguments`'s hooks; `slot`: the path a call beginning now is recorded under, where a module of the
    model is shared (`module_names.slots_followed`)."""
    counts: dict[str, int] = {}
    handles = []
    hooked: set[int] = set()
    for path in wanted:
        module = model.get_submodule(path)
        if slot is not None and id(module) in hooked:  # one hook counts every slot's calls
            continue
        hooked.add(id(module))

        def pre(
            called: torch.nn.Module,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            path: str = path,
        ) -> None:
            path = slot(called) if slot is not None else path
            counts[path] = counts.get(path, 0) + 1
            call = wanted.get(path, {}).get(counts[path])
            if call is None:
                return
            busy = sink.busy if sink is not None else False
            if sink is not None:
                sink.busy = True
            try:
                kept[call] = Arguments(_copied(args, "args"), _copied(kwargs, "kwargs"))
            except ValueError as error:
                kept[call] = str(error)
            finally:
                if sink is not None:
                    sink.busy = busy

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
    try:
        yield kept
    finally:
        for handle in handles:
            handle.remove()


def _cast(value: Any, dtype: torch.dtype | None, device: torch.device | None) -> Any:
    """`value` copied again (so that a call changing its arguments in place changes no other call's), each tensor
    on `device` and each floating one in `dtype`, where given."""
    if isinstance(value, torch.Tensor):
        wanted = dtype if dtype is not None and value.is_floating_point() else value.dtype
        return value.to(device=device or value.device, dtype=wanted, copy=True)
    if type(value) in (tuple, list):
        return type(value)(_cast(v, dtype, device) for v in value)
    if type(value) is dict:
        return {k: _cast(v, dtype, device) for k, v in value.items()}
    return value


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _state(module: torch.nn.Module) -> dict[str, Any]:
    """What a call may change of a module: each parameter's and buffer's identity and version (an in-place write
    moves it on), and each plain attribute's value (a step counter), each list's or dict's length."""
    state: dict[str, Any] = {}
    for name, sub in module.named_modules():
        for key, tensor in (*sub.named_parameters(recurse=False), *sub.named_buffers(recurse=False)):
            state[f"{name}.{key}"] = (id(tensor), tensor._version)
        for key, value in vars(sub).items():
            if key.startswith("_"):
                continue
            if isinstance(value, _PLAIN):
                state[f"{name}.{key}"] = value
            elif isinstance(value, list | dict | set):
                state[f"{name}.{key}"] = (id(value), len(value))
    return state


class NotReplayable(Exception):
    """A module call that cannot be replayed soundly, the reason in words."""


def _call(module: torch.nn.Module, arguments: Arguments, dtype: torch.dtype | None, what: str) -> Any:
    """Call `module` on `arguments` (their floating tensors cast to `dtype` where given, on the module's device)
    under no_grad; NotReplayable where it raises or changes its own state (its buffers and plain attributes put back
    first)."""
    device = next((p.device for p in module.parameters()), None)  # none of its own: where its arguments are
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    plain = {
        (name, key): value
        for name, sub in module.named_modules()
        for key, value in vars(sub).items()
        if not key.startswith("_") and isinstance(value, _PLAIN)
    }
    before = _state(module)
    try:
        with torch.no_grad():
            output = module(*_cast(arguments.args, dtype, device), **_cast(arguments.kwargs, dtype, device))
    except Exception as error:
        raise NotReplayable(f"the {what}'s module raised {type(error).__name__}: {error}") from error
    after = _state(module)
    if after != before:
        with torch.no_grad():
            for name, saved in buffers.items():
                module.get_buffer(name).copy_(saved)
        for (name, key), value in plain.items():
            setattr(module.get_submodule(name), key, value)
        changed = sorted(k.lstrip(".") for k in set(before) | set(after) if before.get(k) != after.get(k))
        raise NotReplayable(
            f"the {what}'s module changed its own state when called ({', '.join(changed[:3])}): it keeps state "
            "between calls"
        )
    return output


def _errors(reference: Any, other: Any) -> tuple[float, float]:
    """The largest max |diff| and relative RMSE among the tensors of two outputs (float64, on the host)."""
    ours, theirs = _tensors(reference), _tensors(other)
    if len(ours) != len(theirs) or any(a.shape != b.shape for a, b in zip(ours, theirs, strict=True)):
        return math.inf, math.inf
    largest, rmse = 0.0, 0.0
    for a, b in zip(ours, theirs, strict=True):
        if not a.is_floating_point() or a.numel() == 0:
            continue
        x, y = a.detach().to("cpu", torch.float64), b.detach().to("cpu", torch.float64)
        diff = (y - x).abs()
        largest = max(largest, float(diff.max()) if not diff.isnan().any() else math.inf)
        norm = float(x.norm())
        error = float(diff.norm())
        rmse = max(rmse, error / norm if norm > 0 else (math.inf if error > 0 else 0.0))
    return largest, rmse


def _input_rmse(arguments: Arguments, dtype: torch.dtype | None) -> float:
    """The relative RMSE the cast adds to the floating arguments of more than one element (the largest)."""
    found = 0.0
    for tensor in _tensors([arguments.args, arguments.kwargs]):
        if tensor.is_floating_point() and tensor.numel() > 1:
            found = max(found, _errors(tensor, tensor.to(dtype) if dtype is not None else tensor)[1])
    return found


def _dtype(module: torch.nn.Module, fallback: torch.dtype) -> torch.dtype:
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), fallback)


def replay(
    call: str,
    arguments: Arguments | str | None,
    recorded: Any,
    models: tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module],
    lower: torch.dtype,
) -> OwnError:
    """Module call `call` (its name in the reference's run; at its path inside each of `models`: the reference, the
    candidate, the floor copy) replayed on the reference's `arguments` to it; `recorded`, the output the reference's
    forward recorded for it (None where not recorded). `lower`: the dtype of a module with no floating parameter of
    its own, in the candidate and the floor copy."""
    nan = math.nan
    try:
        if arguments is None:
            raise NotReplayable("its arguments were not seen (the call was not made in the reference's second pass)")
        if isinstance(arguments, str):
            raise NotReplayable(arguments)
        if recorded is None:
            raise NotReplayable("the reference's forward recorded no output of it to check a replay against")
        try:
            modules = [m.get_submodule(call_path(call)[0]) for m in models]
        except AttributeError as error:
            raise NotReplayable(f"a model has no module {call_path(call)[0]}: {error}") from error
        ours = _call(modules[0], arguments, None, "reference")  # its own arguments, as its forward gave them
        if not all(torch.equal(a, b) for a, b in zip(_tensors(ours), _tensors(recorded), strict=False)) or len(
            _tensors(ours)
        ) != len(_tensors(recorded)):
            raise NotReplayable(
                "the reference's module, called again on its own arguments, gave other values than in its forward "
                "(it keeps state between calls, or its output depends on more than its arguments)"
            )
        dtype = _dtype(modules[1], lower)
        theirs = _call(modules[1], arguments, dtype, "candidate")
        again = _call(modules[1], arguments, dtype, "candidate")
        if not all(torch.equal(a, b) for a, b in zip(_tensors(theirs), _tensors(again), strict=True)):
            raise NotReplayable("the candidate's module, called twice on the same arguments, gave other values")
        floor = _call(modules[2], arguments, _dtype(modules[2], lower), "floor copy")
    except NotReplayable as error:
        return OwnError(call, nan, nan, nan, nan, nan, False, str(error))
    candidate_error, candidate_rmse = _errors(ours, theirs)
    floor_error, floor_rmse = _errors(ours, floor)
    given = _input_rmse(arguments, dtype)
    fails = noise_judges(candidate_error, floor_error, NOISE) is False
    added = candidate_rmse - given if math.isfinite(candidate_rmse) else math.inf
    culprit = fails and stands_out([added], [given], [floor_rmse], NOISE)[0]
    return OwnError(call, candidate_error, floor_error, candidate_rmse, floor_rmse, given, culprit)


def named(errors: Sequence[OwnError]) -> list[str]:
    """The module calls whose own error names them culprits, the most specific of nested ones."""
    standing = [e.module for e in errors if e.culprit]
    return [m for m in standing if not any(o.startswith(m + ".") for o in standing)]


def recorded_replays(
    models: tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module],
    replayed: Sequence[tuple[str, Arguments]],
    lower: torch.dtype,
) -> tuple[HeldRun, HeldRun, HeldRun]:
    """The replays of `replayed` (each: its call's name in the reference's run and the reference's arguments),
    made once more on each of `models` (the reference, the candidate, the floor copy) and recorded as `record`
    records a run (its inputs as each module was given them, cast, and its output), to be stored as the session's
    runs "reference (own)", "candidate (own)" and "noise (own)". Each call keeps its name in the model's run
    (`path#2` for a second call). Called after `replay` found each of them replayable: the same arguments give the
    same values."""
    paths = sorted({call_path(call)[0] for call, _ in replayed})
    with (
        record(models[0], values="full", modules=paths) as ours,
        record(models[1], values="full", modules=paths) as theirs,
        record(models[2], values="full", modules=paths) as floor,
    ):
        for call, arguments in replayed:
            path, number = call_path(call)
            for model, held, what, fallback in (
                (models[0], ours, "reference", None),
                (models[1], theirs, "candidate", lower),
                (models[2], floor, "floor copy", lower),
            ):
                name = f"{held.recorder.root_name}.{path}"
                held.recorder.calls[name] = number - 1  # named as the forward's call: `path#2` for its second
                module = model.get_submodule(path)
                _call(module, arguments, _dtype(module, fallback) if fallback is not None else None, what)
    return ours, theirs, floor


def reproduces(
    call: str,
    arguments: Arguments | str | None,
    recorded: Sequence[torch.Tensor],
    models: tuple[torch.nn.Module, torch.nn.Module],
    agree: Callable[[torch.Tensor, torch.Tensor], bool],
) -> bool:
    """Whether the candidate's module call `call` (its name in the reference's run), given the reference's
    `arguments` to it, gives the reference's `recorded` outputs, each pair as `agree` judges it (`models`: the
    reference, the candidate, of one dtype). A module whose inputs agree only within tolerance and whose outputs do
    not is named a culprit by the rule of outputs and inputs; where this holds, its outputs differ because its inputs
    do (a difference within tolerance grown past it: a norm computed in bfloat16 before a linear layer), not by
    its own doing. False where the call cannot be replayed soundly (as `replay` refuses it) or the reference's
    module, called again on its own arguments, does not give `recorded` bit for bit."""
    if not isinstance(arguments, Arguments) or not recorded:
        return False
    try:
        modules = [m.get_submodule(call_path(call)[0]) for m in models]
        ours = _tensors(_call(modules[0], arguments, None, "reference"))
        if len(ours) != len(recorded) or not all(torch.equal(a, b) for a, b in zip(ours, recorded, strict=True)):
            return False
        # the arguments as the reference's module took them, cast to the candidate module's floating dtype where it
        # holds another (a bfloat16 port judged without a precision floor)
        theirs_dtype = next((p.dtype for p in modules[1].parameters() if p.is_floating_point()), None)
        ours_dtype = next((p.dtype for p in modules[0].parameters() if p.is_floating_point()), None)
        cast = None if theirs_dtype == ours_dtype else theirs_dtype
        theirs = _tensors(_call(modules[1], arguments, cast, "candidate"))
        again = _tensors(_call(modules[1], arguments, cast, "candidate"))
    except (NotReplayable, AttributeError):
        return False
    if len(theirs) != len(ours) or not all(torch.equal(a, b) for a, b in zip(theirs, again, strict=True)):
        return False
    return all(a.shape == b.shape and agree(a, b) for a, b in zip(ours, theirs, strict=True))
