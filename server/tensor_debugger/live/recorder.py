"""Capture every module's inputs and outputs from a live model into a run of a named session.

    from tensor_debugger import capture

    with torch.no_grad(), capture(model, session="llama port", run="reference"):   # into the local data dir
        model(input_ids)
    with capture(port, session="llama port", run="candidate", server="http://127.0.0.1:8000"):
        port(input_ids)

Tensors are named as Hugging Face's `model_addition_debugger_context` names them (`{Class}.{module}_inputs_args_0`,
`..._inputs_kwargs_{name}`, `..._outputs`, `..._outputs_{i}` for tuples, `..._outputs_{key}` for dicts), so a
capture pairs with a trace of the same model and compares bit for bit. Unlike the trace, outputs of modules with
children are kept too (they rank as culprits), and a module called more than once keeps every call: the second is
`{path}#2`, the third `{path}#3`. Non-tensor values are left out.

Each tensor is copied to the host when its hook fires (so a later in-place change cannot alter it; from a CUDA
device, asynchronously into pinned buffers) and written by background threads (`capture_writer`), while the model
runs on, with at most `host_memory` bytes of copies held at once. Into the local data directory, the tensors go
straight into the array store, compressed and hashed as ingest does, under a run begun when the block opens and
made ready when it ends. For a server, they are written as the safetensors files of a trace folder staged on disk,
streamed to the upload API when the block ends.

With `level="op"`, every torch function the forward calls (`live/ops.py`) is recorded too: its outputs, as a node
of the tree inside the innermost module that called it, named `{module call}/{op}#{n}` (the n-th call of that op
inside that call of the module: `LlamaForCausalLM.model.layers.3.self_attn/softmax#1`), with `source`, the file and
line of the user's code that called it (a module's inputs, at either level, carry the line that called the module).
Its files are named `op{count}...` (a module path can be long; the name is the tree's). Only the ops of modules
`modules=` selects are recorded. A module called while a backward pass runs (activation checkpointing's
recomputation) is not recorded again, nor its ops: a note on the run says which
(`call_recorder.Recorder.recomputed_call`).

With `values="summary"`, no tensor is copied or written: each is summarised on its device (`ingest/sketches.py`),
the summary put in the trace JSON in place of a file (and kept in `CaptureResult.summaries`), and the run's tensors
have no values, only their summaries, which pairs are judged on (`engine/summary_compare.py`). Each summary is
computed as the hook fires, on the forward's thread, so it is of the values the op made, whatever changes the tensor
later (an in-place op, or code torch cannot see: a C++ extension, a write through `.numpy()`); its hash is "fold64"
on every device (on the CPU the compiled kernel sums it in the same pass as the statistics). Summarising a copy on
a thread of its own did not pay on 2 cores, where torch's forward holds both (bench/RESULTS.md, 2026-11-28).
`summarize_forward` does the same without storing anything. `record` records a run as `capture` would and holds it
in memory (with full values, a copy of each tensor) until `HeldRun.store` stores it, where `capture` would have; it
can also hash, in the same pass, every tensor a capture of every module would record, as its summary would
(`find_divergence` checks with it that a model repeats its first call).
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from tensor_debugger.live.call_recorder import Both, HeldValues, Recorder, Stop
from tensor_debugger.live.capture_types import CaptureResult, Level, Values, check_level_and_values
from tensor_debugger.live.collector import existing_objects_frozen
from tensor_debugger.live.module_hooks import hook_model, quiet_backward_hook_warnings
from tensor_debugger.live.ops import OpMode
from tensor_debugger.live.roles import parse_role
from tensor_debugger.live.run_notes import end_recording
from tensor_debugger.live.run_storage import LocalRun, release_run, send_run, session_found, staging_folders
from tensor_debugger.live.safetensors_files import FileSink
from tensor_debugger.live.writer import DEFAULT_HOST_MEMORY, CaptureWriter

UNMATCHED_EXAMPLES = 6  # the most module names a warning about an unmatched `modules=` pattern lists


def pair_session(session_id: int, data_dir: str | Path | None) -> None:
    """Pair the runs of a session of the local data dir (`data_dir`, else the default) again, as a capture does
    when it ends."""
    from tensor_debugger.services import open_services
    from tensor_debugger.settings import Settings

    settings = Settings.from_environ() if data_dir is None else Settings.from_environ(data_dir=Path(data_dir))
    services = open_services(settings)
    try:
        services.plan(session_id)
    finally:
        services.close()


def compiled_modules(model: torch.nn.Module) -> tuple[torch.nn.Module, list[str]]:
    """The module to hook (the model itself, or the one `torch.compile(model)` wraps) and the paths (relative to
    it, "" for itself) of the modules that run compiled: wrapped by torch.compile, or compiled in place with
    `module.compile()`."""
    inner = getattr(model, "_orig_mod", None)  # torch.compile's wrapper (OptimizedModule) keeps the model here
    root = inner if isinstance(inner, torch.nn.Module) else model
    compiled = [""] if root is not model else []
    for name, module in root.named_modules():
        wrapped = isinstance(getattr(module, "_orig_mod", None), torch.nn.Module)
        if getattr(module, "_compiled_call_impl", None) is not None or wrapped:
            compiled.append(name)
    return root, compiled


def warn_unmatched_patterns(model: torch.nn.Module, root_name: str, patterns: Sequence[str]) -> None:
    """A `UserWarning` where a `modules=` pattern matches no module of `model` (by its path, `Net.layers.1`, or
    without the model's name, `layers.1`, as the recorder matches them): a typo would otherwise record only the
    model's own inputs and outputs, silently. It names the patterns and a few of the model's module names."""
    names = [name for name, _ in model.named_modules(remove_duplicate=False) if name]
    paths = [root_name, *(f"{root_name}.{name}" for name in names)]
    unmatched = [
        p for p in patterns if not any(fnmatch.fnmatchcase(path, p) for path in paths) and not fnmatch.filter(names, p)
    ]
    if not unmatched:
        return
    some = ", ".join(names[:UNMATCHED_EXAMPLES]) + (", ..." if len(names) > UNMATCHED_EXAMPLES else "")
    warnings.warn(
        f"capture(modules=...): {', '.join(repr(p) for p in unmatched)} matches no module of {root_name} "
        f"(its modules: {some or 'none'}); only what the other patterns select and the model's own inputs and "
        "outputs are recorded",
        UserWarning,
        stacklevel=4,
    )


def summarize_forward(
    model: torch.nn.Module, forward: Callable[[], Any], level: Level = "op", modules: str | Sequence[str] = ()
) -> CaptureResult:
    """Run `forward()` (a call of `model`) with the hooks of a `values="summary"` capture, storing nothing: the
    result's `summaries` (and `sources`) are all it gives."""
    result = CaptureResult("", "")
    patterns = [modules] if isinstance(modules, str) else list(modules)
    model, compiled = compiled_modules(model)
    recorder = Recorder(Path(), type(model).__name__, patterns, None, result)
    handles = hook_model(model, recorder, level, compiled=compiled)
    try:
        with OpMode(recorder) if level == "op" else ExitStack():
            forward()
        recorder.settle()
    finally:
        for handle in handles:
            handle.remove()
    result.tensors = recorder.count
    result.skipped = recorder.skipped
    return result


@contextmanager
def capture(
    model: torch.nn.Module,
    session: str,
    run: str,
    *,
    data_dir: str | Path | None = None,
    server: str | None = None,
    token: str | None = None,
    modules: str | Sequence[str] = (),
    staging: str | Path | None = None,
    host_memory: int = DEFAULT_HOST_MEMORY,
    workers: int | None = None,
    level: Level = "module",
    values: Values = "full",
    on_tensor: Callable[[str, torch.Tensor], None] | None = None,
    backward: bool = False,
    against: str | None = None,
    role: str | None = None,
    _pair: bool = True,
) -> Iterator[CaptureResult]:
    """Record `model`'s forward passes inside the block as run `run` of session `session` (created if needed).

    `server` (e.g. "http://127.0.0.1:8000") sends the run through the API, with `token` (default: the
    TENSOR_DEBUGGER_TOKEN variable) when the server needs one, into the session of that name the server has as the
    block opens (a RuntimeError naming it where it was deleted before the run is sent: never one made again with
    this run alone), else a new one; otherwise it goes into `data_dir` (default:
    TENSOR_DEBUGGER_DATA_DIR, else the app's default). `modules` keeps only modules whose path, with or
    without the model's class name, matches one of these glob patterns ("model.layers.*.mlp*"); the model itself
    is always recorded. `host_memory` bounds the bytes of host copies waiting to be written (default 1 GiB; a hook
    waits while it is spent); `workers` is the number of writing threads (default: TENSOR_DEBUGGER_WORKERS, else
    the CPUs this process may use). `level="op"` records every torch function the forward calls as well, each
    with the file and line that called it (see the module docstring). `values="summary"` keeps no element
    values: each tensor's summary (a content hash, count, sum, sum of squares, min, max, NaN and Inf counts and 256
    sampled values; `ingest/sketches.py`), computed on its device as its hook fires, and compared as a summary
    (`engine/summary_compare.py`). `on_tensor(name, tensor)`, with values="full", is called with each tensor
    recorded as its hook fires (before it is copied: clone it to keep it). `backward=True` also records the
    gradients of the backward passes run inside the block (call `loss.backward()` there, without torch.no_grad):
    of each recorded module's outputs and inputs (`{module}/grad_output`, `{module}/grad_input`) and of its own
    parameters (`{module}.{parameter}/grad`), in the order the backward computes them, after the forward's tensors.
    `against` (a run's label): the run is compared against that run of the session, not the session's reference,
    as `ingest --against` does; into a data dir it is checked as the block opens (InvalidInputError naming the
    reason: no such run, the run itself, the session's reference, a cycle), through a server as the run is sent.
    `role="noise"`: the run is a rerun of the reference, the noise floor of each candidate's pairs (as `compare
    --noise` makes one: a pair passes when its max |diff| is within the session's noise factor times the rerun's
    there), not a candidate; through a server it must be labelled "noise" (the upload form's field of a rerun), a
    ValueError as the block opens otherwise. Nothing is kept when the block raises. (`_pair=False`, for captures in
    a row into a local data dir, leaves the session's runs to be paired after the last: `pair_session`.) `record`
    records the same run without storing it.
    """
    check_level_and_values(level, values)
    parse_role(role, run, server)
    patterns = [modules] if isinstance(modules, str) else list(modules)
    model, compiled = compiled_modules(model)
    root_name = type(model).__name__
    warn_unmatched_patterns(model, root_name, patterns)
    ranks, shared, folder = staging_folders(staging)
    result = CaptureResult(session, run, rank=ranks.rank if ranks is not None else None)
    local: LocalRun | None = None
    writer: CaptureWriter | None = None
    handles: list[torch.utils.hooks.RemovableHandle] = []
    watching = ExitStack()  # with level="op": the torch function mode, active while the block runs
    recorder: Recorder | None = None
    collecting = ExitStack()  # the collector leaves the process's objects alone until the run is stored
    try:
        collecting.enter_context(existing_objects_frozen())
        local = LocalRun(session, run, data_dir, against, role) if server is None and ranks is None else None
        found = session_found(server, session, token, ranks)
        if values == "full":
            writer = CaptureWriter(local.sink if local is not None else FileSink(folder), host_memory, workers)
        recorder = Recorder(folder, root_name, patterns, writer, result)
        recorder.on_tensor = on_tensor
        handles = hook_model(model, recorder, level, backward, compiled)
        if backward:
            collecting.enter_context(quiet_backward_hook_warnings())
        if level == "op":
            watching.enter_context(OpMode(recorder))
        try:
            yield result
        except RuntimeError as error:
            if backward and "BackwardHookFunction" in str(error):
                error.add_note(_IN_PLACE_WITH_BACKWARD)
            raise
        watching.close()
        for handle in handles:
            handle.remove()
        handles = []
        end_recording(recorder, level)
        closing, writer = writer, None
        if closing is not None:
            closing.close()  # every tensor written; raises CaptureError if one could not be
        place = (folder, local, ranks, shared)
        send_run(recorder, result, session, run, place, data_dir, server, token, _pair, against, found, role)
    finally:
        watching.close()
        for handle in handles:
            handle.remove()
        release_run(writer, local, ranks, shared, folder)
        collecting.close()


# torch's words, where a module's output (or input), wrapped by the full backward hooks of backward=True, is changed in
# place: "Output 0 of BackwardHookFunction is a view and is being modified inplace ..."; they name neither the capture
# nor what to do
_IN_PLACE_WITH_BACKWARD = (
    "capture(backward=True): gradients are recorded through torch's full backward hooks "
    "(register_full_backward_hook), which forbid changing a module's output or input in place; the model did (an "
    "in-place op such as `h += b` or `h.mul_(s)` on a tensor a module returned or was given). It runs without "
    "backward=True, or with that op out of place (`h = h + b`)"
)


@dataclass
class HeldRun:
    """A run `record` recorded and holds in memory, stored by `store` as `capture` would have stored it.

    `result`: its summaries and sources (values="summary"), as a capture's; `tensors`: with values="full", each
    tensor recorded (a copy), by name, in call order; `hashes`: with `record(hashes=True)`, each tensor's content
    hash (as its summary's), by its name in a capture of every module, in call order."""

    recorder: Recorder
    result: CaptureResult
    held: HeldValues | None
    hashes: dict[str, str] = field(default_factory=dict)

    @property
    def tensors(self) -> dict[str, torch.Tensor]:
        if self.held is None:
            return {}
        return dict(zip(self.held.names, (copy for _, _, copy in self.held.jobs), strict=True))

    def store(
        self,
        session: str,
        run: str,
        *,
        data_dir: str | Path | None = None,
        server: str | None = None,
        token: str | None = None,
        staging: str | Path | None = None,
        host_memory: int = DEFAULT_HOST_MEMORY,
        workers: int | None = None,
        _pair: bool = True,
        against: str | None = None,
        role: str | None = None,
        new_session: bool = False,
    ) -> CaptureResult:
        """Store the run as run `run` of session `session`, where `capture` with the same arguments would have
        stored it, with the same tensors, summaries, module tree and notes; returns its result, ids filled in.
        `against`: the label of the session's run it is compared against (default: the session's reference);
        `role`: "noise" for a rerun, the noise floor of the run it is compared against (as `capture`'s);
        `new_session`: the run makes its session (into a local data dir or on `server`), and where one of that name
        exists (another call made it since the name was found free) raises SessionNameTaken, nothing stored, the
        run still held to be stored again."""
        parse_role(role, run, server)
        recorder, result = self.recorder, self.result
        result.session, result.run = session, run
        ranks, shared, folder = staging_folders(staging)
        recorder.folder = folder
        result.rank = ranks.rank if ranks is not None else None
        local: LocalRun | None = None
        writer: CaptureWriter | None = None
        try:
            local = None
            if server is None and ranks is None:
                local = LocalRun(session, run, data_dir, against, role, new_session)
            if self.held is not None:
                writer = CaptureWriter(local.sink if local is not None else FileSink(folder), host_memory, workers)
                for index, file, copy in self.held.jobs:
                    writer.submit(index, file, copy)
                closing, writer = writer, None
                closing.close()  # every tensor written; raises CaptureError if one could not be
            place = (folder, local, ranks, shared)
            send_run(
                recorder,
                result,
                session,
                run,
                place,
                data_dir,
                server,
                token,
                _pair,
                against,
                role=role,
                new_session=new_session and server is not None,
            )
        finally:
            release_run(writer, local, ranks, shared, folder)
        return result


@contextmanager
def record(
    model: torch.nn.Module,
    *,
    level: Level = "module",
    values: Values = "full",
    modules: str | Sequence[str] = (),
    last: str | None = None,
    hashes: bool = False,
    hash_until: str | None = None,
    stop: bool = False,
) -> Iterator[HeldRun]:
    """Record `model`'s forward passes inside the block as `capture` with the same `level`, `values` and `modules`
    would, storing nothing: the run is held in memory (with values="full", a copy of each tensor) until
    `HeldRun.store` stores it. `last` names the last tensor wanted: those after it, the model's outputs included,
    are left out, listed in `skipped` and said in a note on the run. With `hashes`, every tensor a capture of every
    module (and, at level "op", of every op) would record, up to `hash_until` (where None, to the end), is hashed as
    its summary's content hash is (`sketches.fold64_sketch`), into `HeldRun.hashes`, in the same pass: to check that
    a model gives the same tensors on another call. With `stop` (and `last`, and with `hashes` `hash_until`, given),
    the forward itself is stopped once the last tensor wanted is recorded and hashed: an exception of the capture's
    own is raised out of the model's call by the next hook or op, and caught as the block ends, so nothing in the
    block after that call runs (and the call returns nothing); a note on the run says so. Nothing is held when the
    block raises."""
    check_level_and_values(level, values)
    patterns = [modules] if isinstance(modules, str) else list(modules)
    model, compiled = compiled_modules(model)
    root_name = type(model).__name__
    held = HeldValues() if values == "full" else None
    result = CaptureResult("", "")
    recorder = Recorder(Path(), root_name, patterns, held, result)
    recorder.last = last
    if held is not None:
        recorder.on_tensor = lambda name, _: held.names.append(name)
    checker: Recorder | None = None
    if hashes:
        # each hash computed in the hook, from the tensor as it is then, as its summary is (the summary's own pass:
        # the compiled kernel sums the hash with the statistics)
        checker = Recorder(Path(), root_name, [], None, CaptureResult("", ""), hashes={})
        checker.last = hash_until
    if stop and last is not None and (checker is None or hash_until is not None):

        def done() -> bool:
            return recorder.stopped and (checker is None or checker.stopped)

        recorder.done = done
        if checker is not None:
            checker.done = done
    watching = ExitStack()
    collecting = ExitStack()  # the collector leaves the process's objects alone while the run is recorded
    handles = hook_model(model, recorder, level, compiled=compiled)
    try:
        collecting.enter_context(existing_objects_frozen())
        if checker is not None:
            handles += hook_model(model, checker, level, compiled=compiled)
        if level == "op":
            watching.enter_context(OpMode(recorder if checker is None else Both(recorder, checker)))
        run = HeldRun(recorder, result, held)
        try:
            yield run
        except Stop:  # everything wanted recorded: the rest of the forward was not run
            recorder.halted = True
        watching.close()
        for handle in handles:
            handle.remove()
        handles = []
        end_recording(recorder, level)
        result.tensors, result.skipped = recorder.count, recorder.skipped
        if checker is not None:
            checker.settle()
            assert checker.hashes is not None
            run.hashes = checker.hashes
    finally:
        watching.close()
        for handle in handles:
            handle.remove()
        collecting.close()
