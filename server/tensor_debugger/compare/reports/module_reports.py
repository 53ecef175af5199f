"""The module view of a traced session: the reference run's module tree, each module with its verdict and the
error it added, and the modules ranked as culprits (see `engine/culprits.py`)."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from tensor_debugger.compare.reports.formatting import format_error
from tensor_debugger.compare.reports.guessed_pairs import guess_words, guessed_by
from tensor_debugger.compare.reports.noise import Rule
from tensor_debugger.compare.reports.pair_report import PairReport
from tensor_debugger.engine.culprits import (
    MIN_ADDED_ERROR,
    Culprit,
    StageCulprit,
    TensorError,
    added_error,
    rank_culprits,
    rank_stages,
    relative_rmse,
    stands_out,
)
from tensor_debugger.engine.metrics import Number, json_number, parse_number
from tensor_debugger.engine.stages import stages_ordered, unordered_words
from tensor_debugger.ingest.traces import ModuleNode, ModuleTree
from tensor_debugger.store.reports import PairStatus


class ModuleVerdict(enum.StrEnum):
    """A module's verdict is its worst pair's; "none" without pairs of its own."""

    ERROR = "error"
    INCOMPARABLE = "incomparable"
    FAIL = "fail"
    PENDING = "pending"
    PASS = "pass"
    NONE = "none"


_WORST = ("error", "incomparable", "fail", "pending", "pass")


@dataclass(frozen=True)
class ModulePair:
    id: int
    place: str | None
    status: PairStatus
    error: Number | None  # the pair's relative RMSE
    # a captured op's: the line that called it in the reference and in the candidate ("<file>:<line>")
    reference_source: str | None = None
    candidate_source: str | None = None
    basis: str | None = None  # "summary" where its verdict rests on summaries (a capture with values="summary")


@dataclass(frozen=True)
class ModuleNodeReport:
    path: str
    name: str
    verdict: ModuleVerdict
    failing_inside: int  # failing modules below it
    added_error: Number | None
    is_culprit: bool
    pairs: list[ModulePair]
    children: list[ModuleNodeReport]


@dataclass(frozen=True)
class CulpritReport:
    module_path: str
    added_error: Number  # relative RMSE of its output minus that of its input
    input_error: Number
    output_error: Number
    pair_id: int | None  # its first output's pair


@dataclass(frozen=True)
class StageCulpritReport:
    """A stage of a plain dump ranked by the error it adds (engine/culprits.py's rank_stages)."""

    name: str
    layer: int | None
    stage: str | None
    previous: str | None  # the tensor before it in execution order
    added_error: Number  # its relative RMSE minus that of the tensor before it
    input_error: Number
    output_error: Number
    pair_id: int
    # where its partner was guessed (`guessed_pairs`): the strategy ("shape", "fuzzy 0.86") and the candidate's tensor
    paired_by: str | None = None
    candidate_name: str | None = None

    @property
    def guess(self) -> str:
        """Where its partner was guessed, the strategy and the candidate's tensor in words ("" otherwise)."""
        return guess_words(self.paired_by, self.candidate_name) or ""


STAGE_CULPRITS = 10  # the most a report lists
_PARAMETER = re.compile(r"(?:^|[._])(?:weight|bias)$")  # a module's parameter, as state dicts name them


@dataclass(frozen=True)
class StageRanking:
    """The stages of a plain dump by the error they add: `ranked`, those that add some (at most STAGE_CULPRITS),
    and `culprits`, those whose added error stands out (engine/culprits.py's stands_out), largest first."""

    ranked: list[StageCulpritReport]
    culprits: list[StageCulpritReport]
    compared: int  # how many stages were ranked: none stands out only where some were
    # where a stage's added error would stand out but the tensor before it was not compared (the first compared, or
    # one after a pair with no values): its input error is not known, so it is named in words, not as a culprit
    notes: list[str] = field(default_factory=list)
    # where a stage's added error would stand out but its pair passed within the noise floor: no culprit, in words
    noise_notes: list[str] = field(default_factory=list)


def stage_culprits(
    items: list[PairReport], floors: dict[str, float] | None = None, factor: float = 4.0
) -> StageRanking:
    """Without module traces, the stages by the error they add: each compared pair's relative RMSE minus that of
    the pair before it in execution order (the first candidate's), among the pairs that carry activations
    (`carries_activations`) and have a stage (a place in execution order). `floors`: with a rerun of the
    reference, its relative RMSE at each reference tensor (by name), which `factor` times a culprit's added error
    exceeds."""
    if not items or any(i.module_path for i in items):
        return StageRanking([], [], 0)
    candidate = items[0].b.run_id
    # a pair without a stage has no known place in execution order (a state dict's key, a file named otherwise):
    # no tensor before it to measure its added error against
    mine = [i for i in items if i.b.run_id == candidate and carries_activations(i) and i.stage is not None]
    # a layer whose stages have no known order (`q_proj`, `mlp`: sorted by name, `engine/stages.stages_ordered`):
    # the tensor before each of its stages is not known, so none of them is ranked, and the stage after it has no
    # known input error; where one of them fails, said so
    unordered = _unordered_layers(mine)
    order_notes = [
        f"no stage of layer {layer} is named a culprit: {words}" if layer is not None else words
        for layer, words in unordered.items()
        if any(i.layer == layer and i.status == PairStatus.FAIL for i in mine)
    ]
    by_position = {i.position: i for i in mine}
    errors: list[tuple[int, float]] = []
    # the stages whose input error is not known: the first compared, and each after a pair with no values (not
    # compared, incomparable, errored): rank_stages takes the error of the last compared tensor before it, or 0
    unknown_input: set[int] = set()
    gap = True
    for i in mine:
        e = None if i.layer in unordered else pair_error(i)
        if e is None:
            gap = True
            continue
        if gap:
            unknown_input.add(i.position)
        gap = False
        errors.append((i.position, e))
    ranked = rank_stages(errors)
    stage_floors = [(floors or {}).get(by_position[c.position].a.name) for c in ranked]
    added, given = [c.added_error for c in ranked], [c.input_error for c in ranked]
    # a stage given the tensor before it bit-identical that fails made its error itself, however few are ranked
    own = [
        c.position not in unknown_input and c.input_error == 0.0 and by_position[c.position].status == PairStatus.FAIL
        for c in ranked
    ]
    would = stands_out(added, given, stage_floors, factor, own)
    by_median = stands_out(added, given, stage_floors, factor)
    # a stage whose own pair passed within the noise floor made no error beyond the noise: never a culprit
    marked = [
        w and c.position not in unknown_input and not within_noise([by_position[c.position]])
        for c, w in zip(ranked, would, strict=True)
    ]
    notes = [
        _unknown_input_note(
            by_position[c.position],
            by_position[c.previous] if c.previous is not None else None,
            c,
            # pairs compared before it that are not ranked (integers, bools, weights, scalars): it is not the first
            # tensor compared, only the first ranked
            any(
                i.b.run_id == candidate
                and i.position < c.position
                and i.position not in by_position
                and i.status in (PairStatus.PASS, PairStatus.FAIL)
                for i in items
            ),
        )
        for c, w in zip(ranked, would, strict=True)
        if w and c.position in unknown_input
    ] + [
        _own_error_words(by_position[c.position].name, f"the tensor before it, {by_position[c.previous].name}, was", c)
        for c, m, plain in zip(ranked, marked, by_median, strict=True)
        if m and not plain and c.previous is not None
    ]
    noise_notes = [
        _within_noise_words(by_position[c.position].name, c.added_error)
        for c, w in zip(ranked, would, strict=True)
        if w and c.position not in unknown_input and within_noise([by_position[c.position]])
    ]

    def report(c: StageCulprit) -> StageCulpritReport:
        item = by_position[c.position]
        before = by_position[c.previous].name if c.previous is not None else None
        return StageCulpritReport(
            item.name,
            item.layer,
            item.stage,
            before,
            json_number(c.added_error),
            json_number(c.input_error),
            json_number(c.output_error),
            item.id,
            guessed_by(item.strategy),
            item.b.name if guessed_by(item.strategy) else None,
        )

    return StageRanking(
        [report(c) for c in ranked if c.added_error > 0][:STAGE_CULPRITS],
        [report(c) for c, culprit in zip(ranked, marked, strict=True) if culprit][:STAGE_CULPRITS],
        len(ranked),
        order_notes + notes,
        noise_notes,
    )


def _unordered_layers(mine: list[PairReport]) -> dict[int | None, str]:
    """The layers of `mine` whose stages have no known execution order, each with why in words."""
    stages: dict[int | None, list[str | None]] = {}
    for i in mine:
        stages.setdefault(i.layer, []).append(i.stage)
    return {layer: unordered_words(layer, held) for layer, held in stages.items() if not stages_ordered(held)}


def _own_error_words(name: str, given: str, culprit: StageCulprit | Culprit) -> str:
    """In words, a culprit named because what it was given was bit-identical and its output fails (not because its
    added error stands out from the others')."""
    return (
        f"{name} is named by its own doing: {given} identical in both runs and its output differs "
        f"(relative RMSE {format_error(culprit.output_error)})"
    )


def _unknown_input_note(
    item: PairReport, previous: PairReport | None, stage: StageCulprit, unranked_before: bool = False
) -> str:
    """In words, a stage whose added error would stand out but whose input was not compared: where the error is
    first seen, not who made it. `unranked_before`: pairs before it were compared but are not ranked."""
    where = (
        "the first tensor compared that carries activations: the integer, bool, weight or scalar pairs compared "
        "before it are not ranked"
        if previous is None and unranked_before
        else "the first tensor compared"
        if previous is None
        else f"after {previous.name}, with a tensor between them that was not compared"
    )
    return (
        f"the error is already there at {item.name} ({where}; relative RMSE {format_error(stage.output_error)}): "
        "what it was given was not compared, so whether it began there is not known"
    )


@dataclass(frozen=True)
class ModuleReport:
    has_values: bool
    tree: list[ModuleNodeReport]
    culprits: list[CulpritReport]  # the modules whose added error stands out (stands_out), largest first
    culprit: CulpritReport | None  # the first of them, when any pair fails
    ranked: list[CulpritReport] = field(default_factory=list)  # every module with an input and an output pair
    # where the error stands out between a block's children, in code of the block's own that records no output
    # ("`….self_attn` records no output: the error appears between its q_proj, k_proj, v_proj and `o_proj`")
    notes: list[str] = field(default_factory=list)
    # where a stage's added error would stand out but its pair passed within the noise floor: no culprit, in words
    noise_notes: list[str] = field(default_factory=list)
    # where the candidate's pairs rest on summaries: in words, which runs' full values the culprits were judged on,
    # or that none were, so no culprit can be judged (compare/reports/full_values.py)
    values_note: str | None = None


def carries_activations(item: PairReport) -> bool:
    """Whether the pair is of values an error flows through, from one stage to the next: of more than one
    floating-point element, and not a parameter. Not a scalar or an integer or boolean tensor (a step counter,
    positions, a mask), which would read as the input of the stage after it with no error, and blame that stage
    for all it carries; nor a weight or bias (a checkpoint's, named `….weight`), which no error flows through."""
    dtype = item.a.dtype.lower()
    return (
        math.prod(item.a.shape) > 1
        and not dtype.startswith(("int", "uint", "bool"))
        and not _PARAMETER.search(item.a.name)
    )


def pair_error(item: PairReport) -> float | None:
    """A compared pair's relative RMSE; None before it is compared or without element values."""
    stats = item.stats
    if not stats or stats.snr_db is None:  # an empty pair's: no element, no error (its statistics are null)
        return None
    return relative_rmse(float(parse_number(stats.snr_db)), int(stats.nan_one_side or 0))


def module_report(
    items: list[PairReport],
    module_tree: ModuleTree,
    floors: dict[str, float] | None = None,
    factor: float = 4.0,
    out_of_step: frozenset[int] = frozenset(),
    ambiguous: frozenset[int] = frozenset(),
) -> ModuleReport | None:
    """`items` are `pair_reports.session_pairs` pairs; None when no pair comes from a module trace or capture.
    Modules with an input and an output pair are ranked by the error they added; the root module (the whole model,
    whose added error is all the run's) only when no other module can be. The culprits are those whose added error
    stands out (engine/culprits.py's stands_out), but for a block around one that does; `floors`, with a rerun of
    the reference, its relative RMSE at each reference tensor (by name), which a culprit's added error exceeds
    `factor` times. `out_of_step`: the ids of pairs whose two sides are not one value computed two ways (a float
    mask against bools), not compared: their error counts nowhere, and a module given one is no culprit (what it
    was given is not known to match). `ambiguous`: the ids of pairs of captured ops paired by position where their
    contents neither confirm nor replace that pairing (compare/planning/op_pairs.AMBIGUOUS_STRATEGY): their error
    counts nowhere either; the module whose call ran them is judged, as every module, on its own inputs and outputs
    (which faces which inside it changes neither: its inputs agree and its output differs, or not)."""
    traced = [i for i in items if i.module_path]
    if not traced:
        return None
    candidate = traced[0].b.run_id  # with several candidate runs, the first one's modules
    traced = [i for i in traced if i.b.run_id == candidate]
    # each pair's error worked out once: the ranking and each module's pairs both show it
    known = {i.id: e for i in traced if i.id not in out_of_step | ambiguous and (e := pair_error(i)) is not None}
    given_unknown = {i.module_path for i in traced if i.id in out_of_step and (i.place or "").startswith("inputs")}
    errors = [TensorError(i.module_path or "", i.place or "", i.position, known[i.id]) for i in traced if i.id in known]
    roots = module_tree.roots
    root_paths = {r.path for r in roots} or {i.module_path or "" for i in traced if "." not in (i.module_path or "")}
    # a module an input of which was not compared (incomparable, errored, pending): the error it adds is not known
    uncompared = _uncompared_inputs(traced, known)
    everything = rank_culprits(errors)
    unknown = [c for c in everything if c.module_path in uncompared and c.module_path not in root_paths]
    everything = [c for c in everything if c.module_path not in uncompared]
    ranked = [c for c in everything if c.module_path not in root_paths] or everything
    by_module: dict[str, list[PairReport]] = {}
    for item in traced:
        by_module.setdefault(item.module_path or "", []).append(item)
    gaps = _gaps(roots, errors)
    added = [c.added_error for c in ranked] + [g.added for g in gaps]
    given = [c.input_error for c in ranked] + [g.given for g in gaps]
    module_floors = [_output_floor(by_module[c.module_path], floors or {}) for c in ranked] + [
        _input_floor(by_module.get(g.child, []), floors or {}) for g in gaps
    ]
    # a module whose compared inputs are bit-identical and one of whose outputs fails made its error itself
    own = [
        c.input_error == 0.0 and any(i.status == PairStatus.FAIL for i in _outputs(by_module[c.module_path]))
        for c in ranked
    ]
    marks = stands_out(added, given, module_floors, factor, own)
    by_median = set(
        c.module_path for c, m in zip(ranked, stands_out(added, given, module_floors, factor), strict=False) if m
    )
    marked, gap_marks = marks[: len(ranked)], marks[len(ranked) :]
    marked = [
        m and c.module_path not in given_unknown and not within_noise(_outputs(by_module[c.module_path]))
        for c, m in zip(ranked, marked, strict=True)
    ]
    failing = any(i.status != "pass" for i in traced)
    reports = [
        CulpritReport(
            c.module_path,
            json_number(c.added_error),
            json_number(c.input_error),
            json_number(c.output_error),
            _first_output(by_module[c.module_path]),
        )
        for c in ranked
    ]
    standing = [r for r, culprit in zip(reports, marked, strict=True) if culprit]
    # a block whose output is its culprit child's (a capture records the attention block's and the decoder
    # layer's outputs too) stands out with it: the most specific module is named, not the blocks around it
    culprits = [r for r in standing if not any(o.module_path.startswith(r.module_path + ".") for o in standing)]
    top = culprits[0] if culprits and failing else None
    by_path = {c.module_path: c for c in ranked}
    return ModuleReport(
        module_tree.values,
        [_node_report(r, by_module, by_path, top, known)[0] for r in roots],
        culprits,
        top,
        reports,
        [g.words() for g, m in zip(gaps, gap_marks, strict=True) if m]
        + [
            _uncompared_words(c.module_path, uncompared[c.module_path])
            for c in unknown
            if c.added_error > MIN_ADDED_ERROR
        ]
        + [
            _own_error_words(f"`{r.module_path}`", "its inputs were", by_path[r.module_path])
            for r in culprits
            if r.module_path not in by_median
        ],
        [
            _within_noise_words(c.module_path, c.added_error)
            for c, m in zip(ranked, marks[: len(ranked)], strict=True)
            if m and c.module_path not in given_unknown and within_noise(_outputs(by_module[c.module_path]))
        ],
    )


def _uncompared_inputs(traced: Sequence[PairReport], known: dict[int, float]) -> dict[str, list[PairReport]]:
    """By module, its input pairs whose error is not known: not compared (incomparable, errored, still pending), or
    failing without element values. A pair that passed without them counts as no error, as in the ranking."""
    found: dict[str, list[PairReport]] = {}
    for item in traced:
        if (item.place or "").startswith("inputs") and item.id not in known and item.status != PairStatus.PASS:
            found.setdefault(item.module_path or "", []).append(item)
    return found


def _uncompared_words(module_path: str, inputs: Sequence[PairReport]) -> str:
    """Why a module whose error grows across its compared inputs is not named: another input was not compared."""
    listed = ", ".join(f"{i.place} ({i.status})" for i in inputs)
    return (
        f"`{module_path}` carries more error out than its compared inputs bring, but its input {listed} was not "
        f"compared: whether it introduced the error is not known"
    )


@dataclass(frozen=True)
class _Gap:
    """Error that appears inside a block that records no output, between its children: what `child`'s inputs carry
    beyond the most that the block's inputs and the outputs of the children before it carried."""

    block: str
    before: list[str]  # the children before it, short names
    child: str
    added: float
    given: float

    def words(self) -> str:
        between = f"its {', '.join(self.before)} and" if self.before else "its inputs and"
        return f"`{self.block}` records no output: the error appears between {between} `{_short_name(self.child)}`"


def _gaps(roots: Sequence[ModuleNode], errors: list[TensorError]) -> list[_Gap]:
    """Each block without a recorded output, and below it: the error each child's inputs add to what came before.
    The errors are indexed by module once (inputs and outputs, in `errors`' order) and each subtree's largest output
    error is worked out once: a scan of every error per module took 6.8 of 8.4 s for a 2,008-module trace."""
    inputs: dict[str, list[float]] = {}
    outputs: dict[str, list[float]] = {}
    for e in errors:
        if e.place.startswith("inputs"):
            inputs.setdefault(e.module_path, []).append(e.error)
        elif e.place.startswith("outputs"):
            outputs.setdefault(e.module_path, []).append(e.error)
    inside_max: dict[str, float | None] = {}  # the largest output error in a subtree (NaN left out, as max does)

    def largest_inside(node: ModuleNode) -> float | None:
        if node.path not in inside_max:
            known = [e for e in outputs.get(node.path, []) if not math.isnan(e)]
            known += [m for c in node.children if (m := largest_inside(c)) is not None]
            inside_max[node.path] = max(known) if known else None
        return inside_max[node.path]

    def below(node: ModuleNode) -> list[_Gap]:
        found = [g for c in node.children for g in below(c)]
        if not node.children or node.path in outputs:
            return found
        given = max(inputs.get(node.path, []), default=0.0)
        before: list[str] = []
        for child in node.children:
            carried = inputs.get(child.path)
            if carried:
                found.append(_Gap(node.path, list(before), child.path, added_error(given, max(carried)), given))
            most = largest_inside(child)
            given = given if most is None else max(given, most)
            before.append(_short_name(child.path))
        return found

    return [g for r in roots for g in below(r)]


def within_noise(outputs: Sequence[PairReport]) -> bool:
    """Whether `outputs` (a stage's pair, a module's output pairs) all passed by the noise rule: each within the
    factor times the rerun's max |diff| there, an error the rerun of the reference shows too."""
    return bool(outputs) and all(p.rule == Rule.NOISE and p.status == PairStatus.PASS for p in outputs)


def _within_noise_words(name: str, added: float) -> str:
    """In words: `name`'s added error would stand out, but its output is within the noise floor."""
    return (
        f"{name} adds {format_error(added)} relative RMSE, which would stand out, but its output is within the noise "
        "floor (the rerun of the reference differs as much there): no culprit"
    )


def _outputs(pairs: list[PairReport]) -> list[PairReport]:
    """A module's output pairs among its `pairs`."""
    return [p for p in pairs if (p.place or "").startswith("outputs")]


def _output_floor(pairs: list[PairReport], floors: dict[str, float]) -> float | None:
    """The noise floor at a module's outputs: the largest of theirs that is known."""
    known = [floors[p.a.name] for p in pairs if (p.place or "").startswith("outputs") and p.a.name in floors]
    return max(known) if known else None


def _input_floor(pairs: list[PairReport], floors: dict[str, float]) -> float | None:
    """The noise floor at a module's inputs: the largest of theirs that is known. Error that appears between a
    block's children is judged against it, as a module's added error against the floor at its outputs."""
    known = [floors[p.a.name] for p in pairs if (p.place or "").startswith("inputs") and p.a.name in floors]
    return max(known) if known else None


def _node_report(
    node: ModuleNode,
    by_module: dict[str, list[PairReport]],
    added: dict[str, Culprit],
    top: CulpritReport | None,
    errors: dict[int, float],
) -> tuple[ModuleNodeReport, int]:
    """A module with its verdict: its worst pair's; for a container that records no output (a Hugging Face trace's
    attention block or decoder layer), the worst of its pairs' and its children's, so that a block around a
    failing projection does not read as passing. With it, how many modules in its subtree (itself included) have a
    pair of their own that does not pass (a captured op, `…/softmax#1`, a leaf of the tree, is no module): counted
    once, bottom up; counting each node's subtree again at every module above it took a fifth of the model graph's
    server time for a 2,008-module trace."""
    built = [_node_report(c, by_module, added, top, errors) for c in node.children]
    children = [report for report, _ in built]
    failing_inside = sum(count for _, count in built)
    pairs = by_module.get(node.path, [])
    statuses = {str(p.status) for p in pairs}
    if children and not any((p.place or "").startswith("outputs") for p in pairs):
        statuses |= {str(c.verdict) for c in children}
    verdict = ModuleVerdict(next((s for s in _WORST if s in statuses), "none"))
    culprit = added.get(node.path)
    own = "/" not in node.path and any(str(p.status) in _WORST[:3] for p in pairs)
    report = ModuleNodeReport(
        path=node.path,
        name=_short_name(node.path),
        verdict=verdict,
        failing_inside=failing_inside,
        added_error=json_number(culprit.added_error) if culprit else None,
        is_culprit=top is not None and top.module_path == node.path,
        pairs=[
            ModulePair(
                p.id,
                p.place,
                p.status,
                _error_json(errors.get(p.id)),
                p.a.source,
                p.b.source,
                "summary" if p.summary is not None and p.summary.on_summary else None,
            )
            for p in pairs
        ],
        children=children,
    )
    return report, own + failing_inside


def _short_name(path: str) -> str:
    """The last part of a module path; a numbered block keeps its container's name ("layers.3", and in a later call
    "layers.3#2"); a captured op its op and call index ("softmax#1")."""
    if "/" in path:
        return path.rsplit("/", 1)[1]
    parts = path.split(".")
    numbered = len(parts) > 1 and parts[-1].partition("#")[0].isdigit()
    return ".".join(parts[-2:]) if numbered else parts[-1]


def _error_json(error: float | None) -> float | str | None:
    return None if error is None else json_number(error)


def _first_output(pairs: list[PairReport]) -> int | None:
    outputs = [p for p in pairs if (p.place or "").startswith("outputs")]
    return outputs[0].id if outputs else None
