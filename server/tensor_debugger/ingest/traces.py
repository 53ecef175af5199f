"""Read Hugging Face `model_addition_debugger_context` traces: the module tree, and each tensor's module and place.

A trace folder holds `{ModelClass}_debug_tree_FULL_TENSORS.json` (and `..._SUMMARY.json`): a tree of nodes with
`module_path`, `inputs` (`args`, `kwargs`), `outputs` and `children`. Written with `use_repr=False`, every tensor
entry's `value` is a relative path such as `./LlamaForCausalLM.model.layers.0.mlp.down_proj_outputs.safetensors`
(one file per tensor, holding the key `data`); with `use_repr=True` it is the printed tensor, so only the shape, the
dtype and four summary statistics (mean, std, min, max, printed with 5 significant digits) are known.

Call order is the order of the tree: a module's inputs, its children, then its outputs. The debugger keeps outputs of
leaf modules only, and by default drops the layers between the first and the last from the JSON while their files
stay on disk: those layers are put back here by renumbering the first layer's subtree, so every file on disk finds its
place. A file the JSON never names (the root's logits) still becomes a tensor, after the module it belongs to.

A capture with `level="op"` (`live/recorder.py`) adds op nodes: `{"module_path": "<module call>/softmax#1", "op":
"softmax", "source": "<file>:<line>", "outputs": ...}`, children of the module call that ran them, in call order.
Their files have short names of their own; their tensors are named by the tree (`<module call>/softmax#1_outputs`).
A capture's module call nodes have `"caller": "<file>:<line>"`, the line that called the module: its inputs' source.
A capture's module input entries have `"parameter"`: the parameter of the module's `forward` the argument binds to
(`"x"` for `attn(h)` and for `attn(x=h)` alike; `"**mask"` for `mask=m` into a `**kwargs`, `"*2"` for the third
positional argument into a `*args`), where its signature could be read.
A capture with `values="summary"` writes no files: each tensor entry holds `"summary"`, its summary
(`engine/summary_compare.py`), in place of `"value"`. A capture's root says `"complete": true`: no layer was left
out, so none is put back (with `modules=`, the layers it did not select have no node and only some files).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath
from typing import Any

from tensor_debugger.engine.summaries import STATISTICS
from tensor_debugger.errors import FileProblem, NotATensor

FULL_SUFFIX = "_debug_tree_FULL_TENSORS.json"
SUMMARY_SUFFIX = "_debug_tree_SUMMARY.json"
TRACE_SUFFIXES = (FULL_SUFFIX, SUMMARY_SUFFIX)
MAX_TRACE_JSON_BYTES = 512 * 1024 * 1024

_LAYER_BLOCK = re.compile(r"^(?P<prefix>.*)\.(?P<number>\d+)$")
_PLACE = re.compile(r"_(?P<place>inputs_(?:args|kwargs)_.+|outputs(?:_.+)?)$")
_SHAPE = re.compile(r"\[([^\]]*)\]")
_TENSOR_REPR = re.compile(r"tensor\(\s*([^,)\s]+)")


@dataclass(frozen=True)
class ModuleNode:
    """One call of a module; `path` is its dotted module path, the root's is the model's class name."""

    path: str
    children: tuple[ModuleNode, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "children": [c.to_json() for c in self.children]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ModuleNode:
        return cls(str(data["path"]), tuple(cls.from_json(c) for c in data.get("children", [])))

    def calls(self) -> tuple[ModuleNode, ...]:
        """The model's calls this root holds, each a root of its own: itself, or, where a capture's model was called
        more than once (`generate`'s forwards, a loop of steps), the calls the recorder kept under one node of the
        model's path (`live/call_recorder.py`): its first child is the model's first call, of the same path (no module's
        child has its parent's path), then `{path}#2`, ... (and the gradients of a backward after them), each shown
        beside the others, not inside a node that is no call of the model."""
        if self.children and self.children[0].path == self.path:
            return self.children
        return (self,)

    def walk(self, depth: int = 0) -> Iterator[tuple[ModuleNode, int]]:
        yield self, depth
        for child in self.children:
            yield from child.walk(depth + 1)


@dataclass(frozen=True)
class ModuleTree:
    """A run's module calls as stored with it (a trace's, or a capture's): one root per trace, and whether its
    tensors hold element values."""

    roots: tuple[ModuleNode, ...] = ()
    values: bool = True
    scope: CaptureScope | None = None  # a capture of some modules only: what it was asked to record

    def to_json(self) -> dict[str, Any]:
        data = {"source": "hf-trace", "values": self.values, "roots": [r.to_json() for r in self.roots]}
        if self.scope is not None:
            data["scope"] = self.scope.to_json()
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> ModuleTree:
        """A run's module tree column; the empty tree where it holds none."""
        data = data or {}
        return cls(
            tuple(call for r in data.get("roots", []) for call in ModuleNode.from_json(r).calls()),
            bool(data.get("values", True)),
            CaptureScope.from_json(data.get("scope")),
        )


@dataclass(frozen=True)
class TraceTensor:
    """A tensor of the trace, in call order. `file` is its member name in the trace folder; None when the trace
    holds no values (written with use_repr=True)."""

    module_path: str
    place: str  # "inputs_args_0", "inputs_kwargs_position_ids", "outputs", "outputs_1", "outputs_logits", ...
    file: str | None
    shape: tuple[int, ...] | None = None
    dtype: str | None = None  # torch's spelling without "torch."
    stats: dict[str, float] = field(default_factory=dict)  # of the four STATISTICS, those the JSON gives
    op: str | None = None  # a captured op's function ("softmax"); None for a module's input or output
    source: str | None = None  # a captured op's caller, or the caller of a captured module it is an input of
    sketch: dict[str, Any] | None = None  # a summary capture's summary of it (`summary_compare.Sketch.to_json`)
    parameter: str | None = None  # a capture's module input: the parameter of the module's `forward` it binds to

    @property
    def name(self) -> str:
        return f"{self.module_path}_{self.place}"

    def relpath(self, file: str) -> PurePosixPath:
        """The name-giving path of its file `file`: the file's own name, but a captured op's or gradient's tensor
        (a node `{module call}/...`: no module path has a "/") is named by the tree."""
        by_tree = self.op is not None or "/" in self.module_path
        return PurePosixPath(f"{self.name}.safetensors" if by_tree else file)


@dataclass(frozen=True)
class CaptureScope:
    """What a capture was asked to record (its root's "scope"): the modules matching `modules` (glob patterns, with
    or without the model's class name, as `capture(modules=...)` takes them; empty: every module), up to the tensor
    `last` (None: to the end). Tensors outside it were not recorded by choice."""

    modules: tuple[str, ...]
    last: str | None

    def to_json(self) -> dict[str, Any]:
        return {"modules": list(self.modules), "last": self.last}

    @classmethod
    def from_json(cls, data: Any) -> CaptureScope | None:
        """The scope a module tree's "scope" says; None where it says none, or nothing valid."""
        if not isinstance(data, dict):
            return None
        modules, last = data.get("modules"), data.get("last")
        if not isinstance(modules, list) or not all(isinstance(m, str) for m in modules):
            return None
        if last is not None and not isinstance(last, str):
            return None
        return cls(tuple(modules), last) if modules or last is not None else None

    def selects(self, module_path: str) -> bool:
        """Whether the capture recorded the module at `module_path` ("Model.layers.1.attn", a call's "#2" and an
        op's "/softmax#1" ignored): the rule of `capture(modules=...)`."""
        path = re.sub(r"#\d+$", "", module_path.partition("/")[0])
        short = path.partition(".")[2]
        return not self.modules or any(fnmatchcase(path, p) or fnmatchcase(short, p) for p in self.modules)


@dataclass(frozen=True)
class Trace:
    model_class: str
    has_values: bool
    root: ModuleNode
    tensors: list[TraceTensor]  # in call order; unreferenced files on disk included
    notes: tuple[str, ...] = ()  # a capture's root "notes": what it could not see, said on the run
    scope: CaptureScope | None = None  # a capture's root "scope": what it was asked to record


def is_trace_json(name: str) -> bool:
    return name.endswith(TRACE_SUFFIXES)


def choose_trace_json(names: Collection[str]) -> str | None:
    """The JSON to read among a folder's file names: the full one if present, else the summary."""
    full = sorted(n for n in names if n.endswith(FULL_SUFFIX))
    if full:
        return full[0]
    summary = sorted(n for n in names if n.endswith(SUMMARY_SUFFIX))
    return summary[0] if summary else None


def read_trace(json_path: Path, label: str, files: Collection[str]) -> Trace:
    """The trace described by `json_path`, whose folder holds `files` (member names, the JSON's own included)."""
    if json_path.stat().st_size > MAX_TRACE_JSON_BYTES:
        raise FileProblem(label, f"trace JSON larger than {MAX_TRACE_JSON_BYTES >> 20} MiB; skipped")
    try:
        with json_path.open(encoding="utf-8") as f:
            tree = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FileProblem(label, f"not a valid trace JSON: {exc}") from exc
    return trace_of(tree, json_path.name, label, files)


def trace_of(tree: Any, json_name: str, label: str, files: Collection[str]) -> Trace:
    """The trace a trace JSON named `json_name` describes, from its content `tree` (as `json.load` reads it, or a
    capture's tree in memory, before or in place of writing it), in a folder holding `files`."""
    if not isinstance(tree, dict) or not isinstance(tree.get("module_path"), str):
        raise NotATensor(label, "not a model_addition_debugger_context trace: no root 'module_path'")
    model_class = json_name.split("_debug_tree_")[0]
    safetensors = {f for f in files if f.endswith(".safetensors")}
    if tree.get("complete") is not True:  # a capture's tree names every call; a selection of layers is not pruned
        _restore_pruned_layers(tree, safetensors)
    tensors: list[TraceTensor] = []
    root = _walk(tree, tensors, safetensors)
    notes = tuple(n for n in tree.get("notes") or () if isinstance(n, str))
    scope = CaptureScope.from_json(tree.get("scope"))
    referenced = {t.file for t in tensors if t.file is not None}
    if not referenced and not safetensors:  # use_repr=True, or the summary alone: shapes and statistics only
        return Trace(model_class, False, root, tensors, notes, scope)
    missing = [t.name for t in tensors if t.file is None]
    if missing and len(missing) == len(tensors):
        raise FileProblem(label, f"names no tensor file present in its folder (first: {missing[0]}.safetensors)")
    # a module called twice overwrites its files: the one file holds the last call, so it goes where that call was
    last = {t.file: i for i, t in enumerate(tensors) if t.file is not None}
    tensors = [t for i, t in enumerate(tensors) if t.file is not None and last[t.file] == i]
    return Trace(
        model_class, True, root, _place_unreferenced(tensors, sorted(safetensors - referenced), root), notes, scope
    )


# --- the tree -------------------------------------------------------------------------------------------------


def _walk(node: dict[str, Any], out: list[TraceTensor], files: set[str]) -> ModuleNode:
    path = str(node.get("module_path", "?")).removesuffix(" (top-level)")
    caller = node.get("caller")  # a capture's: the line that called the module, its inputs' source
    caller = caller if isinstance(caller, str) else None
    for place, entry in _flatten(node.get("inputs"), "inputs"):
        out.append(_tensor(path, place, entry, files, source=caller))
    children = tuple(_walk(c, out, files) for c in node.get("children") or () if isinstance(c, dict))
    op, source = node.get("op"), node.get("source")
    op = op if isinstance(op, str) else None
    source = source if op is not None and isinstance(source, str) else None
    for place, entry in _flatten(node.get("outputs"), "outputs"):
        out.append(_tensor(path, place, entry, files, op, source))
    return ModuleNode(path, children)


def _flatten(value: Any, place: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Tensor entries under `value`, named as the debugger names their files (lists by index, dicts by key)."""
    if isinstance(value, dict) and "shape" in value and "dtype" in value:
        yield place, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _flatten(item, f"{place}_{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _flatten(item, f"{place}_{i}")


def _tensor(
    path: str, place: str, entry: dict[str, Any], files: set[str], op: str | None = None, source: str | None = None
) -> TraceTensor:
    value = entry.get("value")
    file = None
    if isinstance(value, str) and value.endswith(".safetensors"):
        name = PurePosixPath(value).name
        file = name if name in files else None
    stats = {k: v for k in STATISTICS if (v := parse_tensor_repr(entry.get(k))) is not None}
    sketch = entry.get("summary") if isinstance(entry.get("summary"), dict) else None
    parameter = entry.get("parameter") if place.startswith("inputs_") else None
    return TraceTensor(
        path,
        place,
        file,
        parse_shape(entry.get("shape")),
        trace_dtype(entry.get("dtype")),
        stats,
        op,
        source,
        sketch,
        parameter if isinstance(parameter, str) and parameter else None,
    )


def _restore_pruned_layers(node: dict[str, Any], files: set[str]) -> None:
    """Put back the layer blocks the debugger left out of the JSON but whose files are on disk."""
    children = [c for c in node.get("children") or () if isinstance(c, dict)]
    for child in children:
        _restore_pruned_layers(child, files)
    blocks: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    for child in children:
        found = _LAYER_BLOCK.match(str(child.get("module_path", "")))
        if found and child.get("children"):
            blocks.setdefault(found["prefix"], []).append((int(found["number"]), child))
    for prefix, present in blocks.items():
        numbers = {n for n, _ in present}
        first, template = min(present, key=lambda item: item[0])
        missing = sorted({n for f in files if (n := _layer_of(f, prefix)) is not None and n not in numbers})
        for number in missing:
            clone = _renumber(copy.deepcopy(template), f"{prefix}.{first}", f"{prefix}.{number}")
            numbered = [(i, n) for i, c in enumerate(children) if (n := _number(c, prefix)) is not None]
            below = [i for i, n in numbered if n < number]
            children.insert(below[-1] + 1 if below else numbered[0][0], clone)
    if blocks:
        node["children"] = children


def _layer_of(file: str, prefix: str) -> int | None:
    head = prefix + "."
    if not file.startswith(head):
        return None
    digits = re.match(r"(\d+)[._]", file[len(head) :])
    return int(digits.group(1)) if digits else None


def _number(node: dict[str, Any], prefix: str) -> int | None:
    found = _LAYER_BLOCK.match(str(node.get("module_path", "")))
    return int(found["number"]) if found and found["prefix"] == prefix else None


def _renumber(value: Any, old: str, new: str) -> Any:
    """A copy of a layer's subtree for another layer: paths and file names renumbered, statistics dropped."""
    if isinstance(value, dict):
        out = {k: _renumber(v, old, new) for k, v in value.items() if k not in STATISTICS}
        for key in ("module_path", "value"):
            text = out.get(key)
            if isinstance(text, str):
                out[key] = re.sub(rf"^(\./)?{re.escape(old)}(?=[._]|$)", lambda m: (m[1] or "") + new, text)
        return out
    if isinstance(value, list):
        return [_renumber(v, old, new) for v in value]
    return value


def _place_unreferenced(tensors: list[TraceTensor], extra: list[str], root: ModuleNode) -> list[TraceTensor]:
    """Files on disk the JSON does not name: outputs after the last tensor of their module and its children, inputs
    before its first, at the end when their module is not in the tree."""
    ordered = list(tensors)
    known = {node.path for node, _ in root.walk()}
    for file in extra:
        stem = file.removesuffix(".safetensors")
        found = _PLACE.search(stem.rsplit(".", 1)[-1])
        if found is None:
            module, place = stem, "outputs"
        else:
            module, place = stem[: len(stem) - len(found[0])], found["place"]
        tensor = TraceTensor(module, place, file)
        inside = [
            i for i, t in enumerate(ordered) if t.module_path == module or t.module_path.startswith(module + ".")
        ]  # the module's own tensors and its children's
        if module in known and inside and place.startswith("inputs"):
            ordered.insert(inside[0], tensor)
        elif module in known and inside:
            ordered.insert(inside[-1] + 1, tensor)
        else:
            ordered.append(tensor)
    return ordered


# --- the JSON's strings ---------------------------------------------------------------------------------------


def parse_shape(text: Any) -> tuple[int, ...] | None:
    """ "torch.Size([1, 8, 32])" -> (1, 8, 32)."""
    return _shape_of(text) if isinstance(text, str) else None


@functools.lru_cache(maxsize=4096)
def _shape_of(text: str) -> tuple[int, ...] | None:
    """`parse_shape` of a string, remembered: a trace's hundreds of tensors come in a few shapes."""
    found = _SHAPE.search(text)
    if found is None:
        return None
    try:
        return tuple(int(p) for p in found.group(1).split(",") if p.strip())
    except ValueError:
        return None


def trace_dtype(text: Any) -> str | None:
    """ "torch.bfloat16" -> "bfloat16", as a trace names a dtype."""
    return text.removeprefix("torch.") if isinstance(text, str) else None


def parse_tensor_repr(text: Any) -> float | None:
    """ "tensor(-8.2584e-04)" -> -0.00082584; "tensor(-inf)" -> -inf; anything else -> None."""
    if not isinstance(text, str):
        return None
    found = _TENSOR_REPR.search(text)
    if found is None:
        return None
    try:
        return float(found.group(1))
    except ValueError:
        return None
