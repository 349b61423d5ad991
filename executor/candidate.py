"""A candidate model beside the live one: it decides on the live tick's batch and is never applied.

The candidate sees exactly the live model's input (the tick's raw features, history features and
plans, normalised by its own card) and proposes an action; the executor attaches the proposal to
each snapshot (`Snapshot.candidate`) after the live decision is made, so the candidate can neither
change nor delay what is applied beyond its own forward pass. Promotion (`Executor.promote`) makes
it the live model between two ticks; the sessions keep their state.

A candidate must run on the live sessions' input as it is, hence `check_compatible`: the same
feature schema (names, units, plan, actions, controls: the card's schema hash) and the same history
features (the sessions' history rings derive them). Its gates must give the same kinds of check as
the live gates, so a promotion never silently drops a check the operator relies on.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dualloop.executor.checks import CheckBoard
from dualloop.executor.default_plan import DefaultPlan
from dualloop.executor.gating import GateWiring
from dualloop.executor.model_card import ModelCard, Normalisation
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import CandidateProposal
from dualloop.ood import Gate

SHED_WINDOW = 16  # ticks whose median decides whether a running candidate is over budget


class SwapRefused(ValueError):
    """A candidate that cannot run beside, or replace, the live model; the message says why and what to do."""


def _differences(live: ModelCard, cand: ModelCard) -> list[str]:
    out = []
    for what, a, b in (
        ("features", [(f.name, f.unit) for f in live.features], [(f.name, f.unit) for f in cand.features]),
        ("plan", [(p.name, p.unit) for p in live.plan], [(p.name, p.unit) for p in cand.plan]),
        ("actions", list(live.actions), list(cand.actions)),
        ("controls", [(c.name, c.unit) for c in live.controls], [(c.name, c.unit) for c in cand.controls]),
    ):
        if a != b:
            only_live = [x for x in a if x not in b][:3]
            only_cand = [x for x in b if x not in a][:3]
            out.append(
                f"{what}: live has {len(a)}, candidate {len(b)}"
                + (f"; only live: {only_live}" if only_live else "")
                + (f"; only candidate: {only_cand}" if only_cand else "")
                + ("; same names in another order" if not only_live and not only_cand else "")
            )
    return out


def check_compatible(live: DecisionModel, candidate: DecisionModel, sessions_open: int) -> None:
    """SwapRefused unless the candidate can decide on (and take over) the live sessions' input."""
    lc, cc = live.card, candidate.card
    why = _differences(lc, cc)
    if lc.history_names != cc.history_names:
        why.append(
            f"history features: live derives {lc.history_names or 'none'}, candidate {cc.history_names or 'none'} "
            f"(the sessions' history rings are the live model's)"
        )
    if why:
        # the schema hash leaves the history features out: name it only when it differs
        schema = "" if cc.schema_hash() == lc.schema_hash() else f" (schema {cc.schema_hash()})"
        held = f"its {sessions_open} open session(s) send" if sessions_open else "its sessions send"
        raise SwapRefused(
            f"candidate {cc.name} {cc.version}{schema} cannot run on the input of live model {lc.name} "
            f"{lc.version} (schema {lc.schema_hash()}): {'; '.join(why)}. A swap keeps the server's input "
            f"({held} the live model's): the whole swap is refused. Serve a model of another schema on a new "
            f"server (or restart this one with it)."
        )


def check_same_checks(live: CheckBoard, candidate: CheckBoard, gate_paths: list[str]) -> None:
    """SwapRefused unless the candidate's gates give the same kinds of check as the live gates."""
    if live.kinds != candidate.kinds:
        have = ", ".join(k.name for k in candidate.kinds) or "none"
        want = ", ".join(k.name for k in live.kinds) or "none"
        raise SwapRefused(
            f"the candidate's gates ({', '.join(gate_paths) or 'none given'}) give the checks {have}; the live "
            f"model runs {want}. A promotion must keep every check: give the candidate its gate files fitted on "
            f"it, one per live gate, as the live model's were fitted (`dualloop gate fit --model <candidate>` "
            f"for a model on the simulator's schema)"
        )


@dataclass
class Candidate:
    """A loaded candidate: its model, its gates (wired to the executor's buffers, used only once
    promoted) and the buffers of its forward pass."""

    model: DecisionModel
    gates: list[Gate]
    gating: GateWiring
    checks: CheckBoard
    capacity: int
    normalisation: Normalisation = field(init=False)
    default_plan: DefaultPlan = field(init=False)
    version: str = field(init=False)

    def __post_init__(self) -> None:
        card = self.model.card
        self.version = card.version
        self.normalisation = Normalisation.of(card)
        self.default_plan = DefaultPlan.of(card)
        self._xn = np.zeros((self.capacity, self.model.n_inputs), np.float32)
        self._pn = np.zeros((self.capacity, self.model.n_plan), np.float32)
        self._inv_temperature = np.float32(1.0 / card.temperature)
        self._ctrl_min = np.array([c.min for c in card.controls], np.float32)
        self._ctrl_max = np.array([c.max for c in card.controls], np.float32)
        self._actions = list(card.actions)
        self._none = CandidateProposal(self.version, -1, "", np.zeros(0, np.float32), 0.0, 0.0)
        self.errors = 0  # ticks on which its forward pass raised (its proposals then: none)
        # Why it no longer decides ("" while it does): the models' time on its ticks went over the
        # tick's budget, so it was shed to keep the live model on time (account()).
        self.paused = ""
        self.on_pause: Callable[[str], None] | None = None  # told the reason once, when it pauses
        self._costs = np.zeros(SHED_WINDOW, np.int64)
        self._costs_n = 0

    def account(self, candidate_ns: int, live_ns: int, rows: int, budget_ns: int, period_ns: int) -> None:
        """After each tick it decided on: the candidate is paused once the median, over the last
        SHED_WINDOW such ticks, of the live forward pass plus the candidate's work exceeds budget_ns
        (0: never). The median, so that one tick slowed by the machine does not shed it."""
        if budget_ns <= 0:
            return
        self._costs[self._costs_n % SHED_WINDOW] = candidate_ns + live_ns
        self._costs_n += 1
        if self._costs_n < SHED_WINDOW or self._costs_n % SHED_WINDOW:
            return
        median = int(np.median(self._costs))
        if median <= budget_ns:
            return
        self.paused = (
            f"paused: the live model and candidate {self.version} took {median / 1e3:.0f} us a tick (median of "
            f"the last {SHED_WINDOW} ticks, {rows} rows on the last), over the {budget_ns / 1e3:.0f} us budget for "
            f"models ({budget_ns / period_ns:g} of the {period_ns / 1e6:g} ms tick, executor.model_budget_fraction); "
            f"load it again to retry"
        )
        if self.on_pause is not None:
            self.on_pause(self.paused)

    def decide(
        self,
        x: np.ndarray,
        p: np.ndarray,
        present: np.ndarray | None,
        finite: np.ndarray,
        no_plan: np.ndarray | None = None,
    ) -> list[CandidateProposal]:
        """One proposal per row of the live tick: `x` the model input (wire then history features,
        raw), `p` the plans the live model saw (raw), `present` the input profile, `finite` the live
        verdict on the rows' features (a row the live model could not score is not scored here either),
        `no_plan` the rows without a valid plan (None: none), which get the candidate's own default plan."""
        n = len(x)
        if no_plan is not None:
            p = p.copy()
            self.default_plan.fill(p, no_plan, x, present)
        if n > len(self._xn):  # the executor's max_sessions was raised on a running server
            self._xn = np.zeros((n, self.model.n_inputs), np.float32)
            self._pn = np.zeros((n, self.model.n_plan), np.float32)
        xn, pn, _ = self.normalisation.apply(x, p, self._xn[:n], self._pn[:n], present)
        try:
            out = self.model.forward(xn, pn, present)
        except Exception:  # noqa: BLE001 - the candidate failing must never touch the live tick
            self.errors += 1
            return [self._none] * n
        with np.errstate(invalid="ignore", over="ignore"):
            z = out.logits * self._inv_temperature
            z -= z.max(axis=1, keepdims=True)
            probs = np.exp(z)
            probs /= probs.sum(axis=1, keepdims=True)
        top = np.argsort(-probs, axis=1, kind="stable")[:, :2]
        rows = np.arange(n)
        top1 = probs[rows, top[:, 0]]
        margin = top1 - probs[rows, top[:, 1]]
        controls = np.clip(out.controls, self._ctrl_min, self._ctrl_max)
        ok = (finite & np.isfinite(probs).all(axis=1) & np.isfinite(controls).all(axis=1)).tolist()
        tops, confs, margins = top[:, 0].tolist(), top1.tolist(), margin.tolist()
        version, actions = self.version, self._actions
        return [
            CandidateProposal(version, tops[i], actions[tops[i]], controls[i], confs[i], margins[i])
            if ok[i]
            else self._none
            for i in range(n)
        ]
