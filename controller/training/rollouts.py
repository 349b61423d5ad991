"""Driving by the model itself in the simulator: the states it visits, and what the expert would do there.

A model trained on the expert's (noise-perturbed) driving still drifts into states the expert never
visits (it steered too little while braking hard behind a lead and left the road), and a gate fitted
only on the expert's driving vetoes the model where it drives differently on a perfectly nominal
road. These roll-outs record the model's own states, with the expert's action for each (DAgger, Ross
et al. 2011: the expert labels the learner's states), for training and for fitting gates. A batch of
episodes of one scenario is stepped together, each a REALTIME session of one executor without gates,
so one forward pass per step serves the whole batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dualloop.executor.core import Executor
from dualloop.executor.model_runner import DecisionModel
from dualloop.executor.snapshot import Clock, Observation
from dualloop.ood import Gate
from dualloop.sim.env import ExpertData, make_batch
from dualloop.sim.metrics import EpisodeMetrics
from dualloop.sim.schema import N_FEATURES, N_PLAN, label_from_accel
from dualloop.sim.world import DT

DT_NS = round(DT * 1e9)
PLAN_PERIOD_STEPS = 40  # the simulator's planner publishes a plan every 200 ms, as in closed loop


def run_model_batch(
    model: DecisionModel,
    name: str,
    seeds: Sequence[int],
    gates: list[Gate] | None = None,
    see_lane_ends: bool = True,
    **params,
) -> tuple[list[EpisodeMetrics], ExpertData]:
    """Drive len(seeds) episodes of scenario `name` with the model (and `gates`, if given), recording
    at every step the observation and the plan in effect as the executor saw them, the command the
    car was executing when it was taken (`applied`), and, as `controls` and `label`, the expert's
    action in that state (what it would command there; the label is its acceleration's band)."""
    env = make_batch(name, seeds, see_lane_ends=see_lane_ends, target_steps=None, **params)
    executor = Executor(model, None, gates)
    ids = [f"{name}-{s}" for s in seeds]
    for sid in ids:
        executor.open_session(sid, Clock.REALTIME, observation_period_ns=DT_NS)
    b, n = env.batch, env.n_steps
    feats = np.zeros((b, n, N_FEATURES), np.float32)
    plans = np.zeros((b, n, N_PLAN), np.float32)
    applied = np.full((b, n, 2), np.nan, np.float32)
    valid = np.zeros((b, n), bool)
    times = np.zeros(n)
    expert = np.zeros((b, n, 2), np.float32)
    controls = np.zeros((b, 2), np.float32)  # nothing applied before the first decision
    executing = controls.copy()
    in_effect = np.array(model.card.plan_default, np.float32)[None].repeat(b, axis=0)
    k = 0
    while not env.done and k < n:
        f, p = env.observe()
        active = ~env.done_mask
        send_plan = k % PLAN_PERIOD_STEPS == 0
        if send_plan:
            in_effect = p.copy()
        now = k * DT_NS
        obs = {
            sid: Observation(
                seq=k + 1,
                timestamp_ns=now,
                features=f[i],
                plan_id=f"sim-{k // PLAN_PERIOD_STEPS}" if send_plan else "",
                plan_values=p[i] if send_plan else None,
            )
            for i, sid in enumerate(ids)
            if active[i]
        }
        for snap in executor.step(obs, now):
            controls[ids.index(snap.session_id)] = snap.applied.controls
        feats[:, k], plans[:, k], valid[:, k], times[k] = f, in_effect, active, env.t
        expert[:, k, 0], expert[:, k, 1] = env.expert.act()
        if k:  # the command the car was executing when this observation was taken
            applied[:, k] = np.where(active[:, None], executing, np.nan)
        executing = controls.copy()
        env.step(controls[:, 0], controls[:, 1])
        k += 1
    metrics = env.metrics()
    assert isinstance(metrics, list)  # a batch
    return metrics, ExpertData(
        times[:k],
        feats[:, :k],
        plans[:, :k],
        label_from_accel(expert[:, :k, 0]),
        expert[:, :k],
        valid[:, :k],
        applied=applied[:, :k],
    )
