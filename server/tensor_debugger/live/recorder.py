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
recomputation) is not recorded again, nor its ops: a note on the run says which (`_Recorder.recomputed_call`).

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
import functools
import json
import shutil
import struct
import sys
import tempfile
import threading
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import torch
from torch.utils.module_tracker import ModuleTracker

from tensor_debugger.engine.summary_compare import Sketch
from tensor_debugger.ingest.safetensors_files import SAFETENSORS_DTYPES
from tensor_debugger.ingest.sketches import fold64_sketch, reshaped
from tensor_debugger.ingest.traces import FULL_SUFFIX
from tensor_debugger.ingest.writer import WritePools
from tensor_debugger.live.collector import existing_objects_frozen
from tensor_debugger.live.module_names import CallNames, aliases
from tensor_debugger.live.ops import OpMode, module_caller, user_code_skips
from tensor_debugger.live.parameters import ForwardParameters, forward_parameters
from tensor_debugger.live.ranks import (
    Ranks,
    gather_counts,
    process_ranks,
    rank_folder,
    send_from_rank0,
    shared_staging,
)
from tensor_debugger.live.roles import parse_role
from tensor_debugger.live.writer import DEFAULT_HOST_MEMORY, CaptureWriter, Job, Sink, StoreSink
from tensor_debugger.store.dtypes import torch_to_storage

if TYPE_CHECKING:
    from tensor_debugger.ingest.runs import PendingRun
    from tensor_debugger.services import Services
    from tensor_debugger.settings import Settings

WRITE_CHUNK_BYTES = 16 * 1024 * 1024  # written to a file this much at a time
Level = Literal["module", "op"]
LEVELS: tuple[Level, ...] = ("module", "op")
Values = Literal["full", "summary"]
VALUES: tuple[Values, ...] = ("full", "summary")


@functools.cache
def safetensors_codes() -> dict[torch.dtype, str]:
    """torch dtype -> safetensors' code: the table ingest reads with (`safetensors_files.SAFETENSORS_DTYPES`), turned
    round, so that whatever capture writes, ingest reads."""
    return {
        getattr(torch, name): code for code, name in SAFETENSORS_DTYPES.items() if hasattr(torch, name) and code != "F4"
    }  # F4 counts 4-bit values; torch's float4 tensor, byte pairs


@dataclass
class CaptureResult:
    """Filled in when the block ends: where the run went and how many tensors it holds."""

    session: str
    run: str
    tensors: int = 0
    session_id: int | None = None
    run_id: int | None = None
    skipped: list[str] = field(default_factory=list)  # values left out and why ("...: a str, not a tensor")
    # with values="summary": each tensor's summary, by its name in the run, in call order
    summaries: dict[str, Sketch] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)  # a captured op's tensors' callers, by name
    # with values="summary": a module call's inputs' and outputs' names, each with the line of the user's code that
    # called the module ("<file>:<line>", the innermost frame outside torch, as an op's source): where a module's
    # input is the first divergence, that line passed it
    called_at: dict[str, str] = field(default_factory=dict)
    # a module call's inputs' names, each with the parameter of the module's `forward` its argument binds to (where
    # the signature could be read: `live/parameters.py`), as the run stores it: what pairs `attn(x=h)` with `attn(h)`
    parameters: dict[str, str] = field(default_factory=dict)
    rank: int | None = None  # inside torch.distributed: this process's rank (tensors, skipped: all ranks')


def write_safetensors(path: Path, tensor: torch.Tensor, chunk_bytes: int = WRITE_CHUNK_BYTES) -> None:
    """`tensor` as a safetensors file holding the one key "data", copied to the host a chunk at a time."""
    code = safetensors_codes().get(tensor.dtype)
    if code is None:
        raise TypeError(f"dtype {tensor.dtype} cannot be captured")
    flat = tensor.detach().reshape(-1)
    nbytes = flat.numel() * flat.element_size()
    header = json.dumps({"data": {"dtype": code, "shape": list(tensor.shape), "data_offsets": [0, nbytes]}})
    encoded = header.encode() + b" " * (-len(header) % 8)
    step = max(1, chunk_bytes // max(1, flat.element_size()))
    with path.open("wb") as f:
        f.write(struct.pack("<Q", len(encoded)) + encoded)
        for start in range(0, flat.numel(), step):
            f.write(torch_to_storage(flat[start : start + step]).data)  # to the host, raw bits


class _Stop(BaseException):
    """Raised out of a forward by `record(stop=True)`'s hooks once everything wanted is recorded, and caught by
    `record` as its block ends. Not an Exception: a model's own `except Exception` does not swallow it, and torch
    runs no `always_call` hook for it."""


@dataclass
class _Scope:
    """A module being called: its call's name, whether its ops are recorded, how often each op was called in it."""

    call: str
    ops: bool
    compiled: bool = False  # inside a module that runs compiled: what runs there is the graph, not the model's code
    counts: dict[str, int] = field(default_factory=dict)


class _Recorder:
    """The hooks' state: the call tree being built and the files written."""

    def __init__(
        self,
        folder: Path,
        root_name: str,
        patterns: Sequence[str],
        writer: CaptureWriter | _HeldValues | None,
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
        self.scopes: list[_Scope] = []  # with level="op": every module being called, innermost last
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
        self.summaries = _Summaries()
        self.pending: list[tuple[str, dict[str, Any], _Summary]] = []  # summaries not yet in the result
        self.last: str | None = None  # the last tensor wanted (values="full", or hash-only); none after it is recorded
        self.stopped = False
        self.left_out = 0  # tensors after `last`
        # `record(stop=True)`: whether everything wanted is recorded, so that the forward may stop (`_Stop`), and
        # whether it was stopped
        self.done: Callable[[], bool] | None = None
        self.halted = False

    def halt_if_done(self) -> None:
        """Stop the forward (raise `_Stop` out of it) where everything wanted is recorded: called as any hook of
        the model fires, or an op is recorded, before it does anything, so the hooks that recorded the last tensor
        wanted have all finished."""
        if self.done is not None and self.done():
            raise _Stop

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
            self.scopes.append(_Scope(path, False))

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


class _Summaries:
    """Summaries (`sketches.fold64_sketch`: a "fold64" hash on every device) of the tensors met, each computed as its
    hook fires, on the caller's thread, so that a tensor met again unchanged (a module's output is its last op's, its
    input the previous module's output) is not read again: kept by the tensor object, with its version counter (which
    every in-place change of it or of a view of it advances) and a weak reference (so that no tensor is kept alive,
    and a new tensor at a freed one's address is not taken for it). Inference tensors (`torch.inference_mode`) have
    no version counter: theirs are computed every time.

    A CPU view of a tensor summarised (a `view`, `reshape`, `unsqueeze`, ... of it or of the same base) that starts
    at the same byte, has as many elements of the same dtype and reads them in the same steps (`_steps`: contiguous
    ones, or a strided q split from a fused projection and its view as heads) holds the same bytes in the same
    order: its summary is that tensor's with its own shape (`sketches.reshaped`: the same statistics and sample, the
    hash of the new shape from the same sum of words), while neither was changed in place (their version counter,
    shared, is the one the summary was made at)."""

    def __init__(self) -> None:
        self.known: dict[int, tuple[weakref.ref[torch.Tensor], int, _Summary]] = {}
        # CPU tensors summarised, by (first byte's address, elements, dtype, steps: `_span`): the latest of each
        self.spans: dict[_Span, tuple[weakref.ref[torch.Tensor], int, _Summary]] = {}

    def sketch(self, tensor: torch.Tensor) -> _Summary:
        key = id(tensor)
        try:
            version = tensor._version
        except RuntimeError:  # "Inference tensors do not track version counter"
            return fold64_sketch(tensor)
        known = self.known.get(key)
        if known is not None and known[0]() is tensor and known[1] == version:
            return known[2]
        span = _span(tensor)
        summary = self._alias(tensor, span, version) if span is not None else None
        summary = summary or fold64_sketch(tensor)
        ref = weakref.ref(tensor, functools.partial(self._forget, key, span))
        self.known[key] = (ref, version, summary)
        if span is not None:
            self.spans[span] = (ref, version, summary)
        return summary

    def _alias(self, tensor: torch.Tensor, span: _Span, version: int) -> _Summary | None:
        """The summary of `tensor` from that of a tensor of the same span and base, unchanged since (see the class
        docstring); None where there is none."""
        known = self.spans.get(span)
        other = known[0]() if known is not None else None
        if known is None or other is None or _root(other) is not _root(tensor) or known[1] != version:
            return None
        summary, total = known[2]
        if total is None:
            return None
        return reshaped(summary, total, tuple(tensor.shape), tensor.element_size()), total

    def _forget(self, key: int, span: _Span | None, ref: weakref.ref[torch.Tensor]) -> None:
        known = self.known.get(key)
        if known is not None and known[0] is ref:
            del self.known[key]
        spanned = self.spans.get(span) if span is not None else None
        if span is not None and spanned is not None and spanned[0] is ref:
            del self.spans[span]


# A summary, and where the compiled kernel summed its "fold64" hash, that sum (`sketches.fold64_sketch`).
_Summary = tuple[Sketch, int | None]
_Span = tuple[int, int, torch.dtype, tuple[tuple[int, int], ...]]  # `_span`


def _span(tensor: torch.Tensor) -> _Span | None:
    """A CPU tensor's (first byte's address, elements, dtype, the steps its elements are read in: `_steps`); None
    for any other, an empty one, or a lazy conjugate or negation (`x.H`, `x.conj()`: not the values its bytes hold)."""
    if tensor.device.type != "cpu" or tensor.numel() == 0 or tensor.is_conj() or tensor.is_neg():
        return None
    return (tensor.data_ptr(), tensor.numel(), tensor.dtype, _steps(tensor.shape, tensor.stride()))


def _steps(shape: Sequence[int], strides: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """The (size, stride) of each dimension with dimensions of size 1 left out and each dimension merged into the one
    before it where it continues it (stride before = size * stride): two tensors from the same first byte with the
    same steps read the same elements in the same order (a contiguous one's are `((numel, 1),)`; q split from a
    fused projection, (1, 256, 768) of stride 2304, and its view as heads, (1, 256, 12, 64), are one; transposed,
    not)."""
    steps: list[tuple[int, int]] = []
    for size, stride in zip(shape, strides, strict=True):
        if size == 1:
            continue
        if steps and steps[-1][1] == size * stride:
            steps[-1] = (steps[-1][0] * size, stride)
        else:
            steps.append((size, stride))
    return tuple(steps)


def _root(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor a view was made from (its storage's and version counter's owner), else the tensor itself."""
    base = tensor._base
    return base if base is not None else tensor


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


_F = TypeVar("_F", bound=Callable[..., Any])


def _eager(hook: _F) -> _F:
    """`hook`, run as it is where torch.compile meets it (between its graphs, on real tensors), never traced.

    `torch.compiler.disable` imports torch._dynamo (about 1.5 s of CPU the first time, most of a plain model's first
    capture); where torch.compile has not been used in this process (torch._dynamo not imported: no module of the
    model compiled, wrapped or in place, since either imports it), there is nothing to keep the hook from, and it is
    returned as it is. A torch.compile first called after the hooks are made (inside the block) would trace them."""
    if "torch._dynamo" not in sys.modules:
        return hook
    eager: _F = torch.compiler.disable(hook)  # type: ignore[no-untyped-call]
    return eager


def _hook(
    model: torch.nn.Module, recorder: _Recorder, level: Level, backward: bool = False, compiled: Sequence[str] = ()
) -> list[torch.utils.hooks.RemovableHandle]:
    """Hooks on the modules recorded (the model itself always); with level "op", on every module, so that each op
    is known to be inside the innermost (and recorded only where that module is). With `backward`, the recorded
    modules' gradients too (`_hook_backward`)."""
    handles = []
    shared = aliases(model, recorder.root_name)  # modules of several names: each call named by its slot
    for name, module in model.named_modules():
        path = recorder.root_name if not name else f"{recorder.root_name}.{name}"
        names = shared.get(id(module), (path,))
        wanted = any(recorder.wanted(p) for p in names)  # a shared module: recorded from the slots `modules=` say
        node = module is model or wanted
        runs_compiled = name in compiled
        if not node and level == "module":
            continue

        def pre(
            called: torch.nn.Module,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            path: str = path,
            names: tuple[str, ...] = names,
            node: bool = node,
            wanted: bool = wanted,
            runs_compiled: bool = runs_compiled,
            is_model: bool = module is model,
        ) -> None:
            recorder.halt_if_done()
            if recorder.recomputed_call(is_model):
                recorder.enter_recomputed(path, level)
                return
            recorder.busy = True
            try:
                named = recorder.names.enter(names)
                if len(names) > 1:
                    wanted = recorder.wanted(named)
                    node = recorder.names.entered[-1].recorded = is_model or wanted
                call = recorder.enter(named, called, args, kwargs) if node else named
                if level == "op":
                    inside = runs_compiled or bool(recorder.scopes and recorder.scopes[-1].compiled)
                    recorder.scopes.append(_Scope(call, wanted, inside))
                    if runs_compiled:
                        recorder.compiled_calls.setdefault(path, None)
            finally:
                recorder.busy = False

        def post(
            _: torch.nn.Module,
            args: tuple[Any, ...],
            kwargs: dict[str, Any],
            output: Any,
            node: bool = node,
            path: str = path,
            grads: bool = backward and node,
        ) -> None:
            recorder.halt_if_done()
            if recorder.recomputing:
                recorder.leave_recomputed(level)
                return
            if grads and not isinstance(output, torch.Tensor | tuple) and torch.is_grad_enabled():
                # torch's Module call wraps only a tensor or a tuple for the backward hooks (it warns otherwise)
                recorder.unseen_grads.setdefault(path, type(output).__name__)
            recorder.busy = True
            try:
                node = recorder.names.leave(node)
                if level == "op":
                    recorder.scopes.pop()
                if node:
                    recorder.leave(output)
            finally:
                recorder.busy = False

        # inside a compiled region, torch.compile runs the hooks as they are, between its graphs, on real tensors
        handles.append(module.register_forward_pre_hook(_eager(pre), with_kwargs=True))
        handles.append(module.register_forward_hook(_eager(post), with_kwargs=True, always_call=True))
        if backward and node:
            handles.extend(_hook_backward(module, path, recorder))
    return handles


def _hook_backward(module: torch.nn.Module, path: str, recorder: _Recorder) -> list[torch.utils.hooks.RemovableHandle]:
    """The gradients of a recorded module as the backward pass computes them: of its outputs (before its own
    backward runs), of its inputs (after), and of each of its own parameters once accumulated."""

    @_eager
    def record(name: str, value: Any) -> None:
        recorder.busy = True
        try:
            recorder.record_grad(name, value)
        finally:
            recorder.busy = False

    def grad_output(_: torch.nn.Module, grads: tuple[torch.Tensor | None, ...]) -> None:
        record(f"{path}/grad_output", grads)

    def grad_input(
        _: torch.nn.Module, grads: tuple[torch.Tensor | None, ...], __: tuple[torch.Tensor | None, ...]
    ) -> None:
        record(f"{path}/grad_input", grads)

    handles = [module.register_full_backward_pre_hook(grad_output), module.register_full_backward_hook(grad_input)]
    for name, parameter in module.named_parameters(recurse=False):
        if parameter.requires_grad:

            def accumulated(p: torch.Tensor, name: str = f"{path}.{name}/grad") -> None:
                record(name, p.grad)

            handles.append(parameter.register_post_accumulate_grad_hook(accumulated))  # type: ignore[no-untyped-call]
    return handles


class _FileSink(Sink):
    """Writes each tensor as the safetensors file the recorder named, in the trace folder (to be uploaded)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def write(self, job: Job, pools: WritePools) -> None:
        write_safetensors(self.folder / job.name, job.host)


class _LocalRun:
    """A run of the local data directory that the capture writes into as it goes: begun (status "ingesting") when
    the block opens, made ready from the trace when it ends, removed if it never is.

    The data dir is opened (its database made first where it is new: file syncs, the schema) and the run begun on a
    thread of its own, started here, while the block runs: the first use of the run (`sink`, `finish`) waits for
    it, and raises what opening or beginning raised. A capture with values="full" asks for the sink at once (its
    tensors go into the run's arrays as they come), so its data dir is opened before the block runs, as before;
    with values="summary" nothing is written before the block ends, so the opening overlaps the forward, and a data
    dir that cannot be used is said when the block ends, with nothing stored. The labels and the settings are read
    here, at once: a wrong one is said before the block runs."""

    def __init__(
        self, session: str, run: str, data_dir: str | Path | None, against: str | None = None, role: str | None = None
    ) -> None:
        from tensor_debugger.settings import Settings
        from tensor_debugger.store.catalog import parse_label

        parse_label(session, "session name")
        parse_label(run, "run label")
        settings = Settings.from_environ() if data_dir is None else Settings.from_environ(data_dir=Path(data_dir))
        self.finished = False
        self._opened: tuple[Services, PendingRun, StoreSink] | None = None
        self._failure: BaseException | None = None
        self._opening = threading.Thread(
            target=self._open, args=(settings, session, run, against, role), name="capture-open", daemon=False
        )
        self._opening.start()

    def _open(self, settings: Settings, session: str, run: str, against: str | None, role: str | None) -> None:
        """Open the data dir and begin the run (on the opening thread): `_opened`, or `_failure` if either raised."""
        from tensor_debugger.services import open_services
        from tensor_debugger.store.arrays import run_prefix

        try:
            services = open_services(settings)
            try:
                pending = services.ingestor.begin(session, run, [run], role=role, against=against)
                sink = StoreSink(
                    services.store, run_prefix(pending.run_id), settings.chunk_bytes, services.context.kernel
                )
            except BaseException:
                services.close()
                raise
            self._opened = (services, pending, sink)
        except BaseException as exc:  # raised again, on the capture's thread, by the first use of the run
            self._failure = exc

    def _wait(self) -> tuple[Services, PendingRun, StoreSink]:
        self._opening.join()
        if self._failure is not None:
            raise self._failure
        assert self._opened is not None
        return self._opened

    @property
    def services(self) -> Services:
        return self._wait()[0]

    @property
    def pending(self) -> PendingRun:
        return self._wait()[1]

    @property
    def sink(self) -> StoreSink:
        return self._wait()[2]

    def finish(
        self, tree: tuple[str, dict[str, Any]], folder: Path, files: list[str], result: CaptureResult, pair: bool = True
    ) -> None:
        """Make the run ready: its tensors in call order, named, placed and given the module tree as ingest does
        for the same trace folder (`tree`: its JSON's name and content, read as ingest reads the file, which a
        local run need not write); with `pair`, pair the session's runs again."""
        from tensor_debugger.ingest.inputs import RunTrace, TensorFileEntry
        from tensor_debugger.ingest.traces import trace_of

        label = self.pending.run_label
        name, content = tree
        json_label = f"{label}/{name}"
        trace = trace_of(content, name, json_label, [*files, name])
        index = {file: i for i, file in enumerate(files)}
        key_path: tuple[str, ...] = ("data",)
        stored = [
            (
                TensorFileEntry(
                    folder / t.file,
                    t.relpath(t.file),
                    f"{label}/{t.file}",
                    False,
                    module_path=t.module_path,
                    place=t.place,
                    source=t.source,
                    parameter=t.parameter,
                ),
                key_path,
                self.sink.stored[index[t.file]],
            )
            for t in trace.tensors
            if t.file is not None
        ]
        self.finished = True  # complete_stored removes the run itself if it fails
        self.services.ingestor.complete_stored(self.pending, stored, [RunTrace("", json_label, trace)])
        if pair:
            self.services.plan(self.pending.session_id)
        result.session_id, result.run_id = self.pending.session_id, self.pending.run_id

    def close(self) -> None:
        """Remove the run if it was begun and not made ready, and let go of the data dir (once opened: where
        opening failed, nothing was begun, and what it raised is the first use's to say)."""
        self._opening.join()
        if self._opened is None:
            return
        services, pending, _ = self._opened
        try:
            if not self.finished:
                services.ingestor.cancel(pending)
        finally:
            services.close()


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


def _note_recomputed(recorder: _Recorder) -> None:
    """Say on the run which recorded modules were run again by a backward pass, and what of them was recorded."""
    if not recorder.recomputed:
        return
    calls = sum(recorder.recomputed.values())
    named = ", ".join(recorder.recomputed)
    recorder.notes.append(
        f"{calls} call{'s' if calls != 1 else ''} of {named} (with the modules inside) ran again during the "
        "backward pass (activation checkpointing's recomputation): not recorded as calls of their own, their "
        "tensors are those of the forward's calls; the values recomputed were not recorded, so they were not "
        "compared with the forward's"
    )


def _note_unseen_grads(recorder: _Recorder) -> None:
    """Say on the run which recorded modules' gradients torch's full backward hooks could not see."""
    for path, kind in recorder.unseen_grads.items():
        recorder.notes.append(
            f"{path} returned a {kind}, not a tensor or a tuple of tensors: torch's module backward hooks cannot "
            f"see its gradients, so {path}/grad_output and {path}/grad_input were not recorded (the gradients of "
            "its parameters and of the modules inside it were)"
        )


@contextmanager
def _quiet_backward_hook_warnings() -> Iterator[None]:
    """torch's UserWarnings about the full backward hooks `capture(backward=True)` adds, silenced while it records:
    they are about the capture's hooks, not the user's code; what they mean for the run is said in its notes
    (`_note_unseen_grads`), or is nothing to record (no input of the first module requires a gradient)."""
    with warnings.catch_warnings():
        for words in _BACKWARD_HOOK_WARNINGS:
            warnings.filterwarnings("ignore", message=words, category=UserWarning)
        yield


_BACKWARD_HOOK_WARNINGS = (
    "For backward hooks to be called, module output should be a Tensor or a tuple of Tensors",
    "Full backward hook is firing when gradients are computed with respect to module outputs since no inputs",
)


def _note_compiled(recorder: _Recorder) -> None:
    """Say on the run which modules ran compiled, whose ops op capture does not record."""
    for path in recorder.compiled_calls:
        recorder.notes.append(
            f"{path} ran compiled (torch.compile): its ops are not visible to op capture "
            "(its modules' inputs and outputs are recorded; capture the model uncompiled to see its ops)"
        )


def summarize_forward(
    model: torch.nn.Module, forward: Callable[[], Any], level: Level = "op", modules: str | Sequence[str] = ()
) -> CaptureResult:
    """Run `forward()` (a call of `model`) with the hooks of a `values="summary"` capture, storing nothing: the
    result's `summaries` (and `sources`) are all it gives."""
    result = CaptureResult("", "")
    patterns = [modules] if isinstance(modules, str) else list(modules)
    model, compiled = compiled_modules(model)
    recorder = _Recorder(Path(), type(model).__name__, patterns, None, result)
    handles = _hook(model, recorder, level, compiled=compiled)
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
    if level not in LEVELS:
        raise ValueError(f"capture level must be one of {', '.join(LEVELS)}, got {level!r}")
    if values not in VALUES:
        raise ValueError(f"capture values must be one of {', '.join(VALUES)}, got {values!r}")
    parse_role(role, run, server)
    patterns = [modules] if isinstance(modules, str) else list(modules)
    model, compiled = compiled_modules(model)
    root_name = type(model).__name__
    ranks, shared, folder = _staging(staging)
    result = CaptureResult(session, run, rank=ranks.rank if ranks is not None else None)
    local: _LocalRun | None = None
    writer: CaptureWriter | None = None
    handles: list[torch.utils.hooks.RemovableHandle] = []
    watching = ExitStack()  # with level="op": the torch function mode, active while the block runs
    recorder: _Recorder | None = None
    collecting = ExitStack()  # the collector leaves the process's objects alone until the run is stored
    try:
        collecting.enter_context(existing_objects_frozen())
        local = _LocalRun(session, run, data_dir, against, role) if server is None and ranks is None else None
        found = _session_found(server, session, token, ranks)
        if values == "full":
            writer = CaptureWriter(local.sink if local is not None else _FileSink(folder), host_memory, workers)
        recorder = _Recorder(folder, root_name, patterns, writer, result)
        recorder.on_tensor = on_tensor
        handles = _hook(model, recorder, level, backward, compiled)
        if backward:
            collecting.enter_context(_quiet_backward_hook_warnings())
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
        _ended(recorder, level)
        closing, writer = writer, None
        if closing is not None:
            closing.close()  # every tensor written; raises CaptureError if one could not be
        place = (folder, local, ranks, shared)
        _send(recorder, result, session, run, place, data_dir, server, token, _pair, against, found, role)
    finally:
        watching.close()
        for handle in handles:
            handle.remove()
        _release(writer, local, ranks, shared, folder)
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


def _session_found(server: str | None, session: str, token: str | None, ranks: Ranks | None) -> int | None:
    """The id of the server's session named `session` as a capture through it begins (on the rank that sends the
    run): its run goes into that session, and is not uploaded where it was deleted meanwhile."""
    if server is None or (ranks is not None and ranks.rank != 0):
        return None
    from tensor_debugger.live.upload import session_on

    return session_on(server, session, token)


def _staging(staging: str | Path | None) -> tuple[Ranks | None, Path | None, Path]:
    """This process's ranks (inside torch.distributed: its tensors are one shard of the run, ranks.py), the ranks'
    shared staging folder, and the folder its run's files are staged in."""
    ranks = process_ranks()
    shared = shared_staging(ranks, staging) if ranks is not None else None
    folder = rank_folder(shared, ranks) if shared is not None and ranks is not None else None
    return ranks, shared, folder or Path(tempfile.mkdtemp(prefix="capture-", dir=staging))


def _release(
    writer: CaptureWriter | None, local: _LocalRun | None, ranks: Ranks | None, shared: Path | None, folder: Path
) -> None:
    """After storing a run, or failing to: the writer cancelled (where still open), the local run closed, the staged
    files removed (rank 0 removes the ranks' folders once sent)."""
    try:
        if writer is not None:
            writer.close(cancel=True)
    finally:
        if local is not None:
            local.close()
        if shared is None or (ranks is not None and ranks.rank == 0):
            shutil.rmtree(shared or folder, ignore_errors=True)


def _ended(recorder: _Recorder, level: Level) -> None:
    """The block of a capture (or `record`) ended without raising: its summaries all in, its notes said."""
    if recorder.root is None:
        raise RuntimeError(f"capture of {recorder.root_name}: the model was not called inside the block")
    if level == "op":
        _note_compiled(recorder)
    _note_recomputed(recorder)
    if recorder.grads:
        _note_unseen_grads(recorder)
    recorder.settle()
    asked = f"modules {', '.join(recorder.patterns)}" if recorder.patterns else "every module"
    if recorder.halted:
        recorder.notes.append(
            f"recorded {asked} only, up to {recorder.last}, the last tensor of theirs: the forward was stopped "
            "after it, so nothing after it (the model's outputs among them) was recorded"
        )
    elif recorder.left_out:
        many = recorder.left_out != 1
        recorder.notes.append(
            f"recorded {asked} only, up to {recorder.last}, the last tensor of theirs: "
            f"{recorder.left_out} tensor{'s' if many else ''} after it (the model's outputs among them) "
            f"{'were' if many else 'was'} not recorded"
        )


_Place = tuple[Path, "_LocalRun | None", "Ranks | None", "Path | None"]  # staging folder, local run, ranks, shared


def _send(
    recorder: _Recorder,
    result: CaptureResult,
    session: str,
    run: str,
    place: _Place,
    data_dir: str | Path | None,
    server: str | None,
    token: str | None,
    pair: bool,
    against: str | None = None,
    found: int | None = None,
    role: str | None = None,
) -> None:
    """Store a recorded run whose tensors are all written: its module tree, then the run (into the local run, from
    rank 0 for the ranks, or uploaded to the server, compared against the session's run labelled `against` where
    given; into the session of id `found` where the capture found one as it began); its ids into `result`."""
    folder, local, ranks, shared = place
    result.tensors, result.skipped = recorder.count, recorder.skipped
    if local is not None:  # the trace JSON read from memory, not written: nothing else reads its file
        local.finish(recorder.tree(), folder, recorder.files, result, pair)
        return
    recorder.write_tree()
    if ranks is not None and shared is not None:
        result.tensors, result.skipped = gather_counts(ranks, recorder.count, recorder.skipped)
        result.session_id, result.run_id = send_from_rank0(
            ranks, shared, session, run, data_dir, server, token, against, found, role
        )
    else:
        assert server is not None
        from tensor_debugger.live.upload import upload_run

        result.session_id, result.run_id = upload_run(server, session, run, folder, token, against, found, role)


class _HeldValues:
    """A `record`ed run's tensors (values="full"), each copied as its hook fires and kept, on its device, until the
    run is stored (`HeldRun.store`)."""

    def __init__(self) -> None:
        self.names: list[str] = []  # the tensors' names in the run, in call order
        self.jobs: list[tuple[int, str, torch.Tensor]] = []  # (index, file, copy), as a writer is handed them

    def submit(self, index: int, name: str, tensor: torch.Tensor) -> None:
        self.jobs.append((index, name, tensor.detach().clone()))


class _Both:
    """The op sink of two recorders hooked on the same model at once: busy while either's hooks run (the torch
    calls of one recorder's hooks are not the model's for the other either)."""

    def __init__(self, first: _Recorder, second: _Recorder) -> None:
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


@dataclass
class HeldRun:
    """A run `record` recorded and holds in memory, stored by `store` as `capture` would have stored it.

    `result`: its summaries and sources (values="summary"), as a capture's; `tensors`: with values="full", each
    tensor recorded (a copy), by name, in call order; `hashes`: with `record(hashes=True)`, each tensor's content
    hash (as its summary's), by its name in a capture of every module, in call order."""

    recorder: _Recorder
    result: CaptureResult
    held: _HeldValues | None
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
    ) -> CaptureResult:
        """Store the run as run `run` of session `session`, where `capture` with the same arguments would have
        stored it, with the same tensors, summaries, module tree and notes; returns its result, ids filled in.
        `against`: the label of the session's run it is compared against (default: the session's reference);
        `role`: "noise" for a rerun, the noise floor of the run it is compared against (as `capture`'s)."""
        parse_role(role, run, server)
        recorder, result = self.recorder, self.result
        result.session, result.run = session, run
        ranks, shared, folder = _staging(staging)
        recorder.folder = folder
        result.rank = ranks.rank if ranks is not None else None
        local: _LocalRun | None = None
        writer: CaptureWriter | None = None
        try:
            local = _LocalRun(session, run, data_dir, against, role) if server is None and ranks is None else None
            if self.held is not None:
                writer = CaptureWriter(local.sink if local is not None else _FileSink(folder), host_memory, workers)
                for index, file, copy in self.held.jobs:
                    writer.submit(index, file, copy)
                closing, writer = writer, None
                closing.close()  # every tensor written; raises CaptureError if one could not be
            place = (folder, local, ranks, shared)
            _send(recorder, result, session, run, place, data_dir, server, token, _pair, against, role=role)
        finally:
            _release(writer, local, ranks, shared, folder)
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
    the forward itself is stopped once the last tensor wanted is recorded and hashed: an exception of this module's
    own is raised out of the model's call by the next hook or op, and caught as the block ends, so nothing in the
    block after that call runs (and the call returns nothing); a note on the run says so. Nothing is held when the
    block raises."""
    if level not in LEVELS:
        raise ValueError(f"capture level must be one of {', '.join(LEVELS)}, got {level!r}")
    if values not in VALUES:
        raise ValueError(f"capture values must be one of {', '.join(VALUES)}, got {values!r}")
    patterns = [modules] if isinstance(modules, str) else list(modules)
    model, compiled = compiled_modules(model)
    root_name = type(model).__name__
    held = _HeldValues() if values == "full" else None
    result = CaptureResult("", "")
    recorder = _Recorder(Path(), root_name, patterns, held, result)
    recorder.last = last
    if held is not None:
        recorder.on_tensor = lambda name, _: held.names.append(name)
    checker: _Recorder | None = None
    if hashes:
        # each hash computed in the hook, from the tensor as it is then, as its summary is (the summary's own pass:
        # the compiled kernel sums the hash with the statistics)
        checker = _Recorder(Path(), root_name, [], None, CaptureResult("", ""), hashes={})
        checker.last = hash_until
    if stop and last is not None and (checker is None or hash_until is not None):

        def done() -> bool:
            return recorder.stopped and (checker is None or checker.stopped)

        recorder.done = done
        if checker is not None:
            checker.done = done
    watching = ExitStack()
    collecting = ExitStack()  # the collector leaves the process's objects alone while the run is recorded
    handles = _hook(model, recorder, level, compiled=compiled)
    try:
        collecting.enter_context(existing_objects_frozen())
        if checker is not None:
            handles += _hook(model, checker, level, compiled=compiled)
        if level == "op":
            watching.enter_context(OpMode(recorder if checker is None else _Both(recorder, checker)))
        run = HeldRun(recorder, result, held)
        try:
            yield run
        except _Stop:  # everything wanted recorded: the rest of the forward was not run
            recorder.halted = True
        watching.close()
        for handle in handles:
            handle.remove()
        handles = []
        _ended(recorder, level)
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
