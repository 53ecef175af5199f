"""`find_divergence`: the first diverging op of two models on the same inputs, in four forward passes.

1. Summaries: each model runs once with the hooks of a `values="summary"` capture (`recorder.record`), the summaries
   held in memory, nothing stored yet. The two runs' summaries are compared in order (`engine/summary_compare.py`),
   paired by name without the model's class name, and the first that fails is the first divergence found by them.
   Where none fails and every pair's content hashes are equal, no model is called again: the two summary runs are
   stored and the answer is "no difference found", which stands on every pair of summaries having been compared.
   Where none fails but hashes differ, the summaries (lower bounds of max |diff|: sampled elements, norms) may have
   missed one element far off: the second pass looks at the first pair whose hashes differ.
2. Full values and repeatability: each model runs again, recording full values of the module that holds that op
   and of the module whose tensor came just before it (its input's maker). In the same pass, every tensor the first
   pass summarised, up to the last tensor of those modules in its summaries (or the first divergence, where later),
   is hashed as its summary's content hash is, and must equal it: a model or inputs that change between calls
   (dropout, a random op, inputs changed in place), the reference's or the candidate's, are refused
   (ChangingModelError, naming the model and the first tensor that changed), and nothing is stored. The forward is
   stopped right after that tensor (`record(stop=True)`): the rest of the model is not run again, nor recorded (the
   model's outputs are left out, as a note on the run says). A change after that tensor cannot change the answer,
   which lies before it, and is not checked; the answer says up to which tensor each model was checked. The full
   values are compared here element by element (max |diff| and where, how many elements outside the tolerance), as
   the session will, and where a pair of them fails earlier than the summaries' first divergence (or fails where
   the summaries found none), that pair is the first divergence, said to be found by the full values.
3. Only then is everything stored, into one session (a new one, named as `compare` names one, "name (2)", where a
   session of the name asked for exists: live/session_name.py): runs "reference" and "candidate" (the summaries, as
   `capture(values="summary")` would have stored them), "reference (full)" and "candidate (full)". "candidate
   (full)" is compared against "reference (full)" (`runs.compared_against_id`): its pairs are compared element by
   element, so the session's pages, JSON and CLI show the max |diff| and `where` this module computes; "candidate"
   and "reference (full)" are compared against the reference's summaries.

Where the candidate computes in a less precise floating dtype than the reference (float16 or bfloat16 against
float32), a copy of the reference converted to that dtype runs in passes 1 and 2 as well: the precision floor
(`live/precision_floor.py`). It is stored as the session's rerun (role "noise": "noise", its summaries, and
"noise (full)", its full values compared against "reference (full)"), and every pair is judged here by the session's
own noise rule (compare/reports/noise.py, on summaries and on full values), so that this answer, the session's page,
its JSON and the sessions list say the same. `precision_floor=False` turns it off. Where the rule on outputs and
inputs then names no culprit, the modules whose outputs are within the floor while their inputs pass are called again
on the reference's own arguments to them (kept during its second pass), the candidate's module and the floor copy's,
and named where the candidate's own error stands out against the copy's (live/own_error.py); the calls that name one
are stored as runs "reference (own)", "candidate (own)" and "noise (own)", which the session judges likewise.
"""

from __future__ import annotations

import collections
import dataclasses
import fnmatch
import functools
import re
import warnings
from collections.abc import Callable, Hashable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import torch

from tensor_debugger.compare.planning.op_pairs import op_strategy, pairing_note
from tensor_debugger.compare.reports.divergence_words import FOUND_BY_FIND_DIVERGENCE
from tensor_debugger.engine.capture_order import held_before, holds_one_value
from tensor_debugger.engine.lowered import Recorded, lowered
from tensor_debugger.engine.op_alignment import AMBIGUOUS, OpPairing, OpTensor, out_of_step, pair_ops
from tensor_debugger.engine.pairing import (
    parameter_key,
    parameter_strategy,
    position_key,
    position_matches,
    unique_matches,
)
from tensor_debugger.engine.shared_calls import shared_calls
from tensor_debugger.engine.summary_compare import (
    Sketch,
    SketchVerdict,
    compare_sketches,
    next_capture,
    sketch_hashes,
    sketch_likeness,
)
from tensor_debugger.engine.tolerances import Tolerance, default_tolerance
from tensor_debugger.ingest.fold64 import dtype_name
from tensor_debugger.live.capture_names import call_path, is_module_input, module_of
from tensor_debugger.live.capture_types import CaptureResult, Level
from tensor_debugger.live.divergence_answer import (
    NOISE_FULL_RUN,
    NOISE_RUN,
    OWN_RUNS,
    Divergence,
    ElementStats,
    FirstDivergence,
)
from tensor_debugger.live.model_state import BufferStates
from tensor_debugger.live.order_context import (
    OUTPUTS,
    crossed_before,
    early_before,
    later_of,
    module_before,
    names_before,
    one_sided_before,
)
from tensor_debugger.live.own_error import (
    Arguments,
    OwnError,
    kept_arguments,
    named,
    recorded_replays,
    replay,
    reproduces,
)
from tensor_debugger.live.precision_floor import (
    Floor,
    autocast_floor,
    autocast_region,
    cast_inputs,
    floating_dtype,
    floor_model,
    judged_full,
    judged_sketches,
    lower_computed,
    lower_precision,
)
from tensor_debugger.live.recorder import HeldRun, compiled_modules, pair_session, record
from tensor_debugger.live.roles import NOISE_ROLE
from tensor_debugger.live.session_name import free_session, stored_in_new_session
from tensor_debugger.live.slices_inside import inside_lines, slices_inside
from tensor_debugger.live.state_differences import StateDifference, differing_state, state_words


class ChangingModelError(ValueError):
    """A model (the reference or the candidate) gave different tensors for the same inputs on two calls: summaries
    of one call cannot be compared with another's."""


class _OtherTensorsRecorded(ChangingModelError):
    """A model's second call recorded another list of tensors than its first: `what` ("the reference"), and the
    first tensor where the lists part (None where one list is the start of the other)."""

    def __init__(self, message: str, what: str, at: str | None) -> None:
        super().__init__(message)
        self.what, self.at = what, at


def _caller(
    inputs: Any, roles: Mapping[int, str] | None = None, states: BufferStates | None = None
) -> Callable[[torch.nn.Module], Any]:
    """How to call a model on `inputs`: a tuple or list of positional arguments, a mapping of keyword arguments,
    or one argument. What a model raises gets a note naming it (its role in `roles`, by id) and how it was called:
    the model's own message ("mat1 and mat2 shapes cannot be multiplied") says neither. With `states`, each call
    starts from the model's buffers as its first found them (live/model_state.py)."""

    def call(model: torch.nn.Module) -> Any:
        if states is not None:
            states.before_call(model)
        with torch.no_grad():
            given = _copied(inputs)
            try:
                if isinstance(given, Mapping):
                    return model(**given)
                if isinstance(given, tuple | list):
                    return model(*given)
                return model(given)
            except Exception as error:
                what = (roles or {}).get(id(model), "a")
                error.add_note(f"find_divergence: raised by the {what} model, called as model({_arguments(inputs)})")
                raise

    return call


def _copied(value: Any) -> Any:
    """`value` with each tensor in it (in tuples, lists and dicts, however nested) a copy of its own: each call of a
    model gets inputs no earlier call changed in place (a port scaling a view of its input, `x[..., :8].mul_(0.5)`,
    would otherwise change what the other model, and its own second call, are given)."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple | list):
        return type(value)(_copied(v) for v in value) if type(value) in (tuple, list) else value
    if isinstance(value, dict) and type(value) is dict:
        return {k: _copied(v) for k, v in value.items()}
    return value


def _root_name(model: torch.nn.Module) -> str:
    """The class name a capture gives a model's tensors: that of the model `torch.compile(model)` wraps, where it
    does (not `OptimizedModule`, whose tensors would then pair with nothing)."""
    return type(compiled_modules(model)[0]).__name__


def _arguments(inputs: Any) -> str:
    """How `_caller(inputs)` calls a model, as the next capture's snippet writes it."""
    if isinstance(inputs, Mapping):
        return "**inputs"
    return "*inputs" if isinstance(inputs, tuple | list) else "inputs"


def _given_words(arguments: str) -> str:
    """What the snippet's `inputs` is, by how `_arguments` calls a model with it."""
    return {"**inputs": "a dict of keyword arguments", "*inputs": "a tuple of positional arguments"}.get(
        arguments, "one tensor, the one positional argument"
    )


def _recorded(ours: Mapping[str, Sketch], others: Mapping[str, Sketch], root_a: str, root_b: str) -> list[Recorded]:
    """The candidate's (`others`) tensors, in its order, each with its dtype and its namesake's in the reference's
    capture (`ours`; None where none), as `engine/lowered.py`'s rule takes them."""
    by_key = {_key(n, root_a): s.dtype for n, s in ours.items()}
    return [(n, s.dtype, by_key.get(_key(n, root_b))) for n, s in others.items()]


def _lowered_dtypes(ours: Mapping[str, Sketch], others: Mapping[str, Sketch], root_a: str, root_b: str) -> set[str]:
    """The dtypes of `engine/lowered.lowered`'s tensors: those the candidate computes in where the reference does
    not."""
    everywhere = {s.dtype for s in ours.values()}
    return {dtype for _, dtype in lowered(_recorded(ours, others, root_a, root_b), everywhere)}


def _lowered_names(
    ours: Mapping[str, Sketch], others: Mapping[str, Sketch], root_a: str, root_b: str, dtype: str
) -> list[str]:
    """`engine/lowered.lowered`'s tensors in `dtype`, the candidate's names, in its order."""
    everywhere = {s.dtype for s in ours.values()}
    return [n for n, lower in lowered(_recorded(ours, others, root_a, root_b), everywhere) if lower == dtype]


def _first_lowered(
    ours: Mapping[str, Sketch], others: Mapping[str, Sketch], root_a: str, root_b: str, dtype: str
) -> str | None:
    """The first of `engine/lowered.lowered`'s tensors in `dtype`."""
    return next(iter(_lowered_names(ours, others, root_a, root_b, dtype)), None)


def _key(name: str, root: str) -> str:
    """A tensor's name without the model's class name, which differs between a model and its port."""
    return name[len(root) :] if name.startswith(root) else name


def _maker_of(name: str, calls: set[str]) -> str:
    """The module call whose code made a first divergence: its own module's for an op's or an output's; for a
    module's input, the module that called it (`Net.attn.o_inputs_args_0` -> `Net.attn`): every tensor before it
    passed, so what differs was computed there, between its children (by code no op capture saw, or by ops one
    side alone ran): the nearest ancestor among the module calls `calls` (a ModuleList is called by none). The
    model's own inputs are its own."""
    module = module_of(name)
    if not is_module_input(name):
        return module
    path = re.sub(r"#\d+$", "", module)
    while "." in path:
        path = path.rpartition(".")[0]
        if path in calls:
            return path
    return module


def _check_repeatable(
    first: Mapping[str, Sketch],
    again: Mapping[str, str],
    until: str | None,
    what: str,
    lines: Mapping[str, str],
    training: bool,
) -> None:
    """Raise ChangingModelError where the tensors of a model's second call (`again`: their hashes, up to `until`,
    else to the end) are not those of its first (`first`: their summaries), naming the first that changed and the
    line that made it (`lines`); the advice to call `.eval()` only where the model is in training mode (`training`):
    one in eval mode changes by code that ignores it (`F.dropout(x, p, training=True)`, a random op)."""
    names = list(first)
    expected = names[: names.index(until) + 1] if until is not None else names
    seen = list(again)
    if seen != expected:
        at = next((a for a, b in zip(expected, seen, strict=False) if a != b), None)
        where = f"first at {at}" if at is not None else f"{len(expected)} then {len(seen)} up to {until or 'the end'}"
        raise _OtherTensorsRecorded(
            f"{what} called twice on the same inputs recorded different tensors ({where}); summaries of one call "
            "cannot be compared with another's",
            what,
            at,
        )
    for name in expected:
        if again[name] != first[name].hash:
            at = f" ({lines[name]})" if name in lines else ""
            advice = (
                "put the model in eval mode and seed any randomness"
                if training
                else "the model is in eval mode, so look there for an op that ignores it (dropout called with "
                "training=True) or draws random numbers"
            )
            raise ChangingModelError(
                f"{what} called twice on the same inputs gave different values, first at {name}{at} (dropout, a "
                f"random op, or inputs changed in place?); {advice}"
            )


def _full_stats(a: torch.Tensor, b: torch.Tensor, names: tuple[str, str], tolerance: Tolerance) -> ElementStats:
    """Element by element, as torch.testing compares by default and the session's comparison does: equal values
    (infinities of one sign included) agree, a NaN is a mismatch (NaN against NaN too: equal_nan=False); complex
    values by the magnitude of their difference; an empty tensor has nothing outside. In float64 (complex128), on
    the host, one thread; two tensors of one dtype that are equal throughout (`torch.equal`: the pairs before the
    divergence) are not widened at all: every difference is 0."""
    shape = tuple(a.shape)
    if not a.numel():
        return ElementStats(names[0], names[1], shape, 0.0, (), 0, 0, True)
    if a.dtype == b.dtype and torch.equal(a, b):  # NaN is never equal: a tensor holding one takes the long way
        return ElementStats(names[0], names[1], shape, 0.0, (0,) * len(shape), 0, a.numel(), True)
    wide = torch.complex128 if a.is_complex() or b.is_complex() else torch.float64
    x = a.detach().to("cpu", wide).numpy().reshape(-1)
    y = b.detach().to("cpu", wide).numpy().reshape(-1)
    with np.errstate(invalid="ignore"):  # an infinity less itself, or times rtol 0: NaN, handled here
        diff = np.abs(y - x)  # float64; NaN where either is NaN, or both are the same infinity
        nan = np.isnan(diff)
        if nan.any():
            diff[x == y] = 0.0  # the same infinity agrees; a NaN (against NaN too) does not
            nan = np.isnan(diff)
        # an infinity against a number or against the other infinity: its bound is inf (or, with rtol 0, NaN),
        # which no comparison exceeds; it is outside any tolerance, as torch.testing holds
        bad = (diff > tolerance.bound(np.abs(x))) | np.isinf(diff)
    mismatched = int(np.count_nonzero(bad)) + int(np.count_nonzero(nan))
    diff[nan] = np.inf  # a NaN against a number is the largest difference
    index = int(diff.argmax())
    argmax = tuple(int(i) for i in np.unravel_index(index, shape)) if shape else ()
    return ElementStats(names[0], names[1], shape, float(diff[index]), argmax, mismatched, a.numel(), mismatched == 0)


def find_divergence(
    reference: torch.nn.Module,
    candidate: torch.nn.Module,
    inputs: Any,
    *,
    session: str,
    server: str | None = None,
    data_dir: str | Path | None = None,
    token: str | None = None,
    level: Level = "op",
    rtol: float | None = None,
    atol: float | None = None,
    precision_floor: bool = True,
) -> Divergence:
    """Find the first op (with `level="module"`, module) where `candidate` diverges from `reference` on `inputs`
    (a tuple of positional arguments, a dict of keyword arguments, or one argument), in four forward passes (see
    the module docstring), all stored into session `session` (on `server`, else in `data_dir` or the default data
    dir; where a session of that name exists, into a new one, `session (2)`, said in the answer) once every pass is
    done. `rtol`, `atol`: the tolerance (default: torch.testing's for the dtypes). Raises
    ChangingModelError, storing nothing, where the reference or the candidate gives different values on two calls
    before the answer; warns where a model is in training mode.

    Where the candidate computes in a less precise floating dtype than the reference (its first floating
    parameter's: float16 or bfloat16 against float32), a copy of the reference converted to that dtype runs beside
    them on the same inputs (floating tensors cast to it) as the precision floor (live/precision_floor.py), stored
    as the session's rerun (runs "noise" and "noise (full)", role "noise"): each pair is judged by the session's
    noise rule, passing where its |diff| is within 4 times the floor's and failing where it is more, so rounding
    names no divergence and no culprit, and the session's pages say what this answer says. It costs a copy of the
    reference's parameters and buffers in that dtype, its forward passes (one with summaries, one more with full
    values where a divergence is found) and their runs. `precision_floor=False` judges by tolerances alone. Where
    the candidate's parameters are the reference's dtype but its capture recorded tensors in a less precise one (a
    torch.autocast region), the floor is the reference itself with autocast to that dtype in the forward of the
    modules where the candidate computes in it (`precision_floor.autocast_floor`, `autocast_region`)."""
    for what, model in (("reference", reference), ("candidate", candidate)):
        if model.training:
            warnings.warn(
                f"the {what} model is in training mode: dropout and batch statistics change its outputs between "
                "calls (call .eval() first)",
                stacklevel=2,
            )
    # a session made before (an earlier call's, a compare's) is never added to: its labels would clash, or its
    # reference lose its place; a new session takes the name a compare would give it, "name (2)"
    asked, session = session, free_session(session, server, token, data_dir)
    states = BufferStates()  # each call from the buffers the first started from; the caller's, as given, at the end
    call = _caller(inputs, {id(candidate): "candidate", id(reference): "reference"}, states)
    # capture()'s keywords; into a local data dir, the session's runs are paired once, after the last capture (each
    # would pair them all)
    where: dict[str, Any] = {"server": server, "token": token, "data_dir": data_dir, "_pair": server is not None}
    stored: list[CaptureResult] = []
    lower = lower_precision(reference, candidate) if precision_floor else None
    floor: Floor | None = None
    if lower is not None:
        copied = floor_model(reference, lower)
        floor = Floor(
            copied,
            _caller(cast_inputs(inputs, lower), {id(copied): f"reference converted to {dtype_name(lower)}"}, states),
            dtype_name(lower),
            dtype_name(next(p.dtype for p in reference.parameters() if p.is_floating_point())),
        )
    find = functools.partial(
        _find,
        reference,
        candidate,
        call,
        session,
        server,
        data_dir,
        where,
        level,
        rtol,
        atol,
        stored,
        _arguments(inputs),
        floor,
        precision_floor,
        asked=asked,
    )
    try:
        try:
            return _named(find(), asked)
        except _OtherTensorsRecorded as first_call:
            # a model whose first call records tensors its later calls do not (a value computed on the first call
            # and kept: a helper under functools.lru_cache, a table built lazily): nothing is stored yet, so both
            # models are called afresh, each now past its first call, and those calls are compared
            at = f", first at {first_call.at}" if first_call.at is not None else ""
            note = (
                f"{first_call.what}'s first call recorded other tensors than its second{at} (a value computed on "
                "the first call and kept, as functools.lru_cache keeps one?): both models were called again and "
                "these later calls compared"
            )
            try:
                return _named(find(first_call_note=note), asked)
            except _OtherTensorsRecorded as again:
                again.add_note(f"find_divergence: the same after leaving each model's first call out ({note})")
                raise
    finally:
        states.restore_all()
        if server is None and stored and stored[0].session_id is not None:
            pair_session(stored[0].session_id, data_dir)


def _store_runs(
    runs: Sequence[tuple[HeldRun, str, str | None, str | None]],
    session: str,
    asked: str | None,
    where: dict[str, Any],
    stored: list[CaptureResult],
) -> str:
    """Store `runs` (each held run, its label, role and the label it is compared against) in order into session
    `session`, each result appended to `stored`; the name of the session stored into. The first run a call stores
    into a local data dir makes the session, under the next name free for `asked` where another call took
    `session` since it was found free (live/session_name.py), on its server too."""
    for held, label, role, against in runs:
        if stored:
            stored.append(held.store(session, label, **where, against=against, role=role))
            continue

        def store(
            name: str, held: HeldRun = held, label: str = label, role: str | None = role, against: str | None = against
        ) -> CaptureResult:
            return held.store(name, label, **where, against=against, role=role, new_session=True)

        result, session = stored_in_new_session(
            store, asked or session, session, where["data_dir"], where["server"], where.get("token")
        )
        stored.append(result)
    return session


def _named(found: Divergence, asked: str) -> Divergence:
    """`found`, saying the session name asked for where it was taken, so another was used."""
    return dataclasses.replace(found, asked_session=asked) if asked != found.session else found


def _find(
    reference: torch.nn.Module,
    candidate: torch.nn.Module,
    call: Callable[[torch.nn.Module], Any],
    session: str,
    server: str | None,
    data_dir: str | Path | None,
    where: dict[str, Any],
    level: Level,
    rtol: float | None,
    atol: float | None,
    stored: list[CaptureResult],
    arguments: str = "*inputs",
    floor: Floor | None = None,
    autocast_floor_allowed: bool = False,
    first_call_note: str | None = None,
    asked: str | None = None,
) -> Divergence:
    """`find_divergence`'s passes; each run stored is appended to `stored`; `arguments`, how the next capture's
    snippet calls each model on `inputs`; `floor`, the precision floor, where there is one; `first_call_note`, why
    the models' first calls were left out (said among the answer's notes); `asked`, the session name asked for
    (`session` the name found free for it: another where a call at the same moment took it first)."""
    root_a, root_b = _root_name(reference), _root_name(candidate)
    # 1. summaries of each model, held, compared in order
    with record(reference, level=level, values="summary") as ref_run:
        call(reference)
    raised: Exception | None = None  # what the candidate raised: its summaries up to there are still compared
    with record(candidate, level=level, values="summary") as cand_run:
        try:
            call(candidate)
        except Exception as error:
            raised = error
    ref, cand = ref_run.result, cand_run.result
    lower: torch.dtype | None = None  # the dtype of an autocast floor
    widened: str | None = None  # why an autocast floor in some modules only was not used (what it raised)
    if floor is None and autocast_floor_allowed and raised is None:
        # the candidate's parameters are the reference's dtype, but it computed tensors in a less precise one: an
        # autocast region (a bfloat16 MLP in a float32 port); the floor is the reference under autocast. Only the
        # dtypes the reference does not compute in there: a region both sides share calls for no floor
        lower = lower_computed(_lowered_dtypes(ref.summaries, cand.summaries, root_a, root_b), reference, candidate)
        if lower is not None:
            region = autocast_region(
                _lowered_names(ref.summaries, cand.summaries, root_a, root_b, dtype_name(lower)), reference
            )
            floor = autocast_floor(
                reference, call, lower, dtype_name(floating_dtype(reference) or torch.float32), region
            )
    floor_sketches: Mapping[str, Sketch] = {}
    floor_held: HeldRun | None = None  # the floor's summaries, stored as the session's run "noise"
    floor_note: str | None = None
    while floor is not None:
        try:
            with record(floor.model, level=level, values="summary") as floor_run:
                floor.call(floor.model)
            floor_sketches = floor_run.result.summaries
            floor_held = floor_run
            break
        except Exception as error:  # the floor cannot run (an op without a kernel in that dtype)
            if floor.autocast and floor.region and lower is not None:
                # autocast in some modules only raised (their outputs met the reference's float32 code in a way the
                # candidate's did not): the whole reference under autocast, as wide as a floor can be, said
                widened = f"{type(error).__name__}: {error}"
                floor = autocast_floor(reference, call, lower, floor.reference_dtype)
                continue
            ran, parts = (
                (f"the reference run under torch.autocast to {floor.dtype}", "parts of its forward ")
                if floor.autocast
                else (f"the reference converted to {floor.dtype}", "")
            )
            floor_note = (
                f"The candidate computes {parts}in {floor.dtype}, but {ran} (the precision floor) raised "
                f"{type(error).__name__}: {error}; pairs were judged by tolerances alone"
            )
            floor = None
    # the line that made each tensor: an op's caller, or, for a module call's inputs and outputs, the line that
    # called the module (the model's own inputs and outputs have none: it is called here, not by the user's code)
    ref_lines, cand_lines = (
        {
            n: at
            for n, at in {**r.called_at, **r.sources}.items()
            if not re.match(rf"{re.escape(root)}(#\d+)?_(inputs|outputs)", n)
        }
        for r, root in ((ref, root_a), (cand, root_b))
    )

    lowered = (
        _first_lowered(ref.summaries, cand.summaries, root_a, root_b, floor.dtype)
        if floor is not None and floor.autocast
        else None
    )
    lowered_first = (lowered, cand_lines.get(lowered) or "") if lowered is not None else None

    def tolerance_of(dtype_a: str, dtype_b: str) -> Tolerance:
        default = default_tolerance(dtype_a, dtype_b)
        return Tolerance(default.rtol if rtol is None else rtol, default.atol if atol is None else atol)

    def tolerance(a: Sketch, b: Sketch) -> Tolerance:
        return tolerance_of(a.dtype, b.dtype)

    # captured ops pair within each module call by sequence alignment (engine/op_alignment.pair_ops, as the
    # session's planning pairs them): an op one side calls more often (a repeat_kv's reshapes against none) is that
    # side's alone, and the calls after it face their true counterparts; the rest pair by name. Ops of one name and
    # shape the alignment pairs by position are checked by their summaries: computed in another order (k before q),
    # they pair by content
    # one module called N times in the reference (ALBERT's layer group) against N copies in the candidate, each
    # called once, in order: the candidate's names read as the reference's calls (engine/shared_calls.py), said
    as_called, shared = _shared_calls(ref.summaries, cand.summaries, root_a, root_b)
    real = {v: k for k, v in as_called.items()}
    ops = _real_names(
        pair_ops(
            [OpTensor(n, tuple(s.shape), s.dtype) for n, s in ref.summaries.items()],
            [OpTensor(as_called.get(n, n), tuple(s.shape), s.dtype) for n, s in cand.summaries.items()],
            lambda a, b: sketch_likeness(
                ref.summaries[a],
                cand.summaries[real.get(b, b)],
                tolerance(ref.summaries[a], cand.summaries[real.get(b, b)]),
            ),
        ),
        real,
    )
    decided = {*ops.alone_b, *(b for _, b in ops.pairs)}
    theirs = {_key(as_called.get(name, name), root_b): name for name in cand.summaries if name not in decided}
    for name in ops.alone_a:
        theirs.pop(_key(name, root_a), None)
    theirs |= {_key(a, root_a): b for a, b in ops.pairs}
    # a module's input passed by keyword on one side and by position on the other (`self.attn(x=h, keep=m)` against
    # `self.attn(h, m)`): paired by the parameter of the module's `forward` each binds to, as the session pairs them
    by_parameter = dict(_parameter_partners(ref, cand, theirs, root_a))
    theirs |= {_key(name, root_a): partner for name, partner in by_parameter.items()}
    # left unpaired: two tensors paired by name that are not one value computed two ways (a module's inputs of
    # different kinds: an additive float mask against a bool one)
    # And a module's inputs and outputs of other shapes where one side calls that module more often (a block run
    # row by row against one call on the batch): its calls face none of each other's
    calls_a = _module_calls(ref.summaries, root_a)
    calls_b = _module_calls({as_called.get(n, n): s for n, s in cand.summaries.items()}, root_b)
    split: dict[str, tuple[int, int]] = {}
    for name in list(ref.summaries):
        other = theirs.get(_key(name, root_a))
        if other is None:
            continue
        a, b = ref.summaries[name], cand.summaries[other]
        path = _key(re.sub(r"#\d+$", "", module_of(name)), root_a)
        if "/" not in name and tuple(a.shape) != tuple(b.shape) and calls_a[path] != calls_b[path]:
            split[path] = (calls_a[path], calls_b[path])
            del theirs[_key(name, root_a)]
        elif out_of_step(name, (a.shape, b.shape), (a.dtype, b.dtype)):
            del theirs[_key(name, root_a)]
    # the outermost of them (the modules inside a split call are split with it)
    split_calls = tuple(
        (path, *counts) for path, counts in split.items() if not any(path.startswith(outer + ".") for outer in split)
    )
    first: tuple[str, str, SketchVerdict] | None = None
    changed: str | None = None  # the first pair whose hashes differ (of one kind: both hosts', or both devices')
    compared = 0
    empty = 0  # pairs compared whose tensors hold no elements
    within_floor = 0  # pairs outside tolerance but within the precision floor
    beyond_floor = 0  # pairs within tolerance but beyond the precision floor
    order = list(ref.summaries)
    # whether each of the reference's own outputs paired with a bit-identical one of the candidate's (hashes equal)
    model_outputs: list[bool] = []
    outputs_passed: list[bool] = []  # and whether each passed by its summaries' verdict (unpaired: False)
    verdicts: dict[str, SketchVerdict] = {}  # each pair compared, by the reference's name: its summaries' verdict
    for name in order:
        other = theirs.get(_key(name, root_a))
        own_output = re.match(rf"{re.escape(root_a)}_outputs", name) is not None
        if other is None:
            model_outputs += [False] if own_output else []  # not compared: nothing is said of the outputs
            outputs_passed += [False] if own_output else []
            continue
        a, b = ref.summaries[name], cand.summaries[other]
        if own_output:
            model_outputs.append(a.hash == b.hash)
        verdict = compare_sketches(a, b, tolerance(a, b))
        outputs_passed += [verdict.passed] if own_output else []  # by tolerance, not by a precision floor
        compared += 1
        if name in floor_sketches:  # as the session's noise rule judges it (its rerun: the floor's summaries)
            f = floor_sketches[name]
            by_floor = judged_sketches(verdict, compare_sketches(a, f, tolerance(a, f)), a.numel)
            within_floor += by_floor.passed and not verdict.passed
            beyond_floor += verdict.passed and not by_floor.passed
            verdict = by_floor
        verdicts[name] = verdict
        empty += a.numel == 0 and b.numel == 0
        if first is None and changed is None and verdict.hashes_differ and not _same_values_recast(a, b):
            changed = name
        if not verdict.passed and first is None:
            first = (name, other, verdict)
    if raised is not None:
        raised.add_note(_before_raising(first, compared, ref_lines, cand_lines))
        raise raised
    runs: tuple[str, ...] = ("reference", "candidate", *((NOISE_RUN,) if floor_held is not None else ()))
    paired = {_key(n, root_a) for n in order}.intersection(theirs)
    unpaired = (len(order) - len(paired), len(cand.summaries) - len(paired))
    notes = tuple(
        f"the {what}: {note}"
        for what, held in (("reference", ref_run), ("candidate", cand_run))
        for note in held.recorder.notes
    )
    if first_call_note is not None:
        notes = (*notes, first_call_note)
    # the first pass's runs, the floor's summaries as the session's rerun (its noise floor), stored in that order
    first_runs: list[tuple[HeldRun, str, str | None]] = [(ref_run, "reference", None), (cand_run, "candidate", None)]
    if floor_held is not None:
        first_runs.append((floor_held, NOISE_RUN, NOISE_ROLE))
    if first is None and changed is None:  # every pair bit-identical: no model is called again
        session = _store_runs([(h, label, role, None) for h, label, role in first_runs], session, asked, where, stored)
        location = _location(stored[0], server, data_dir)
        within = (changed, ref_lines.get(changed) or "") if changed is not None else None
        return Divergence(
            session,
            location,
            None,
            [],
            compared,
            (),
            None,
            runs,
            [],
            None,
            unpaired,
            within,
            notes,
            empty=empty,
            **_floor_fields(floor, within_floor, beyond_floor, floor_note, split_calls, widened, lowered_first),
            shared_calls=shared,
        )

    # 2. each model again: full values of the modules wanted, and the hash of every tensor up to the last of
    # theirs (or the first divergence, where later), which must be the first pass's. Where the summaries found no
    # pair outside tolerance but hashes differ, the modules wanted are those of the first pair that differs: the
    # summaries bound max |diff| from below (a few sampled elements, the norms), so one element far off can pass them
    if first is not None:
        name, other, verdict = first
    else:
        assert changed is not None
        name, other, verdict = changed, theirs[_key(changed, root_a)], verdicts[changed]
    module = _maker_of(name, {re.sub(r"#\d+$", "", module_of(n)) for n in order})
    # the parameters and buffers of the module that made it, the candidate's against the reference's: set outside
    # the forward, so no op recorded made them (live/state_differences.py); what cannot be read says nothing
    other_module = _maker_of(other, {re.sub(r"#\d+$", "", module_of(n)) for n in cand.summaries})
    state = _differing_state(reference, candidate, module, other_module)
    before = module_before(order, order.index(name), module)
    snippet_of = functools.partial(
        next_capture,
        module_paths=[module, *([before] if before else [])],
        arguments=arguments,
        given=f"inputs: what find_divergence was given as `inputs` ({_given_words(arguments)})",
        # the second pass's runs are stored under "reference (full)" and "candidate (full)": run again, the snippet
        # adds two more to the session, into the same place
        runs=("reference (full, 2)", "candidate (full, 2)"),
        # as "candidate (full)" is: compared against the reference's full values, element by element, not against
        # the reference's summaries
        against=(None, "reference (full, 2)"),
        # the place it stores into, named even where it is the default data dir (the snippet may run elsewhere)
        where=f", server={server!r}" if server is not None else f", data_dir={_data_dir(data_dir)!r}",
    )
    snippet = snippet_of(session)
    full_runs: list[HeldRun] = []
    checked: list[str] = []
    # with a converted floor: the arguments of each module call the second pass records, kept as the reference's
    # call begins, to call each module again on them (its own error: live/own_error.py)
    # (without a floor, to call the candidate's module on them where a culprit's inputs agree only within tolerance)
    window = _window(order, snippet.modules, root_a) if floor is None or not floor.autocast else []
    arguments_kept: dict[str, Arguments | str] = {}
    for model, what, summaries, divergent, lines in (
        (reference, "the reference", ref.summaries, name, ref_lines),
        (candidate, "the candidate", cand.summaries, other, cand_lines),
    ):
        # the candidate's copies of a shared module's calls (`_shared_calls`) are recorded by their own names
        patterns = snippet.modules if model is reference else _as_copies(snippet.modules, as_called)
        last = _last_wanted(summaries, patterns, _root_name(model), divergent)
        until = later_of(list(summaries), last, divergent)
        with (
            record(
                model,
                level=level,
                values="full",
                modules=list(patterns),
                last=last,
                hashes=True,
                hash_until=until,
                stop=True,
            ) as full,
            kept_arguments(model, window if model is reference else [], full.recorder) as caught,
        ):
            call(model)
        arguments_kept |= caught
        _check_repeatable(summaries, full.hashes, until, what, lines, model.training)
        checked.append(until or next(reversed(summaries)))
        full_runs.append(full)
    kept = {"a": full_runs[0].tensors, "b": full_runs[1].tensors}
    floor_values: dict[str, torch.Tensor] = {}
    floor_full: HeldRun | None = None
    if floor is not None and floor_held is not None:  # the floor's full values of the same modules, up to the
        last = _last_wanted(ref.summaries, snippet.modules, root_a, name)  # reference's last wanted
        with record(
            floor.model, level=level, values="full", modules=list(snippet.modules), last=last, stop=True
        ) as floor_full:
            floor.call(floor.model)
        floor_values = floor_full.tensors

    failing: list[ElementStats] = []
    floored_outputs: list[str] = []  # module outputs outside tolerance but within the precision floor
    judged: set[str] = set()  # the reference's tensors compared element by element
    full_of: dict[str, ElementStats] = {}  # the reference's tensors compared element by element: their figures
    reshaped: set[str] = set()  # paired tensors whose shapes differ: a divergence, with no elements to compare
    for tensor_name, value in kept["a"].items():
        partner = theirs.get(_key(tensor_name, root_a))  # as the first pass paired it
        if partner is None or partner not in kept["b"]:
            continue  # unpaired, or left unpaired above
        if kept["b"][partner].shape != value.shape:
            # a module's output of another shape (a router's top-2 weights against a port's top-1): it fails, as
            # its summaries did, and makes its module a culprit where the module's inputs agree
            reshaped.add(tensor_name)
            judged.add(tensor_name)
            continue
        # the looser of the two dtypes' tolerances, as the summaries were judged: a float32 reference against a
        # bfloat16 port is held to bfloat16's, so precision drift alone names no culprit
        tol = tolerance_of(dtype_name(value.dtype), dtype_name(kept["b"][partner].dtype))
        stats = _full_stats(value, kept["b"][partner], (tensor_name, partner), tol)
        floor_value = floor_values.get(tensor_name)
        tolerance_passed = stats.passed
        if floor_value is not None and floor_value.shape == value.shape:  # as the session judges it
            floor_error = _full_stats(value, floor_value, (tensor_name, tensor_name), tol).max_abs_diff
            if 0 < floor_error < float("inf"):  # else the tolerance judges (as noise_judges has it)
                stats = dataclasses.replace(
                    stats,
                    passed=judged_full(stats.passed, stats.max_abs_diff, floor_error),
                    floor_max_abs_diff=floor_error,
                )
        judged.add(tensor_name)
        full_of[tensor_name] = stats
        if not stats.passed:
            failing.append(stats)
        elif (
            not tolerance_passed
            and "/" not in tensor_name
            and module_of(tensor_name) != root_a
            and OUTPUTS.search(tensor_name[len(module_of(tensor_name)) :])
        ):
            floored_outputs.append(tensor_name)
    bad = {s.reference for s in failing} | reshaped
    # the first divergence stands on full values where they were compared: the earliest pair whose full values fail
    # (the summaries bound max |diff| from below, so they miss one element far off, or name a later pair first)
    summary_first = first[0] if first is not None else None
    earliest = next((n for n in kept["a"] if n in bad and n in verdicts), None)
    if earliest is not None and (first is None or order.index(earliest) < order.index(name)):
        name, other, verdict = earliest, theirs[_key(earliest, root_a)], verdicts[earliest]
        module = _maker_of(name, {re.sub(r"#\d+$", "", module_of(n)) for n in order})
        other_module = _maker_of(other, {re.sub(r"#\d+$", "", module_of(n)) for n in cand.summaries})
        state = _differing_state(reference, candidate, module, other_module)

    # 3. only now, the answer known, every run stored: the candidate's full values compared against the reference's
    # full values (the session's pairs there are element by element, as this module's), the rest against the
    # reference's summaries; the floor's full values, the rerun of "reference (full)": the noise floor of
    # "candidate (full)"'s pairs
    second_runs: list[tuple[HeldRun, str, str | None]] = [
        (full_runs[0], "reference (full)", None),
        (full_runs[1], "candidate (full)", None),
    ]
    if floor_full is not None:
        second_runs.append((floor_full, NOISE_FULL_RUN, NOISE_ROLE))
    if state:  # said on the candidate's run too: the session's pages show it beside its pairs
        full_runs[1].recorder.notes.append(state_words(module, other_module, state))
    # and that what needs the models was checked here: the session does not send the user to find_divergence
    full_runs[1].recorder.notes.append(FOUND_BY_FIND_DIVERGENCE)
    ordered = [(h, label, role, None) for h, label, role in first_runs] + [
        (h, label, role, "reference (full)" if label != "reference (full)" else None) for h, label, role in second_runs
    ]
    taken = _store_runs(ordered, session, asked, where, stored)
    if taken != session:  # another call took the name found free first: the snippet names the session stored into
        session, snippet = taken, snippet_of(taken)
    location = _location(stored[0], server, data_dir)

    if first is None and earliest is None:  # the full values agree too: no divergence found
        return Divergence(
            session,
            location,
            None,
            [],
            compared,
            snippet.modules,
            None,
            (*runs, *(label for _, label, _ in second_runs)),
            [],
            (checked[0], checked[1]),
            unpaired,
            (changed, ref_lines.get(changed) or "") if changed is not None else None,
            notes,
            empty=empty,
            **_floor_fields(floor, within_floor, beyond_floor, floor_note, split_calls, widened, lowered_first),
            shared_calls=shared,
            full_compared=len(judged),
            changed_full=full_of.get(changed) if changed is not None else None,
        )
    culprits, uncompared = _culprits(order, kept["a"], bad, judged, root_a)
    grown: list[str] = []  # culprits by that rule whose module, given the reference's inputs, agrees
    if floor is None:
        grown = _grown(
            culprits,
            kept,
            {k: theirs[_key(k, root_a)] for k in kept["a"] if _key(k, root_a) in theirs},
            arguments_kept,
            (reference, candidate),
            tolerance_of,
        )
        culprits = [c for c in culprits if c not in grown]
    # ops paired by position that their contents neither confirm nor replace (which faces which in their module call
    # is not known) leave that module judged on its own inputs and outputs, as the session's pages judge it; only
    # its replay (below) is passed over, whose figures would compare ops paired so
    unsure = {module_of(a) for (a, _), how in ops.settled.items() if how == AMBIGUOUS}
    own: tuple[OwnError, ...] = ()
    if floor is not None and window and not culprits:
        # no culprit by outputs and inputs: the modules whose outputs are outside tolerance but within the floor
        # while their inputs pass, each called again on the reference's arguments, its own error against the floor
        # copy's; the replays stored where one names a culprit, for the session to judge
        suspects = [m for m in _floored_modules(floored_outputs, kept["a"], bad, judged, culprits) if m not in unsure]
        own, own_runs = _own_errors(suspects, arguments_kept, kept["a"], (reference, candidate, floor.model), floor)
        for label, held in own_runs:
            against = None if label == OWN_RUNS[0] else OWN_RUNS[0]
            role = NOISE_ROLE if label == OWN_RUNS[2] else None
            stored.append(held.store(session, label, **where, against=against, role=role))
            second_runs.append((held, label, role))
        culprits += named(own)
    ours = {theirs[k] for k in paired}  # the candidate's tensors paired
    # inside the first divergence's module call, the candidate's ops without partner (a loop over heads against
    # one batched op) checked by values against slices of the reference's tensors there
    inside = slices_inside(
        (module, other_module), (kept["a"], kept["b"]), list(cand.summaries), (name, other), ours, tolerance_of
    )
    found = FirstDivergence(
        name,
        other,
        module,
        name.rpartition("/")[2].partition("#")[0] if "/" in name else None,
        ref_lines.get(name),
        cand_lines.get(other),
        verdict,
        full_of.get(name),
        one_sided_before(list(cand.summaries), other, lambda n: n in ours, cand_lines, cand.summaries),
        one_sided_before(order, name, lambda n: _key(n, root_a) in theirs, ref_lines, ref.summaries),
        (changed, ref_lines.get(changed) or "") if changed is not None and changed != name else None,
        tuple(n for n in order[: order.index(name)] if _key(n, root_a) not in theirs),
        tuple(ref_lines.get(n) or "" for n in order[: order.index(name)] if _key(n, root_a) not in theirs),
        tuple((n, cand_lines.get(n) or "") for n in names_before(list(cand.summaries), other) if n not in ours),
        pairing_note(
            parameter_strategy(ref.parameters.get(name), cand.parameters.get(other))
            if name in by_parameter
            else op_strategy(ops.settled.get((name, other)))
        ),
        early_before(
            list(cand.summaries),
            other,
            {theirs[k]: k for k in paired},
            {_key(n, root_a): i for i, n in enumerate(order)},
            order.index(name),
            cand_lines,
            {_key(n, root_a): at for n, at in ref_lines.items()},
        ),
        crossed_before=crossed_before(ops.settled, order, name, ref_lines, cand_lines),
        candidate_holds=_held_before(order, name, ref.summaries, cand.summaries.get(other), ref_lines),
        by_full=name != summary_first,
        summary_first=summary_first if name != summary_first else None,
        first_changed_full=full_of.get(changed) if changed is not None and changed != name else None,
        inside=inside,
        inside_lines=inside_lines(inside, ref_lines, cand_lines),
    )
    return Divergence(
        session,
        location,
        found,
        culprits,
        compared,
        snippet.modules,
        snippet.python,
        (*runs, *(label for _, label, _ in second_runs)),
        failing,
        (checked[0], checked[1]),
        unpaired,
        None,
        notes,
        uncompared,
        **_floor_fields(floor, within_floor, beyond_floor, floor_note, split_calls, widened, lowered_first),
        floored_outputs=tuple(floored_outputs),
        shared_calls=shared,
        own_errors=own,
        state=(module, other_module, state) if state else None,
        outputs_agree=bool(model_outputs) and all(model_outputs),
        # where the summaries found a divergence (not the second pass alone, which compares what they passed) and
        # no output of the model's own failed on full values
        outputs_within=summary_first is not None
        and bool(outputs_passed)
        and all(outputs_passed)
        and not all(model_outputs)
        and not any(re.match(rf"{re.escape(root_a)}_outputs", n) for n in bad),
        grown=tuple(grown),
    )


class _FloorFields(TypedDict):
    """The precision floor's fields of a `Divergence` (live/divergence_answer.py says what each means)."""

    floor: str | None
    within_floor: int
    beyond_floor: int
    floor_note: str | None
    split_calls: tuple[tuple[str, int, int], ...]
    floor_autocast: bool
    floor_region: tuple[str, ...]
    floor_widened: str | None
    lowered_first: tuple[str, str] | None


def _floor_fields(
    floor: Floor | None,
    within: int,
    beyond: int,
    note: str | None,
    split_calls: tuple[tuple[str, int, int], ...],
    widened: str | None,
    lowered_first: tuple[str, str] | None,
) -> _FloorFields:
    """What every answer of `find_divergence` says of its precision floor (`floor`, None where there is none)."""
    return _FloorFields(
        floor=floor.dtype if floor is not None else None,
        within_floor=within,
        beyond_floor=beyond,
        floor_note=note,
        split_calls=split_calls,
        floor_autocast=floor is not None and floor.autocast,
        floor_region=floor.region if floor is not None else (),
        floor_widened=widened if floor is not None else None,
        lowered_first=lowered_first,
    )


def _differing_state(
    reference: torch.nn.Module, candidate: torch.nn.Module, module: str, other_module: str
) -> tuple[StateDifference, ...]:
    """The parameters and buffers of the candidate's module call `other_module` that differ from those of the
    reference's `module` (live/state_differences.py); none where they cannot be read or compared."""
    try:
        return differing_state(reference, candidate, call_path(module)[0], call_path(other_module)[0])
    except (RuntimeError, NotImplementedError, TypeError, ValueError):  # a tensor torch cannot copy or compare
        return ()


def _held_before(
    order: Sequence[str],
    name: str,
    summaries: Mapping[str, Sketch],
    theirs: Sketch | None,
    lines: Mapping[str, str],
) -> tuple[str, str] | None:
    """The reference's last tensor before `name` (in its `order`) whose content hash is the candidate's `theirs`,
    with its line (`engine/capture_order.held_before`, the rule the session's report names it by); None where none
    is, or where `theirs` holds one value."""
    if theirs is None or holds_one_value(theirs.numel, theirs.min, theirs.max, theirs.nan):
        return None
    before = names_before(order, name)
    held = held_before(before, {n: sketch_hashes(summaries[n]) for n in before}, sketch_hashes(theirs))
    return None if held is None else (held, lines.get(held) or "")


def _grown(
    culprits: Sequence[str],
    kept: Mapping[str, Mapping[str, torch.Tensor]],
    partners: Mapping[str, str],
    arguments: Mapping[str, Arguments | str],
    models: tuple[torch.nn.Module, torch.nn.Module],
    tolerance_of: Callable[[str, str], Tolerance],
) -> list[str]:
    """Of `culprits` (outputs fail, inputs pass), those whose inputs are not bit-identical to the candidate's
    (`partners`: the reference's tensor names to the candidate's, values in `kept` "a" and "b") and whose candidate
    module, called on the reference's `arguments`, gives the reference's outputs within tolerance: their outputs
    differ because their inputs do, grown past the tolerance, not by their own doing."""
    found = []
    for module in culprits:
        names = [n for n in kept["a"] if "/" not in n and module_of(n) == module]
        inputs = [n for n in names if is_module_input(n)]
        if not inputs or all(
            n in partners
            and kept["a"][n].dtype == kept["b"][partners[n]].dtype
            and torch.equal(kept["a"][n], kept["b"][partners[n]])
            for n in inputs
        ):
            continue  # its inputs agree bit for bit: what differs is its own doing

        def agree(a: torch.Tensor, b: torch.Tensor) -> bool:
            return _full_stats(a, b, ("", ""), tolerance_of(dtype_name(a.dtype), dtype_name(b.dtype))).passed

        outputs = [kept["a"][n] for n in names if not is_module_input(n)]
        if reproduces(module, arguments.get(module), outputs, models, agree):
            found.append(module)
    return found


def _window(order: Sequence[str], patterns: Sequence[str], root: str) -> list[str]:
    """The module calls (other than the model's own) whose tensors a capture of modules `patterns` records, in the
    order of the reference's tensors `order`."""
    calls = dict.fromkeys(module_of(n) for n in order if "/" not in n)
    return [
        c
        for c in calls
        if c != root
        and c.startswith(root + ".")
        and any(
            fnmatch.fnmatchcase(p, pattern) for p in (call_path(c)[0], re.sub(r"#\d+$", "", c)) for pattern in patterns
        )
    ]


def _floored_modules(
    floored: Sequence[str], values: Mapping[str, torch.Tensor], bad: set[str], judged: set[str], named: Sequence[str]
) -> list[str]:
    """The module calls of the outputs `floored` (outside tolerance, within the precision floor) not named already,
    whose every recorded input was compared and passes: where the floor may hide a module's own error."""
    found = []
    for module in dict.fromkeys(module_of(n) for n in floored):
        inputs = [n for n in values if is_module_input(n) and module_of(n) == module]
        if module not in named and inputs and all(n in judged and n not in bad for n in inputs):
            found.append(module)
    return found


def _own_errors(
    suspects: Sequence[str],
    arguments: Mapping[str, Arguments | str],
    values: Mapping[str, torch.Tensor],
    models: tuple[torch.nn.Module, torch.nn.Module, torch.nn.Module],
    floor: Floor,
) -> tuple[tuple[OwnError, ...], list[tuple[str, HeldRun]]]:
    """Each of `suspects` replayed (live/own_error.py) on the reference's `arguments` to it, checked against its
    outputs in `values` (the reference's second pass); and the replays of those it names culprits, recorded as the
    session's runs "reference (own)", "candidate (own)" and "noise (own)" (none where it names none)."""
    lower = getattr(torch, floor.dtype)
    errors = []
    for module in suspects:
        outputs = [v for n, v in values.items() if "/" not in n and module_of(n) == module and not is_module_input(n)]
        errors.append(replay(module, arguments.get(module), outputs or None, models, lower))
    # the calls that name a culprit, recorded for the session to judge (those of rounding alone are in the answer)
    replayed = [(m, arguments[m]) for m in named(errors)]
    if not replayed:
        return tuple(errors), []
    try:
        held = recorded_replays(models, [(m, a) for m, a in replayed if isinstance(a, Arguments)], lower)
    except Exception as error:  # a call replayed once already failed when recorded: named on nothing stored, never
        why = f"recording its replay for the session raised {type(error).__name__}: {error}"
        return tuple(dataclasses.replace(e, culprit=False, reason=why) if e.culprit else e for e in errors), []
    return tuple(errors), list(zip(OWN_RUNS, held, strict=True))


def _before_raising(
    first: tuple[str, str, SketchVerdict] | None,
    compared: int,
    ref_lines: Mapping[str, str],
    cand_lines: Mapping[str, str],
) -> str:
    """What the summaries the candidate recorded before it raised (a port whose shapes go wrong, then meet an op
    that refuses them) tell: the first pair that failed among them, with its lines, or that none did."""
    if first is None:
        return (
            f"find_divergence: before the candidate raised, {compared} pairs of summaries were compared and none "
            "differed beyond tolerance"
        )
    name, other, verdict = first
    at = f" (called at {ref_lines.get(name)} in the reference, {cand_lines.get(other)} in the candidate)"
    return (
        f"find_divergence: before the candidate raised, the first divergence among the {compared} pairs of summaries "
        f"compared was {name}{at if name in ref_lines or other in cand_lines else ''}: {verdict.reason}"
    )


def _same_values_recast(a: Sketch, b: Sketch) -> bool:
    """Whether two summaries whose hashes differ are of the same values held in two dtypes (a float32 input and
    the float64 copy a port makes of it): the hash covers the dtype, but every statistic (float64) and sampled value
    is equal. Such a pair is no place where values began to differ."""
    stats = ("shape", "numel", "count", "sum", "sumsq", "min", "max", "nan", "inf")
    return (
        a.dtype != b.dtype
        and all(getattr(a, s) == getattr(b, s) for s in stats)
        and np.array_equal(np.asarray(a.sample), np.asarray(b.sample), equal_nan=True)
    )


def _parameter_partners(
    ref: CaptureResult, cand: CaptureResult, theirs: Mapping[str, str], root_a: str
) -> list[tuple[str, str]]:
    """The reference's module inputs paired with none of the candidate's, each with the candidate's input of the same
    module call bound to the same parameter of the module's `forward` (passed by keyword on one side, by position on
    the other; what the names leave, by position: a keyword bound to the positional parameter k against the k-th
    positional argument), by the parameter each capture recorded (`CaptureResult.parameters`) and the rule the session's
    planning pairs stored runs by (`engine/pairing.py`, strategy `parameter`): the two cannot pair otherwise."""
    taken = {theirs[_key(n, root_a)] for n in ref.summaries if _key(n, root_a) in theirs}
    ours = [n for n in ref.summaries if _key(n, root_a) not in theirs and n in ref.parameters]
    others = [n for n in cand.summaries if n not in taken and n in cand.parameters]

    def keyed(result: CaptureResult) -> Callable[[str], Hashable | None]:
        def key(name: str) -> Hashable | None:
            module = module_of(name)
            return parameter_key(module, name[len(module) + 1 :], result.parameters.get(name))

        return key

    def placed(result: CaptureResult) -> Callable[[str], tuple[Hashable, bool] | None]:
        def key(name: str) -> tuple[Hashable, bool] | None:
            module = module_of(name)
            shape = result.summaries[name].shape
            return position_key(module, name[len(module) + 1 :], result.parameters.get(name), shape)

        return key

    by_name = unique_matches(ours, others, keyed(ref), keyed(cand))
    named_a, named_b = {a for a, _ in by_name}, {b for _, b in by_name}
    left, right = [n for n in ours if n not in named_a], [n for n in others if n not in named_b]
    return by_name + position_matches(left, right, placed(ref), placed(cand))


def _shared_calls(
    ours: Mapping[str, Sketch], others: Mapping[str, Sketch], root_a: str, root_b: str
) -> tuple[dict[str, str], tuple[str, ...]]:
    """The candidate's names read as the reference's calls of a module it calls several times where the candidate
    holds one copy per call (engine/shared_calls.py), each keeping the candidate's class name, and the rules
    applied, in words."""
    renamed, rules = shared_calls([_key(n, root_a) for n in ours], [_key(n, root_b) for n in others])
    as_called = {n: root_b + renamed[_key(n, root_b)] for n in others if _key(n, root_b) in renamed}
    return as_called, tuple(rule.words() for rule in rules)


def _as_copies(patterns: Sequence[str], as_called: Mapping[str, str]) -> tuple[str, ...]:
    """`patterns` (module globs of the second pass, the reference's names) and the candidate's own module paths
    whose names read as the reference's calls (`_shared_calls`) match one of them."""
    extra = {
        _path_of(name): None
        for name, called in as_called.items()
        if any(fnmatch.fnmatchcase(_path_of(called), p) for p in patterns)
    }
    return (*patterns, *extra)


def _path_of(name: str) -> str:
    """A tensor's module path without the model's class name, nor a call's `#n`."""
    return re.sub(r"#\d+$", "", module_of(name)).partition(".")[2]


def _real_names(found: OpPairing, real: Mapping[str, str]) -> OpPairing:
    """`found` with the candidate's names read as the reference's calls (`_shared_calls`) put back."""
    if not real:
        return found
    return OpPairing(
        [(a, real.get(b, b)) for a, b in found.pairs],
        found.alone_a,
        [real.get(b, b) for b in found.alone_b],
        {(a, real.get(b, b)): how for (a, b), how in found.settled.items()},
    )


def _module_calls(summaries: Mapping[str, Sketch], root: str) -> dict[str, int]:
    """How many times each module (its path without the model's class name, nor a call's `#n`) was called, by
    the module calls its tensors were recorded in; 0 for any other."""
    calls: dict[str, set[str]] = {}
    for name in summaries:
        module = _key(module_of(name), root)
        calls.setdefault(re.sub(r"#\d+$", "", module), set()).add(module)
    counted = {path: len(held) for path, held in calls.items()}
    return collections.defaultdict(int, counted)


def _last_wanted(
    summaries: Mapping[str, Sketch], patterns: Sequence[str], root: str, divergent: str | None = None
) -> str | None:
    """The last tensor of a summary capture (in call order) that a capture of modules `patterns` records, other
    than the model's own inputs and outputs (its ops are recorded where `patterns` selects it: "*"): after it, a
    full-values pass of the same model has nothing to record. Where `divergent`, the tensor looked at, is one of the
    model's own outputs (recorded whatever `patterns` says), it is wanted too: its full values are compared."""
    last = None
    for name in summaries:
        path = re.sub(r"#\d+$", "", module_of(name))
        short = path.partition(".")[2]
        if (path != root or "/" in name) and any(
            fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(short, p) for p in patterns
        ):
            last = name
    if last is not None and divergent is not None and re.match(rf"{re.escape(root)}(#\d+)?_outputs", divergent):
        return later_of(list(summaries), last, divergent)
    return last


def _culprits(
    order: Sequence[str],
    values: Mapping[str, torch.Tensor],
    bad: set[str],
    judged: set[str],
    root: str,
) -> tuple[list[str], tuple[tuple[str, tuple[str, ...]], ...]]:
    """Modules recorded with full values whose outputs fail (their names in `bad`) while every input recorded was
    compared (its name in `judged`) and passes; and, apart, the modules whose outputs fail and whose compared inputs
    pass but with inputs not compared, each with those inputs: an input never compared is not known to agree, so no
    culprit is named on its module."""
    modules: dict[str, tuple[bool, bool]] = {}  # module -> (an input fails, an output fails)
    unknown: dict[str, list[str]] = {}  # module -> its inputs not compared
    for name in order:
        if name not in values or "/" in name:
            continue
        module = module_of(name)
        inputs_bad, outputs_bad = modules.get(module, (False, False))
        if "_inputs_" in name[len(module) :]:
            inputs_bad |= name in bad
            if name not in judged:
                unknown.setdefault(module, []).append(name)
        else:
            outputs_bad |= name in bad
        modules[module] = (inputs_bad, outputs_bad)
    suspects = [m for m, (i, o) in modules.items() if o and not i and m != root]
    return (
        [m for m in suspects if m not in unknown],
        tuple((m, tuple(unknown[m])) for m in suspects if m in unknown),
    )


def _location(result: CaptureResult, server: str | None, data_dir: str | Path | None) -> str:
    if server is not None:
        return f"{server.rstrip('/')}/sessions/{result.session_id}"
    return _data_dir(data_dir)


def _data_dir(data_dir: str | Path | None) -> str:
    """The data dir a capture without `server` stores into: `data_dir`, else the settings' (the environment's)."""
    if data_dir is not None:
        return str(Path(data_dir))
    from tensor_debugger.settings import Settings

    return str(Settings.from_environ().data_dir)
