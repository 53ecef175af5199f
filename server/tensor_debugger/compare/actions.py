"""What users do to a session, one call per action: rename it, change its tolerances, pair two tensors by hand,
undo a pair, reorder the pairs, set or clear a pair's alignment, choose the run a run is compared against. The API's
controllers and the pages' forms call the same methods; each one changes the rows, pairs the session again (or
refreshes its verdicts) where the action asks for it, and wakes the comparison worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy.orm import Session as DbSession
from sqlalchemy.orm import sessionmaker

from tensor_debugger.compare.context import CompareContext
from tensor_debugger.compare.planning.explore import CLI_FILTER, plan_explore
from tensor_debugger.compare.planning.hand_pairing import candidate_run, check_choice
from tensor_debugger.compare.planning.pairing_files import (
    PairingExport,
    check_dims,
    export_pairing,
    import_pairing,
    set_rules,
)
from tensor_debugger.compare.planning.plan import plan_session, refresh_session
from tensor_debugger.compare.planning.sides import tensors_of
from tensor_debugger.compare.reports.pair_report import PairReport
from tensor_debugger.compare.reports.pair_reports import apply_order, session_pairs
from tensor_debugger.engine.alignment import Alignment, Step
from tensor_debugger.errors import InvalidInputError, NotFoundError
from tensor_debugger.store import catalog
from tensor_debugger.store.compared_against import check_against
from tensor_debugger.store.models import PairOverrideRecord, PairRecord
from tensor_debugger.store.reports import RunReport, SessionReport


class SessionActions:
    """`wake`: tells whoever computes pending pairs (the server's worker) that there is work."""

    def __init__(self, sessions: sessionmaker[DbSession], context: CompareContext, wake: Callable[[], None]) -> None:
        self.sessions = sessions
        self.context = context
        self.wake = wake

    def plan(self, session_id: int) -> None:
        """Pair the session's runs again (after an ingest or a user's override) and wake the worker."""
        plan_session(self.context, session_id)
        self.wake()

    def refresh(self, session_id: int) -> None:
        """Give every pair the verdict cached for its current key (new tolerances), and wake the worker."""
        refresh_session(self.context, session_id)
        self.wake()

    # --- the session ------------------------------------------------------------------------------------

    def update_session(
        self,
        session_id: int,
        name: str | None = None,
        notes: str | None = None,
        rtol: float | None = None,
        atol: float | None = None,
        default_tolerances: bool = False,
        strategies: str | list[str] | None = None,
        name_pattern: str | None = None,
        ulp: int | None = None,
        allow_unmatched: list[str] | None = None,
        dims: dict[str, Any] | None = None,  # as the user gave them: `check_dims` says what is wrong with them
    ) -> SessionReport:
        """Rename, change the notes, the tolerances (`default_tolerances`: torch.testing's defaults per dtype)
        and/or the pairing rules: `strategies` (a chain as the CLI's --strategies takes it, a comma list or a
        list; empty: the default chain), `name_pattern` (empty: none) and `allow_unmatched` (globs of reference
        tensor names that may have no partner; empty: none). Rules are checked before anything
        changes (InvalidInputError naming the problem); new rules pair the session again, new tolerances
        refresh its verdicts. `dims` (name glob -> comma-separated dimension names; {}: none) names the dimensions
        that `where` and the error profiles show; it changes no verdict."""
        tolerances_changed = rtol is not None or atol is not None or ulp is not None or default_tolerances
        rules_changed = strategies is not None or name_pattern is not None or allow_unmatched is not None
        with self.sessions.begin() as db:
            session = catalog.update_session(db, session_id, name, notes)
            if rules_changed:
                set_rules(
                    session,
                    session.strategies if strategies is None else strategies,
                    session.name_pattern if name_pattern is None else name_pattern,
                )
            if allow_unmatched is not None:
                session.allow_unmatched = [g for g in allow_unmatched if g] or None
            if dims is not None:
                session.dims = check_dims(dims)
            if tolerances_changed:
                catalog.set_tolerances(
                    session,
                    None if default_tolerances else rtol,
                    None if default_tolerances else atol,
                    None if default_tolerances else ulp,
                )
            report = SessionReport.of(session)
        if rules_changed:
            self.plan(session_id)
        elif tolerances_changed:
            self.refresh(session_id)
        return report

    def set_pairing_rules(self, session_id: int, strategies: str | list[str], name_pattern: str) -> SessionReport:
        """The session's chain of strategies and name pattern (the page's form); pairs the session again."""
        return self.update_session(session_id, strategies=strategies, name_pattern=name_pattern)

    def import_pairing(self, session_id: int, data: Any) -> PairingExport:
        """Apply a pairing file (compare/planning/pairing_files.py; nothing changes when it is not one) and pair the
        session again; the session's pairing file now."""
        with self.sessions.begin() as db:
            import_pairing(db, session_id, data)
        self.plan(session_id)
        with self.sessions() as db:
            return export_pairing(db, session_id)

    def rename(self, session_id: int, name: str) -> SessionReport:
        return self.update_session(session_id, name=name)

    def set_tolerances(self, session_id: int, rtol: float | None, atol: float | None, ulp: int | None = None) -> None:
        """The session's tolerances; None for all: torch.testing's defaults per dtype; `ulp`: in ULPs instead."""
        with self.sessions.begin() as db:
            catalog.set_tolerances(catalog.get_session(db, session_id), rtol, atol, ulp)
        self.refresh(session_id)

    def compare_against(self, run_id: int, against_id: int | None) -> RunReport:
        """Compare run `run_id` against run `against_id` of its session (None: the session's reference), checked
        as store/compared_against.py says (InvalidInputError with the reason, nothing changed), and pair the
        session again; returns the run's report."""
        with self.sessions.begin() as db:
            run = catalog.get_run(db, run_id)
            against = catalog.get_run(db, against_id) if against_id is not None else None
            runs = catalog.get_session(db, run.session_id).runs
            check_against(run, against, runs)
            run.compared_against_id = against_id
            session_id = run.session_id
        self.plan(session_id)
        with self.sessions() as db:
            return RunReport.of(catalog.get_run(db, run_id))

    # --- pairing ----------------------------------------------------------------------------------------

    def explore(self, session_id: int, match: str | None = None, filter_hint: str = CLI_FILTER) -> int:
        """Pair every tensor of the session's one run with every other whose name matches the glob `match`
        (compare/planning/explore.py: past 5,000 pairs, InvalidInputError asking for a filter); how many pairs."""
        count = plan_explore(self.context, session_id, match, filter_hint=filter_hint)
        self.wake()
        return count

    def pair_by_hand(
        self,
        session_id: int,
        a_name: str,
        b_name: str,
        run_id: int | None = None,
        alignment: list[Step] | None = None,
    ) -> PairReport | None:
        """Pair two tensors by hand (the candidate run `run_id`, else the session's first candidate); manual pairs
        persist and win over every automatic strategy. `alignment`: the steps of a chosen alignment (one of
        `hand_pair_choices`), checked against both tensors; None: the automatic one. The pair made; None when
        no such unmatched tensors were there to pair."""
        with self.sessions.begin() as db:
            run = candidate_run(db, session_id, run_id)
            if alignment:
                check_choice(db, session_id, a_name, b_name, run, alignment)
            db.add(
                PairOverrideRecord(session_id=session_id, run_b_id=run.id, action="pair", a_name=a_name, b_name=b_name)
            )
            if alignment:
                db.query(PairOverrideRecord).filter_by(
                    session_id=session_id, run_b_id=run.id, action="align", a_name=a_name, b_name=b_name
                ).delete()
                db.add(
                    PairOverrideRecord(
                        session_id=session_id,
                        run_b_id=run.id,
                        action="align",
                        a_name=a_name,
                        b_name=b_name,
                        steps=[s.to_json() for s in alignment],
                    )
                )
        self.plan(session_id)
        return self._find(session_id, (a_name, b_name))

    def unpair(self, pair_id: int) -> None:
        """Undo a pair: both tensors become unmatched, and stay so when the session is paired again."""
        with self.sessions.begin() as db:
            pair = _pair(db, pair_id)
            session_id = pair.session_id
            db.add(
                PairOverrideRecord(
                    session_id=session_id,
                    run_b_id=pair.run_b_id,
                    action="unpair",
                    a_name=pair.a_name,
                    b_name=pair.b_name,
                )
            )
            _delete_overrides(db, pair, "pair")
        self.plan(session_id)

    def set_alignment(self, pair_id: int, steps: list[Step]) -> PairReport:
        """Replace the automatic alignment with explicit steps (the `alignment_steps` of a pair's detail)."""
        with self.sessions.begin() as db:
            pair = _pair(db, pair_id)
            side_a, side_b = tensors_of(db, pair)
            shapes_a, shapes_b = [tuple(t.shape) for t in side_a], [tuple(t.shape) for t in side_b]
            try:
                Alignment.from_steps(shapes_a, shapes_b, steps)
            except (ValueError, KeyError, TypeError) as exc:
                raise InvalidInputError(f"these steps do not align the pair: {exc}") from None
            _delete_overrides(db, pair, "align")
            db.add(
                PairOverrideRecord(
                    session_id=pair.session_id,
                    run_b_id=pair.run_b_id,
                    action="align",
                    a_name=pair.a_name,
                    b_name=pair.b_name,
                    steps=[s.to_json() for s in steps],
                )
            )
            session_id, names = pair.session_id, (pair.a_name, pair.b_name)
        self.plan(session_id)
        return self._pair_named(session_id, names)

    def clear_alignment(self, pair_id: int) -> PairReport:
        """Back to the automatic alignment."""
        with self.sessions.begin() as db:
            pair = _pair(db, pair_id)
            _delete_overrides(db, pair, "align")
            session_id, names = pair.session_id, (pair.a_name, pair.b_name)
        self.plan(session_id)
        return self._pair_named(session_id, names)

    # --- the user's order of pairs ----------------------------------------------------------------------

    def set_order(self, session_id: int, keys: list[str]) -> list[str]:
        """Keep the user's order of pairs ("reference name|candidate name"; pairs it does not name follow in
        execution order)."""
        with self.sessions.begin() as db:
            catalog.get_session(db, session_id).pair_order = list(keys)
        return keys

    def reset_order(self, session_id: int) -> None:
        with self.sessions.begin() as db:
            catalog.get_session(db, session_id).pair_order = None

    def move_pair(self, session_id: int, key: str, up: bool) -> None:
        """Move one pair a place up or down in the user's order."""
        with self.sessions.begin() as db:
            session = catalog.get_session(db, session_id)
            keys = [p.key for p in apply_order(session_pairs(db, session_id).pairs, session.pair_order)]
            if key in keys:
                i = keys.index(key)
                j = min(max(i + (-1 if up else 1), 0), len(keys) - 1)
                keys[i], keys[j] = keys[j], keys[i]
                session.pair_order = keys

    # ---------------------------------------------------------------------------------------------------

    def _find(self, session_id: int, names: tuple[str, str]) -> PairReport | None:
        with self.sessions() as db:
            report = session_pairs(db, session_id)
        return next((p for p in report.pairs if (p.a.name, p.b.name) == names), None)

    def _pair_named(self, session_id: int, names: tuple[str, str]) -> PairReport:
        found = self._find(session_id, names)
        if found is None:
            raise NotFoundError(f"no pair of {names[0]!r} and {names[1]!r} any more")
        return found


def _pair(db: DbSession, pair_id: int) -> PairRecord:
    pair = db.get(PairRecord, pair_id)
    if pair is None:
        raise NotFoundError(f"no pair with id {pair_id}")
    return pair


def _delete_overrides(db: DbSession, pair: PairRecord, action: str) -> None:
    db.query(PairOverrideRecord).filter_by(
        session_id=pair.session_id, run_b_id=pair.run_b_id, action=action, a_name=pair.a_name, b_name=pair.b_name
    ).delete()
