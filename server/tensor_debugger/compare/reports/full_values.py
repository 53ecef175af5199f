"""Culprits judged on full values where a candidate's pairs rest on summaries.

A capture with `values="summary"` keeps no element values, so its pairs give no relative RMSE and the module view
(`module_reports.module_report`) can rank no module by the error it added. `find_divergence` then captures the
modules around the first divergence again with full values, both sides, into the same session: "reference (full)",
compared against the reference's summaries, and "candidate (full)", compared against "reference (full)" (with a
precision floor, "noise (full)" too, the rerun of "reference (full)"). Those pairs were compared element by element,
so the same culprit rule (with the session's noise run where there is one) is judged on them, and its culprits are
shown on the summary candidate's module tree. Only modules recorded with full values on both sides can be named:
the rule needs an input and an output pair with element values, and nothing else is ranked."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

from tensor_debugger.compare.reports.module_reports import (
    CulpritReport,
    ModuleNodeReport,
    ModuleReport,
    pair_error,
)
from tensor_debugger.compare.reports.pair_report import PairReport


@dataclass(frozen=True)
class FullValuesRun:
    """A candidate run compared element by element against a second capture of the reference: `candidate` and
    `against` (run ids), `reference`, the run the second capture is itself compared against."""

    candidate: int
    against: int
    reference: int


def rests_on_summaries(mine: Sequence[PairReport]) -> bool:
    """Whether a candidate's traced pairs were compared on summaries only: some rest on summaries and none has
    element values (a relative RMSE)."""
    traced = [i for i in mine if i.module_path]
    on_summary = any(i.summary is not None and i.summary.on_summary for i in traced)
    return on_summary and all(pair_error(i) is None for i in traced)


def full_values_runs(
    items: Sequence[PairReport],
    run_order: Sequence[int],
    noise_runs: Collection[int],
    first_candidate: int,
    valued: bool = True,
) -> list[FullValuesRun]:
    """The candidate runs (in the session's run order) of `items` (the session's judged pairs, reruns left out)
    whose traced pairs have element values, each compared against a run that is itself a candidate compared against
    `first_candidate`'s reference: a second capture of both sides with full values, as find_divergence stores it
    ("candidate (full)" against "reference (full)"), and its replay of modules on the reference's arguments to them
    ("candidate (own)" against "reference (own)"). Empty where the session has none. `valued=False`: whether or not
    their pairs are compared yet (what the session holds, not what can be judged on it yet)."""
    against: dict[int, set[int]] = {}
    with_values: set[int] = set()
    for i in items:
        against.setdefault(i.b.run_id, set()).add(i.a.run_id)
        if i.module_path and (pair_error(i) is not None or not valued):
            with_values.add(i.b.run_id)
    references = against.get(first_candidate, set())
    found = []
    for run in run_order:
        if run == first_candidate or run in noise_runs or run not in with_values or len(against.get(run, ())) != 1:
            continue
        (second,) = against[run]
        if second in references or second in noise_runs or second == first_candidate:  # not a second capture
            continue
        recaptured = against.get(second, set())
        if len(recaptured) == 1 and recaptured <= references:
            found.append(FullValuesRun(run, second, next(iter(recaptured))))
    return found


def values_words(labels: Mapping[int, str], run: FullValuesRun, noise: Sequence[int]) -> str:
    """In words, where the culprits were judged: the runs compared with full values, and the rerun, where one
    judged them."""
    rerun = ", ".join(repr(labels.get(n, str(n))) for n in noise)
    return (
        f"culprits judged on the modules recorded with full values on both sides: run {labels.get(run.candidate)!r} "
        f"against {labels.get(run.against)!r}" + (f", with the rerun {rerun}" if rerun else "")
    )


def summary_words(label: str) -> str:
    """In words: a candidate's pairs rest on summaries and no second capture with full values was compared."""
    return (
        f'the pairs of run {label!r} rest on summaries (values="summary"), which give no module\'s added error, and '
        "no module was captured again with full values on both sides: no culprit can be judged"
    )


def with_full_values(
    view: ModuleReport, full: ModuleReport, words: str, more: Sequence[tuple[ModuleReport, str]] = ()
) -> ModuleReport:
    """`view` (a candidate's module view from summaries: its tree) with the culprits, the ranking and the notes of
    `full` (the module view of the same modules compared with full values), the culprit marked in the tree and each
    ranked module's added error on its node. `more`: the module views of other runs compared with full values (a
    replay of modules on the reference's arguments), each with its words: their culprits are added after `full`'s,
    and a note of `full`'s that a module's output is within the noise floor is dropped where one names it."""
    culprits = list(full.culprits)
    named_on: list[str] = []
    for other, how in more:
        added_here = [c for c in other.culprits if c.module_path not in {n.module_path for n in culprits}]
        culprits += added_here
        if added_here:
            named_on.append(f"{', '.join(c.module_path for c in added_here)} on {how}")
    top = full.culprit or next((o.culprit for o, _ in more if o.culprit is not None), None)
    named = {c.module_path for c in culprits}
    added = {c.module_path: c for c in full.ranked}
    tree = [_marked(node, added, top) for node in view.tree]
    noise_notes = [n for n in full.noise_notes if not any(n.startswith(f"{m} adds ") for m in named)]
    return replace(
        view,
        tree=tree,
        culprits=culprits,
        culprit=top,
        ranked=full.ranked,
        notes=full.notes,
        noise_notes=noise_notes,
        values_note=words + "".join(f"; named {n}" for n in named_on),
    )


def _marked(node: ModuleNodeReport, added: Mapping[str, CulpritReport], top: CulpritReport | None) -> ModuleNodeReport:
    ranked = added.get(node.path)
    return replace(
        node,
        added_error=ranked.added_error if ranked is not None else node.added_error,
        is_culprit=top is not None and top.module_path == node.path,
        children=[_marked(c, added, top) for c in node.children],
    )
