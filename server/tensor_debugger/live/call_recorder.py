"""The hooks' state while a model runs: the call tree being built, the tensors handed on, the summaries made."""

from __future__ import annotations

import fnmatch
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.module_tracker import ModuleTracker

from tensor_debugger.ingest.traces import FULL_SUFFIX
from tensor_debugger.live.capture_types import CaptureResult, Level
from tensor_debugger.live.module_names import CallNames
from tensor_debugger.live.ops import module_caller, user_code_skips
from tensor_debugger.live.parameters import ForwardParameters, forward_parameters
from tensor_debugger.live.safetensors_files import safetensors_codes
from tensor_debugger.live.summary_cache import Summaries, Summary
from tensor_debugger.live.writer import CaptureWriter


class Stop(BaseException):
    """Raised out of a forward by `record(stop=True)`'s hooks once everything wanted is recorded, and caught by
    `record` as its block ends. Not an Exception: a model's own `except Exception` does not swallow it, and torch
    runs no `always_call` hook for it."""


@dataclass
class Scope:
    """A module being called: its call's name, whether its ops are recorded, how often each op was called in it."""

    call: str
    ops: bool
    compiled: bool = False  # inside a module that runs compiled: what runs there is the graph, not the model's code
    counts: dict[str, int] = field(default_factory=dict)


class Recorder:
    """The hooks' state: the call tree being built and the files written."""

    def __init__(
        self,
        folder: Path,
        root_name: str,
        patterns: Sequence[str],
        writer: CaptureWriter | HeldValues | None,
        result: CaptureResult,
        hashes: dict[str, str] | None = None,
    ) -> None:
        self.folder = folder
        self.result = result
        self.on_tensor: Callable[[str, torch.Tensor], None] | None = None
        self.root_name = root_name
        self.patterns = patterns
        self.writer = writer
        self.files: list[str] = []  # the tensors' file names, in call order
        self.stack: list[dict[str, Any]] = []  # the trace's JSON nodes being written (ingest/traces.py reads them)
        self.called_from: list[str | None] = []  # each of `stack`'s calls, the line that called its module
        self.signatures: dict[str, ForwardParameters | None] = {}  # each module's `forward`'s, by path, read once
        self.root: dict[str, Any] | None = None
        self.called_again = False  # the model called more than once: `root` holds each call's node
        self.calls: dict[str, int] = {}
        self.names = CallNames()  # the module calls under way, by the name each is recorded under
        self.count = 0
        self.skipped: list[str] = []
        self.scopes: list[Scope] = []  # with level="op": every module being called, innermost last
        self.ops = 0
        self.grads = 0
        self.notes: list[str] = []  # what the capture could not see, said on the run
        self.compiled_calls: dict[str, None] = {}  # modules that ran compiled, in call order
        # with backward=True: the recorded modules whose output torch's full backward hooks cannot see (neither a
        # tensor nor a tuple: a ModelOutput, a dict), with its type's name, in call order
        self.unseen_grads: dict[str, str] = {}
        # the modules called during a backward pass (activation checkpointing's recomputation), how often: the
        # outermost of each recomputation (a checkpointed decoder layer, not its own modules); how deep it is now
        self.recomputed: dict[str, int] = {}
        self.recomputing = 0
        # never entered: only its `is_bw`, whether autograd's backward pass is running on this thread (torch's public
        # way to ask it; on a GPU the pass, recomputation included, runs on autograd's own threads, where it is asked)
        self.autograd = ModuleTracker()
        self.skip = user_code_skips()  # the frames that are not the user's code (`module_caller`)
        self.busy = False  # in a hook: torch calls made here are the recorder's, not the model's
        # with values="summary": each tensor's, computed once while it is unchanged; with `hashes` (a hash-only
        # recorder, checking that a model repeats a call): each tensor's summary's hash, by name, in call order, in
        # place of its summary
        self.hashes = hashes
        self.summaries = Summaries()
        self.pending: list[tuple[str, dict[str, Any], Summary]] = []  # summaries not yet in the result
        self.last: str | None = None  # the last tensor wanted (values="full", or hash-only); none after it is recorded
        self.stopped = False
        self.left_out = 0  # tensors after `last`
        # `record(stop=True)`: whether everything wanted is recorded, so that the forward may stop (`Stop`), and
        # whether it was stopped
        self.done: Callable[[], bool] | None = None
        self.halted = False

    def halt_if_done(self) -> None:
        """Stop the forward (raise `Stop` out of it) where everything wanted is recorded: called as any hook of
        the model fires, or an op is recorded, before it does anything, so the hooks that recorded the last tensor
        wanted have all finished."""
        if self.done is not None and self.done():
            raise Stop

    def wanted(self, path: str) -> bool:
        if not self.patterns:
            return True
        short = path.partition(".")[2]
        return any(fnmatch.fnmatchcase(path, p) or fnmatch.fnmatchcase(short, p) for p in self.patterns)

    def enter(self, path: str, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """Begin a node for this call of the module at `path`; returns the call's name. The node's `caller`, and
        its inputs' source, is the line that called the module (`module_caller`), where one is outside torch; each
        input's entry has the parameter of the module's `forward` its argument binds to, where known."""
        self.calls[path] = self.calls.get(path, 0) + 1
        call = path if self.calls[path] == 1 else f"{path}#{self.calls[path]}"
        caller = module_caller(sys._getframe(1), self.skip)
        if path not in self.signatures:
            self.signatures[path] = forward_parameters(module)
        bound = self.signatures[path]
        inputs: dict[str, Any] = {}
        if args:
            inputs["args"] = [
                self.serialize(
                    v, f"{call}_inputs_args_{i}", source=caller, parameter=bound.of_argument(i) if bound else None
                )
                for i, v in enumerate(args)
            ]
        if kwargs:
            inputs["kwargs"] = {
                str(k): self.serialize(
                    v, f"{call}_inputs_kwargs_{k}", source=caller, parameter=bound.of_keyword(k) if bound else None
                )
                for k, v in kwargs.items()
            }
        node = {"module_path": call, "inputs": inputs, "children": []}
        if caller is not None:
            node["caller"] = caller
        self.called_from.append(caller)
        if self.stack:
            self.stack[-1]["children"].append(node)
        elif self.root is None:
            self.root = node
        else:  # the model called again inside the block (generate's forwards, a loop): every call kept, in order,
            # under one root node of the model's path holding no tensors of its own (each call's are its node's)
            if not self.called_again:
                self.root = {"module_path": self.root_name, "children": [self.root]}
                self.called_again = True
            self.root["children"].append(node)
        self.stack.append(node)
        return call

    def recomputed_call(self, is_model: bool) -> bool:
        """Whether a module call starting now is a recomputation: a call inside one (`recomputing`), or a call of a
        module inside the model (not the model itself) while no call of the model is under way, after one was, made
        by a backward pass. Activation checkpointing (`torch.utils.checkpoint`, use_reentrant True or False) runs
        the forward of the modules it checkpoints again during the backward pass, after the model's forward
        returned. The same call made by the user's code (`model.lm_head(h)` after `model(x)`) is a call of its own,
        recorded: no backward pass is running then."""
        if self.recomputing > 0:
            return True
        return not is_model and not self.stack and self.root is not None and bool(self.autograd.is_bw)

    def enter_recomputed(self, path: str, level: Level) -> None:
        """A call of the module at `path` that a backward pass makes (`recomputing`): counted, not recorded as a
        call (it would be `{path}#2`, a call the model did not make, left without partner against a model that
        does not checkpoint), and with level="op" its ops not recorded either. `leave_recomputed` ends it."""
        if not self.recomputing:
            self.recomputed[path] = self.recomputed.get(path, 0) + 1
        self.recomputing += 1
        if level == "op":
            self.scopes.append(Scope(path, False))

    def leave_recomputed(self, level: Level) -> None:
        self.recomputing -= 1
        if level == "op":
            self.scopes.pop()

    def leave(self, output: Any) -> None:
        node = self.stack.pop()
        at = self.called_from.pop()
        node["outputs"] = self.serialize(output, f"{node['module_path']}_outputs", called_at=at)

    def recording(self) -> bool:
        """Whether an op called now is recorded: the innermost module's ops are, and it does not run compiled (a
        compiled graph's ops are aten's, or none at all with inductor: not the model's; a note says so)."""
        return bool(self.scopes) and self.scopes[-1].ops and not self.scopes[-1].compiled

    def record_op(self, op: str, source: str | None, output: Any) -> None:
        """An op the forward called (`ops.OpMode`): a node of the innermost module's call, if that module's ops are
        recorded and the op returned tensors."""
        self.halt_if_done()
        if not self.recording() or not _holds_tensor(output):
            return
        scope = self.scopes[-1]  # recorded, so also the innermost node of the tree: self.stack[-1]
        scope.counts[op] = number = scope.counts.get(op, 0) + 1
        name = f"{scope.call}/{op}#{number}"
        stem = f"op{self.ops:06d}"
        self.ops += 1
        node = {
            "module_path": name,
            "op": op,
            "source": source,
            "outputs": self.serialize(output, f"{name}_outputs", stem, source),
        }
        self.stack[-1]["children"].append(node)

    def record_grad(self, name: str, value: Any) -> None:
        """A gradient the backward pass computed (`backward=True`): a node of the root's, in the order the backward
        computed them, named `name` (`{module}/grad_output`, `{module}/grad_input`, `{parameter}/grad`; `#2` for
        the second time the same one is computed)."""
        if self.root is None:
            return
        if isinstance(value, tuple) and len(value) == 1:
            value = value[0]
        self.calls[name] = self.calls.get(name, 0) + 1
        call = name if self.calls[name] == 1 else f"{name}#{self.calls[name]}"
        stem = f"grad{self.grads:06d}"
        self.grads += 1
        node = {"module_path": call, "outputs": self.serialize(value, f"{call}_outputs", stem)}
        self.root["children"].append(node)

    def serialize(
        self,
        value: Any,
        name: str,
        stem: str | None = None,
        source: str | None = None,
        called_at: str | None = None,
        parameter: str | None = None,
    ) -> Any:
        """The trace JSON's entry for `value`, its tensors handed to the writer (with values="summary": summarised
        here, on their device); mirrors the debugger's layout. Files are named `name` (or `stem`, where given) with
        the place's suffixes; `name` is the tensor's name in the run. `source`: an op's caller; `called_at`: a
        module call's (its inputs and outputs), kept apart in the result (a tensor with a source is an op's);
        `parameter`: a module input's parameter (`live/parameters.py`), in its entry and in the result."""
        stem = stem or name
        if isinstance(value, torch.Tensor):
            if value.dtype not in safetensors_codes():
                self.skipped.append(f"{name}: dtype {value.dtype} cannot be captured")
                return repr(value.dtype)
            if self.writer is None:  # values="summary"
                if not _has_storage(value):
                    self.skipped.append(f"{name}: a tensor without storage")
                    return repr(value.dtype)
                if self.stopped:  # hash-only, after `last`
                    self.left_out += 1
                    return repr(value.dtype)
                self.stopped = name == self.last
                entry: dict[str, Any] = {"shape": repr(value.shape), "dtype": repr(value.dtype), "summary": None}
                if parameter is not None:
                    entry["parameter"] = self.result.parameters[name] = parameter
                self.pending.append((name, entry, self.summaries.sketch(value)))
                if source is not None:
                    self.result.sources[name] = source
                if called_at is not None:
                    self.result.called_at[name] = called_at
                self.count += 1
                return entry  # its summary is filled in by `settle`
            if self.stopped:
                self.skipped.append(f"{name}: after {self.last}, the last tensor asked for")
                self.left_out += 1
                return repr(value.dtype)
            self.stopped = name == self.last
            if self.on_tensor is not None:
                self.on_tensor(name, value)
            file = f"{stem}.safetensors"
            self.writer.submit(self.count, file, value)
            self.files.append(file)
            self.count += 1
            written = {"shape": repr(value.shape), "dtype": repr(value.dtype), "value": f"./{file}"}
            if parameter is not None:
                written["parameter"] = self.result.parameters[name] = parameter
            return written
        if isinstance(value, list | tuple):
            return [
                self.serialize(v, f"{name}_{i}", f"{stem}_{i}", source, called_at, parameter)
                for i, v in enumerate(value)
            ]
        if isinstance(value, dict):  # ModelOutput is a dict too
            return {
                str(k): self.serialize(v, f"{name}_{k}", f"{stem}_{k}", source, called_at, parameter)
                for k, v in value.items()
            }
        return type(value).__name__ if value is not None else "None"

    def settle(self) -> None:
        """Every summary put in its tensor's entry of the trace JSON and in the result (or, hash-only, its hash in
        `hashes`), in call order."""
        for name, entry, (summary, _) in self.pending:
            if self.hashes is not None:
                self.hashes[name] = summary.hash
                continue
            entry["summary"] = summary.to_json(compact=True)  # its sample one string: json writes and reads it fast
            self.result.summaries[name] = summary
        self.pending.clear()

    def tree(self) -> tuple[str, dict[str, Any]]:
        """The trace JSON's file name and content (ingest/traces.py reads it)."""
        root = {**(self.root or {"module_path": self.root_name}), "complete": True}  # no layer pruned: traces.py
        if self.notes:
            root["notes"] = self.notes
        if self.patterns or self.last is not None:  # what was asked for: the rest of the model was not recorded
            root["scope"] = {"modules": list(self.patterns), "last": self.last}
        return f"{self.root_name}{FULL_SUFFIX}", root

    def write_tree(self) -> Path:
        name, root = self.tree()
        path = self.folder / name
        path.write_text(json.dumps(root), encoding="utf-8")  # no indent: json's C encoder writes it
        return path


def _holds_tensor(value: Any) -> bool:
    """Whether `value` is or holds a tensor with values to copy: not one a transform such as torch.vmap wraps
    (transformers builds attention masks under vmap), nor a meta or fake tensor, which have no storage."""
    if isinstance(value, torch.Tensor):
        return _has_storage(value)
    return isinstance(value, list | tuple) and any(_holds_tensor(v) for v in value)


def _has_storage(tensor: torch.Tensor) -> bool:
    if tensor.device.type == "meta":
        return False
    try:
        tensor.untyped_storage()
    except (NotImplementedError, RuntimeError):  # "Cannot access storage of BatchedTensorImpl"
        return False
    return True


class HeldValues:
    """A `record`ed run's tensors (values="full"), each copied as its hook fires and kept, on its device, until the
    run is stored (`HeldRun.store`)."""

    def __init__(self) -> None:
        self.names: list[str] = []  # the tensors' names in the run, in call order
        self.jobs: list[tuple[int, str, torch.Tensor]] = []  # (index, file, copy), as a writer is handed them

    def submit(self, index: int, name: str, tensor: torch.Tensor) -> None:
        self.jobs.append((index, name, tensor.detach().clone()))


class Both:
    """The op sink of two recorders hooked on the same model at once: busy while either's hooks run (the torch
    calls of one recorder's hooks are not the model's for the other either)."""

    def __init__(self, first: Recorder, second: Recorder) -> None:
        self.recorders = (first, second)

    @property
    def busy(self) -> bool:
        return any(r.busy for r in self.recorders)

    @busy.setter
    def busy(self, value: bool) -> None:
        for r in self.recorders:
            r.busy = value

    def recording(self) -> bool:
        return any(r.recording() for r in self.recorders)

    def record_op(self, op: str, source: str | None, output: Any) -> None:
        for r in self.recorders:
            r.record_op(op, source, output)  # each records it only where its innermost module's ops are recorded
