"""Shadow-mode agreement: the controller's applied decisions against the actions actually taken.

Counted per tick where the observation carried the actual action: top-1 agreement of the discrete
decision, the confusion matrix (actual x applied), and the error of each continuous control, overall
and broken down by safety state and by reason code, so "agrees 90%, but 40% while the gate vetoes"
is visible; the same for the model's proposed action (`proposed`), so a veto that overrode a correct
proposal shows too. Used live by the server (GetShadowStats) and offline by replay reports.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from dualloop.v2 import controller_pb2 as pb


@dataclass
class _Group:
    ticks: int = 0
    agreeing: int = 0
    abs_err: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sq_err: np.ndarray = field(default_factory=lambda: np.zeros(0))
    with_controls: int = 0


class ShadowAgreement:
    def __init__(self, actions: list[str], n_controls: int, track_proposed: bool = True) -> None:
        self.actions = list(actions)
        self.n_controls = n_controls
        self.confusion = np.zeros((len(actions), len(actions)), np.int64)
        self.groups: dict[str, _Group] = {}
        self.without_actual = 0
        # ticks whose actual controls were non-finite and discarded (their action index still counts)
        self.unknown_actual_controls = 0  # ticks with a non-finite (not known) actual control
        # the same tallies with the proposed action in place of the applied one (live `update` only)
        self.proposed = ShadowAgreement(actions, n_controls, track_proposed=False) if track_proposed else None

    def update(
        self,
        applied_index: int,
        applied_controls: np.ndarray,
        actual_index: int,
        actual_controls: np.ndarray | None,
        state: str,
        reasons: tuple[str, ...],
        proposed_index: int = -1,
        proposed_controls: np.ndarray | None = None,
    ) -> None:
        """One tick; the proposal (index -1: the model did not propose) is tallied in `proposed`."""
        if actual_index < 0:
            self.without_actual += 1
            return
        if self.proposed is not None and proposed_index >= 0:
            assert proposed_controls is not None  # a proposal always has its controls
            self.proposed.update(proposed_index, proposed_controls, actual_index, actual_controls, state, reasons)
        agree = applied_index == actual_index
        if applied_index >= 0:
            self.confusion[actual_index, applied_index] += 1
        err = None
        if actual_controls is not None and actual_controls.size == self.n_controls:
            err = np.asarray(applied_controls, np.float64) - np.asarray(actual_controls, np.float64)
            if not np.isfinite(err).all():  # a control not known: the tick's controls are not counted
                err = None
        abs_err, sq_err = (np.abs(err), err * err) if err is not None else (None, None)
        for key in ("all", f"state:{state}", *(f"reason:{r}" for r in reasons)):
            self._add(key, 1, int(agree), int(err is not None), abs_err, sq_err)

    def update_many(
        self,
        applied_index: np.ndarray,
        applied_controls: np.ndarray,
        actual_index: np.ndarray,
        actual_controls: np.ndarray,
        states: Sequence[str],
        reasons: Sequence[tuple[str, ...]],
    ) -> None:
        """`update` for many ticks at once (replay reports), vectorised over ticks: the same counts.
        actual_controls is (ticks, n_controls) with a NaN row where the tick had none."""
        has = np.asarray(actual_index) >= 0
        self.without_actual += int(np.count_nonzero(~has))
        rows = np.flatnonzero(has)
        applied, actual = np.asarray(applied_index)[rows], np.asarray(actual_index)[rows]
        scored = applied >= 0
        np.add.at(self.confusion, (actual[scored], applied[scored]), 1)
        agree = applied == actual
        err = np.asarray(applied_controls, np.float64)[rows] - np.asarray(actual_controls, np.float64)[rows]
        with_controls = cast("np.ndarray", np.isfinite(err).all(axis=1))  # (ticks,); the stubs allow a scalar
        err[~with_controls] = 0.0
        # every group a tick belongs to, first seen first (the order `update` would create them in).
        # A tick's groups depend only on its (state, reasons): work per distinct pair, not per tick.
        # Ticks come in runs sharing their state and reason objects (a replay's columns do): runs
        # are told apart by identity in numpy, and only each run's pair is looked up by value.
        combos: dict[tuple[str, tuple[str, ...]], int] = {}
        state_ids = np.fromiter(map(id, states), np.int64, len(states))[rows]
        reason_ids = np.fromiter(map(id, reasons), np.int64, len(reasons))[rows]
        new_run = np.ones(len(rows), bool)
        new_run[1:] = (state_ids[1:] != state_ids[:-1]) | (reason_ids[1:] != reason_ids[:-1])
        starts = np.flatnonzero(new_run)
        run_codes = []
        first_of_combo: list[int] = []  # the tick (of rows) each pair is first seen at
        for start, k in zip(starts.tolist(), rows[starts].tolist()):
            c = combos.setdefault((states[k], tuple(reasons[k])), len(combos))
            if c == len(first_of_combo):
                first_of_combo.append(start)
            run_codes.append(c)
        codes = np.repeat(np.array(run_codes, np.int64), np.diff(np.append(starts, len(rows))))
        first: dict[str, tuple[int, int]] = {}
        combos_of: dict[str, list[int]] = {}
        for (state, tick_reasons), c in combos.items():
            for rank, key in enumerate(("all", f"state:{state}", *(f"reason:{r}" for r in tick_reasons))):
                seen = (first_of_combo[c], rank)
                if key not in first or seen < first[key]:
                    first[key] = seen
                combos_of.setdefault(key, []).append(c)
        for key in sorted(first, key=first.__getitem__):
            member = np.zeros(len(combos), bool)
            member[combos_of[key]] = True
            m = np.flatnonzero(member[codes])
            e, w = err[m], with_controls[m]
            self._add(
                key,
                len(m),
                int(np.count_nonzero(agree[m])),
                int(np.count_nonzero(w)),
                np.abs(e[w]).sum(axis=0),
                (e[w] * e[w]).sum(axis=0),
            )

    def _add(
        self,
        key: str,
        ticks: int,
        agreeing: int,
        with_controls: int,
        abs_err: np.ndarray | None,
        sq_err: np.ndarray | None,
    ) -> None:
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = _Group(abs_err=np.zeros(self.n_controls), sq_err=np.zeros(self.n_controls))
        g.ticks += ticks
        g.agreeing += agreeing
        if with_controls:
            g.with_controls += with_controls
            g.abs_err += abs_err
            g.sq_err += sq_err

    def agreement(self, key: str = "all") -> float:
        g = self.groups.get(key)
        return g.agreeing / g.ticks if g and g.ticks else float("nan")

    def _groups_proto(self) -> list[pb.AgreementGroup]:
        groups = []
        for key, g in self.groups.items():
            n = max(g.with_controls, 1)
            groups.append(
                pb.AgreementGroup(
                    key=key,
                    ticks=g.ticks,
                    agreeing=g.agreeing,
                    control_mae=(g.abs_err / n).tolist(),
                    control_rmse=np.sqrt(g.sq_err / n).tolist(),
                )
            )
        return groups

    def to_proto(self, session_id: str, session_instance: str = "") -> pb.GetShadowStatsResponse:
        msg = pb.GetShadowStatsResponse(
            session_id=session_id,
            actions=self.actions,
            confusion=self.confusion.ravel().tolist(),
            groups=self._groups_proto(),
            ticks_without_actual=self.without_actual,
            session_instance=session_instance,
            ticks_invalid_actual_controls=self.unknown_actual_controls,
        )
        if self.proposed is not None:
            msg.proposed_confusion.extend(self.proposed.confusion.ravel().tolist())
            msg.proposed_groups.extend(self.proposed._groups_proto())
        return msg

    def as_dict(self) -> dict:
        return {
            "actions": self.actions,
            "confusion": self.confusion.tolist(),
            "ticks_without_actual": self.without_actual,
            "groups": {
                k: {
                    "ticks": g.ticks,
                    "agreement": g.agreeing / g.ticks if g.ticks else None,
                    "control_mae": (g.abs_err / max(g.with_controls, 1)).tolist(),
                    "control_rmse": np.sqrt(g.sq_err / max(g.with_controls, 1)).tolist(),
                }
                for k, g in self.groups.items()
            },
        }


class CandidateTally:
    """A candidate model's proposals against the live model's on one session's ticks
    (GetShadowStatsResponse.candidate): agreement, the migration matrix (live proposed x candidate)
    and, where the actual action is known, how often each matched it. One candidate version: a
    new candidate starts a new tally. Counted in plain Python per tick (a few rows of small numbers:
    numpy's per-call cost would be most of the tick's share)."""

    def __init__(self, candidate_version: str, actions: list[str], n_controls: int) -> None:
        self.candidate_version = candidate_version
        self.live_version = ""
        self.ticks = 0
        self.compared = 0
        self.agree_live = 0
        self.agree_applied = 0
        self.migration = [[0] * len(actions) for _ in actions]
        self.abs_diff = [0.0] * n_controls
        self.with_actual = 0
        self.live_actual = 0
        self.candidate_actual = 0

    def update(
        self,
        live_version: str,
        live_index: int,
        live_controls: np.ndarray,
        applied_index: int,
        candidate_index: int,
        candidate_controls: np.ndarray,
        actual_index: int,
    ) -> None:
        """One tick; only ticks where both models proposed (index >= 0) are compared."""
        self.ticks += 1
        self.live_version = live_version
        if live_index < 0 or candidate_index < 0:
            return
        self.compared += 1
        self.agree_live += live_index == candidate_index
        self.agree_applied += applied_index == candidate_index
        self.migration[live_index][candidate_index] += 1
        diff = self.abs_diff
        if len(candidate_controls) == len(diff) == len(live_controls):
            for k, (c, v) in enumerate(zip(candidate_controls.tolist(), live_controls.tolist())):
                diff[k] += abs(c - v)
        if actual_index >= 0:
            self.with_actual += 1
            self.live_actual += live_index == actual_index
            self.candidate_actual += candidate_index == actual_index

    def to_proto(self) -> pb.CandidateAgreement:
        n = max(self.compared, 1)
        return pb.CandidateAgreement(
            candidate_version=self.candidate_version,
            live_version=self.live_version,
            ticks=self.ticks,
            compared=self.compared,
            agreeing_with_live_proposed=self.agree_live,
            agreeing_with_applied=self.agree_applied,
            migration=[count for row in self.migration for count in row],
            control_mad=[d / n for d in self.abs_diff],
            with_actual=self.with_actual,
            live_agreeing_with_actual=self.live_actual,
            candidate_agreeing_with_actual=self.candidate_actual,
        )
