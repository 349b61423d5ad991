"""Step (c) of `dualloop qualify`: recorded shadow sessions (`dualloop serve --record-dir` beside a
real stack), when given.

Each recorded DecisionSnapshot names the model version that made it, so the candidate's ticks and
the baseline's are told apart even when one log holds both (the candidate served as the live model
on some sessions). Per model: agreement of the applied and of the proposed action with the action
the stack actually took (controller/contract/shadow.py ShadowAgreement, counted per tick as
GetShadowStats counts it) and the share of ticks the gate vetoed. A server that ran the candidate
beside the live model (`serve --candidate`) recorded its proposals in each live snapshot
(`candidate_never_applied`, with its version): they are the candidate's "beside" evidence, judged
against the live model's proposals on the same ticks (never applied, so there is no veto rate).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np

from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.contract.shadow import ShadowAgreement
from dualloop.controller.logs.logfile import LogFileError, read_sessions
from dualloop.controller.qualify.checks import Check, at_most, no_worse, not_judged
from dualloop.controller.qualify.criteria import ShadowCriteria
from dualloop.executor.model_card import ModelCard
from dualloop.v2 import controller_pb2 as pb

STEP: Final = "shadow"


@dataclass
class ShadowEvidence:
    """One model's ticks in the recorded shadow sessions."""

    version: str
    sessions: list[str] = field(default_factory=list)
    ticks: int = 0
    vetoed: int = 0
    applied: ShadowAgreement | None = None
    proposed: ShadowAgreement | None = None
    beside: ShadowAgreement | None = None  # proposals made beside another live model, never applied
    beside_ticks: int = 0

    @property
    def veto_rate(self) -> float:
        return self.vetoed / self.ticks if self.ticks else float("nan")

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "sessions": self.sessions,
            "ticks": self.ticks,
            "veto_rate": None if not self.ticks else self.veto_rate,
            "agreement_applied": _none(self.applied.agreement() if self.applied else float("nan")),
            "agreement_proposed": _none(self.proposed.agreement() if self.proposed else float("nan")),
            "applied": self.applied.as_dict() if self.applied else None,
            "proposed": self.proposed.as_dict() if self.proposed else None,
            "beside_ticks": self.beside_ticks,
            "agreement_beside": _none(self.beside.agreement() if self.beside else float("nan")),
            "beside": self.beside.as_dict() if self.beside else None,
        }


def _none(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def read_shadow_evidence(paths: Sequence[Path], card: ModelCard) -> dict[str, ShadowEvidence]:
    """model version -> its evidence over every session of the logs."""
    out: dict[str, ShadowEvidence] = {}
    n_ctl, actions = len(card.controls), list(card.actions)
    for path in paths:
        try:
            sessions = read_sessions(path)
        except (LogFileError, OSError) as err:  # the message names the file; say which flag gave it
            raise LogFileError(f"--shadow {err}; give recordings of `dualloop serve --record-dir`") from None
        for sid, data in sessions.items():
            if not data.snapshots:
                continue
            actual_of = {o.seq: o.actual if o.HasField("actual") else None for o in data.observations}
            by_version: dict[str, list[pb.DecisionSnapshot]] = {}
            for s in data.snapshots:
                by_version.setdefault(s.model_version, []).append(s)
            beside: dict[str, list[pb.DecisionSnapshot]] = {}
            for s in data.snapshots:
                if s.HasField("candidate_never_applied") and s.candidate_never_applied.model_version:
                    beside.setdefault(s.candidate_never_applied.model_version, []).append(s)
            for version, snaps in by_version.items():
                ev = _evidence(out, version, actions, n_ctl)
                _add(ev, snaps, actual_of, n_ctl)
                ev.sessions.append(f"{path}:{sid}")
            for version, snaps in beside.items():
                ev = _evidence(out, version, actions, n_ctl)
                _add_beside(ev, snaps, actual_of, n_ctl)
                ev.sessions.append(f"{path}:{sid} (beside the live model)")
    return out


def _evidence(out: dict[str, ShadowEvidence], version: str, actions: list[str], n_ctl: int) -> ShadowEvidence:
    ev = out.get(version)
    if ev is None:
        ev = out[version] = ShadowEvidence(
            version,
            applied=ShadowAgreement(actions, n_ctl, False),
            proposed=ShadowAgreement(actions, n_ctl, False),
            beside=ShadowAgreement(actions, n_ctl, False),
        )
    return ev


def _actuals(snaps: list[pb.DecisionSnapshot], actual_of: dict, n_ctl: int) -> tuple[np.ndarray, np.ndarray]:
    n = len(snaps)
    actual = np.full(n, -1, np.int64)
    actual_controls = np.full((n, n_ctl), np.nan)
    for i, s in enumerate(snaps):
        a = actual_of.get(s.observation_seq)
        if a is not None:
            actual[i] = a.action_index
            if len(a.controls) == n_ctl:
                actual_controls[i] = a.controls
    return actual, actual_controls


def _add_beside(ev: ShadowEvidence, snaps: list[pb.DecisionSnapshot], actual_of: dict, n_ctl: int) -> None:
    """A candidate's proposals recorded beside the live model: its action (a CandidateProposal carries
    no controls) against the actual one, under the live model's state and reasons of the tick."""
    n = len(snaps)
    actual, actual_controls = _actuals(snaps, actual_of, n_ctl)
    cand = np.fromiter((s.candidate_never_applied.action.index for s in snaps), np.int64, n)
    states = [pb.SafetyState.Name(s.safety_state) for s in snaps]
    reasons = [tuple(pb.ReasonCode.Name(r) for r in s.reasons) for s in snaps]
    assert ev.beside is not None  # made with it
    ev.beside.update_many(cand, np.full((n, n_ctl), np.nan), actual, actual_controls, states, reasons)
    ev.beside_ticks += n


def _add(ev: ShadowEvidence, snaps: list[pb.DecisionSnapshot], actual_of: dict, n_ctl: int) -> None:
    n = len(snaps)
    actual, actual_controls = _actuals(snaps, actual_of, n_ctl)

    def controls(acts: list[Any]) -> np.ndarray:
        return np.array([list(c) if len(c) == n_ctl else [np.nan] * n_ctl for c in acts], np.float64).reshape(n, n_ctl)

    states = [pb.SafetyState.Name(s.safety_state) for s in snaps]
    reasons = [tuple(pb.ReasonCode.Name(r) for r in s.reasons) for s in snaps]
    applied = np.fromiter((s.applied.index for s in snaps), np.int64, n)
    proposed = np.fromiter((s.proposed.action.index if s.HasField("proposed") else -1 for s in snaps), np.int64, n)
    assert ev.applied is not None and ev.proposed is not None  # made with both
    ev.applied.update_many(
        applied, controls([s.applied.controls for s in snaps]), actual, actual_controls, states, reasons
    )
    ev.proposed.update_many(
        proposed, controls([s.proposed.action.controls for s in snaps]), actual, actual_controls, states, reasons
    )
    ev.ticks += n
    ev.vetoed += sum(1 for s in snaps if s.gate.veto)


@dataclass
class ShadowStep:
    candidate: ShadowEvidence
    baseline: ShadowEvidence | None
    versions: dict[str, int]  # every model version in the logs -> ticks
    baseline_version: str = ""

    def _agreement(self, name: str, cand: float, base: float, c: ShadowCriteria) -> Check:
        """no_worse, or not judged naming what the logs lack: the stack's actual actions (sessions
        recorded without them) or the baseline's ticks."""
        if not np.isfinite(base):
            version = f" (version {self.baseline_version})" if self.baseline_version else ""
            who = f"the baseline{version} has no" if np.isfinite(cand) else "neither model has a"
            return not_judged(STEP, name, f"{who} tick with the stack's actual action in the shadow logs")
        return no_worse(STEP, name, cand, base, c.agreement_drop, True)

    def checks(self, c: ShadowCriteria) -> list[Check]:
        out = []
        if self.candidate.ticks:  # served as the live model: its applied decisions
            cand = self.candidate.applied.agreement() if self.candidate.applied else float("nan")
            base = self.baseline.applied.agreement() if self.baseline and self.baseline.applied else float("nan")
            out.append(self._agreement("shadow agreement (applied vs actual)", cand, base, c))
            if c.max_veto_rate is not None:
                out.append(at_most(STEP, "shadow veto rate", self.candidate.veto_rate, c.max_veto_rate))
        if self.candidate.beside_ticks:  # beside the live model: proposals against the live model's
            cand = self.candidate.beside.agreement() if self.candidate.beside else float("nan")
            base = self.baseline.proposed.agreement() if self.baseline and self.baseline.proposed else float("nan")
            out.append(self._agreement("shadow agreement beside the live model (proposed vs actual)", cand, base, c))
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate.as_dict(),
            "baseline": self.baseline.as_dict() if self.baseline else None,
            "versions": self.versions,
        }


def run_shadow_step(paths: Sequence[Path], candidate: ModelCard, baseline: ModelCard) -> ShadowStep:
    """The candidate's and the baseline's ticks in the logs; ConfigError when the candidate has none."""
    evidence = read_shadow_evidence(paths, candidate)
    versions = {v: e.ticks + e.beside_ticks for v, e in evidence.items()}
    cand = evidence.get(candidate.version)
    if cand is None or not (cand.ticks or cand.beside_ticks):
        raise ConfigError(
            f"--shadow: {', '.join(str(p) for p in paths)} hold no snapshots of the candidate "
            f"(model version {candidate.version}); they hold {versions or 'no snapshots at all'}. "
            "Record shadow sessions with the candidate as the live model or beside it (dualloop serve "
            "--record-dir [--candidate CANDIDATE.onnx])."
        )
    return ShadowStep(cand, evidence.get(baseline.version), versions, baseline.version)
