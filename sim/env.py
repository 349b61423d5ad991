"""Closed-loop stepping API and expert roll-outs for training data.

    env = make_scenario("cut_in", seed=3)
    while not env.done:
        features, plan = env.observe()      # float32 (19,), (6,)
        env.step(accel, steer)              # one 5 ms step
    env.metrics()                           # EpisodeMetrics

make_batch(name, seeds) gives the same API with a leading batch axis (B, ...), which is how
training data is generated quickly (run_expert_batch).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from dualloop.executor.action_labels import UNLABELLED, lookahead_labels
from dualloop.sim.expert import DriverStyle, Expert, TargetSteps
from dualloop.sim.metrics import EpisodeMetrics, MetricsRecorder
from dualloop.sim.scenarios import SCENARIOS, ScenarioInstance, build_scenario
from dualloop.sim.schema import FEATURE_INDEX, N_FEATURES, N_PLAN, PLAN_INDEX, clip_controls, label_from_accel
from dualloop.sim.sensors import Sensors
from dualloop.sim.world import EGO

FloatArray = npt.NDArray[np.float64]
PLAN_PERIOD_S: float = 0.2


class SimEnv:
    """A batch of B episodes of one scenario; with squeeze=True (B == 1) arrays lose the batch axis."""

    def __init__(
        self,
        instance: ScenarioInstance,
        end_on_collision: bool = True,
        squeeze: bool = False,
        see_lane_ends: bool = True,
        target_steps: TargetSteps | None = None,
        expert_style: DriverStyle | None = None,
    ) -> None:
        """target_steps: the expert's target speed steps within the drive (training data); None: it
        follows the scenario's cruise speed throughout, as the simulator's planner in closed loop.
        expert_style: the expert's car-following style per episode (None: ExpertParams')."""
        if squeeze and len(instance.seeds) != 1:
            raise ValueError("squeeze needs a single episode")
        self.instance = instance
        self.name = instance.name
        self.world = instance.world
        self.batch = self.world.batch
        self.duration_s = instance.duration_s
        self.end_on_collision = end_on_collision
        self.squeeze = squeeze
        self.sensors = Sensors(self.world, instance.seeds, instance.fault, see_lane_ends)
        self.n_steps = int(math.ceil(self.duration_s / self.world.dt - 1e-9))
        schedule = (
            None
            if target_steps is None
            else target_steps.sample(instance.seeds, instance.cruise_speed, self.duration_s)
        )
        self.expert = Expert(self.world, instance.cruise_speed, schedule=schedule, style=expert_style)
        self._plan_every = max(1, int(round(PLAN_PERIOD_S / self.world.dt)))
        self.recorder = MetricsRecorder(self.batch, self.n_steps, self.world.dt)
        self.finished = np.zeros(self.batch, dtype=bool)

    # ---- time and termination -------------------------------------------------------------------
    @property
    def t(self) -> float:
        return self.world.t

    @property
    def step_index(self) -> int:
        return self.world.step_index

    @property
    def done_mask(self) -> npt.NDArray[np.bool_]:
        """Per episode: time is up, or it crashed and crashes end episodes."""
        return self.finished | (self.world.step_index >= self.n_steps)

    @property
    def done(self) -> bool:
        return bool(self.done_mask.all())

    # ---- the loop ---------------------------------------------------------------------------------
    def _out(self, x: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return x[0] if self.squeeze else x

    def observe(self) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]:
        """(features, plan) float32: (N_FEATURES,), (N_PLAN,) or batched (B, ...).

        The plan is the built-in expert planner's, refreshed every 200 ms of sim time.
        """
        return self._out(self.sensors.observe()), self._out(self.expert.plan_vector.copy())

    def true_features(self) -> FloatArray:
        """Noise- and fault-free features (float64), e.g. for analysis and labels."""
        return self._out(self.sensors.true().copy())

    def expert_action(self) -> tuple[FloatArray, FloatArray]:
        """What the expert would command now: (accel, steer)."""
        accel, steer = self.expert.act()
        return self._out(accel), self._out(steer)

    def step(self, accel: npt.ArrayLike, steer: npt.ArrayLike) -> None:
        """Apply (accel m/s^2, steer rad), scalars or (B,), for one step of dt seconds."""
        if self.done:
            raise RuntimeError("episode is done")
        w = self.world
        cmd = np.clip(np.broadcast_to(np.asarray(accel, dtype=np.float64), (self.batch,)), -8.0, 3.0)
        active = ~self.done_mask
        w.step(cmd, np.broadcast_to(np.asarray(steer, dtype=np.float64), (self.batch,)))
        self.recorder.update(
            w.t,
            self.sensors.true(),
            w.v[:, EGO],
            w.a[:, EGO],
            cmd,
            active,
            threat=w.ego_threat(),
            rear=w.ego_rear(),
        )
        if self.end_on_collision:
            self.finished |= w.crashed
        if w.step_index % self._plan_every == 0:
            self.expert.plan()

    # ---- results ----------------------------------------------------------------------------------
    def metrics(self) -> EpisodeMetrics | list[EpisodeMetrics]:
        w = self.world
        eps = [
            self.recorder.episode(
                b, self.instance.seeds[b], int(w.collision_count[b]), bool(w.off_road[b]), int(w.rear_end_count[b])
            )
            for b in range(self.batch)
        ]
        return eps[0] if self.squeeze else eps


def make_scenario(
    name: str, seed: int, end_on_collision: bool = True, see_lane_ends: bool = True, **params: Any
) -> SimEnv:
    """One episode of a registered scenario, arrays without batch axis."""
    return SimEnv(
        build_scenario(name, [seed], **params),
        end_on_collision=end_on_collision,
        squeeze=True,
        see_lane_ends=see_lane_ends,
    )


def make_batch(
    name: str,
    seeds: Sequence[int],
    end_on_collision: bool = True,
    see_lane_ends: bool = True,
    target_steps: TargetSteps | None = None,
    **params: Any,
) -> SimEnv:
    """len(seeds) episodes of a scenario stepped together, arrays with a leading batch axis."""
    return SimEnv(
        build_scenario(name, list(seeds), **params),
        end_on_collision=end_on_collision,
        see_lane_ends=see_lane_ends,
        target_steps=target_steps,
    )


@dataclass
class ExpertData:
    """Training pairs (features, plan) -> (label, controls); leading axes (B, T)."""

    t: FloatArray  # (T,)
    features: npt.NDArray[np.float32]  # (B, T, N_FEATURES) as the sensors reported them
    plan: npt.NDArray[np.float32]  # (B, T, N_PLAN)
    label: npt.NDArray[np.int64]  # (B, T) index into ACTIONS
    controls: npt.NDArray[np.float32]  # (B, T, 2) accel, steer
    valid: npt.NDArray[np.bool_]  # (B, T) False after an episode ended (crash)
    # The command the ego was executing when each observation was taken: what the previous step
    # applied (noise included, clipped as the simulator clips it), NaN before the first step. This
    # is what a closed-loop client sends as the observation's actual action (controller.proto).
    applied: npt.NDArray[np.float32] | None = None  # (B, T, 2) accel, steer
    # With relabel: the same recorded states under another target speed (TargetSteps.alternatives),
    # as if a planner had just switched to it, and the expert's controls for it (the steering is
    # the same; "stop" plans keep theirs). Teaches the executor that the target speed changes how
    # it accelerates, never where it steers. None without.
    alt_plan: npt.NDArray[np.float32] | None = None  # (B, T, N_PLAN)
    alt_label: npt.NDArray[np.int64] | None = None  # (B, T)
    alt_controls: npt.NDArray[np.float32] | None = None  # (B, T, 2)

    def lookahead_label(self) -> npt.NDArray[np.int64]:
        """(B, T) the action as a recorded human's is labelled (executor.action_labels): the band of
        the measured speed's slope over the next 0.5 s; UNLABELLED where that runs past the end of
        the episode or past its crash."""
        out = np.full(self.valid.shape, UNLABELLED, dtype=np.int64)
        for b in range(self.valid.shape[0]):
            n = int(self.valid[b].sum())  # valid is a prefix: an episode only ends
            if n > 1:
                out[b, :n] = lookahead_labels(self.t[:n], self.features[b, :n, FEATURE_INDEX["ego_speed"]])[0]
        return out


@dataclass(frozen=True)
class ActionNoise:
    """Perturbation of the *executed* expert action (labels stay the expert's clean action).

    Imitation from clean demonstrations never shows the learner a state off the expert's path, so a
    learned policy that drifts a little has never seen the correction (covariate shift; DART, Laskey
    et al. 2017). An Ornstein-Uhlenbeck process per episode, seeded from the episode's own seed so an
    episode still does not depend on its batch.
    """

    accel_std: float = 0.5  # m/s^2
    steer_std: float = 0.02  # rad; 0.01 left the learned steering unstable after cut-ins (6 of 36 held-out runs)
    tau_s: float = 0.5
    seed: int = 0

    def sample(self, seeds: Sequence[int], n_steps: int, dt: float) -> tuple[FloatArray, FloatArray]:
        decay = math.exp(-dt / self.tau_s)
        scale = math.sqrt(1.0 - decay * decay)
        out = np.zeros((2, len(seeds), n_steps))
        for b, seed in enumerate(seeds):
            white = np.random.default_rng([int(seed), self.seed, 0x0A11]).standard_normal((2, n_steps))
            for k in range(1, n_steps):  # n_steps is a few thousand: fine once per episode
                out[:, b, k] = decay * out[:, b, k - 1] + scale * white[:, k]
        return out[0] * self.accel_std, out[1] * self.steer_std


# The expert's target speed in the roll-outs that train the executor and fit its gates (and in the
# gates' nominal evaluation): it changes within a drive, as a planner's does (TargetSteps).
EXPERT_TARGET_STEPS: TargetSteps = TargetSteps()


def run_expert_batch(
    name: str,
    seeds: Sequence[int],
    every: int = 1,
    noise: ActionNoise | None = None,
    see_lane_ends: bool = True,
    target_steps: TargetSteps | None = EXPERT_TARGET_STEPS,
    relabel: bool = False,
    **params: Any,
) -> tuple[list[EpisodeMetrics], ExpertData]:
    """Drive len(seeds) episodes with the expert, recording every `every`-th step.

    With `noise`, the executed action is the expert's plus the noise; the recorded controls and
    labels are always the expert's own. see_lane_ends: see sim.sensors.true_features.
    target_steps: how the expert's target speed changes within a nominal drive (None: the scenario's
    cruise speed throughout). Out-of-distribution scenarios always keep their own speeds: the fault
    is what they are about, and speed_out_of_range is defined by its speed.
    relabel: also record every state under another target speed (ExpertData.alt_plan); needs
    target_steps and a nominal scenario.
    """
    steps = target_steps if name in SCENARIOS and not SCENARIOS[name].ood else None
    env = make_batch(name, seeds, see_lane_ends=see_lane_ends, target_steps=steps, **params)
    accel_noise, steer_noise = noise.sample(seeds, env.n_steps, env.world.dt) if noise else (None, None)
    n_rec = (env.n_steps + every - 1) // every
    b = env.batch
    feats = np.zeros((b, n_rec, N_FEATURES), dtype=np.float32)
    plans = np.zeros((b, n_rec, N_PLAN), dtype=np.float32)
    controls = np.zeros((b, n_rec, 2), dtype=np.float32)
    applied = np.full((b, n_rec, 2), np.nan, dtype=np.float32)
    in_effect = np.full((b, 2), np.nan)  # the command the last step applied
    valid = np.zeros((b, n_rec), dtype=bool)
    times = np.zeros(n_rec)
    relabelling = relabel and steps is not None
    if relabelling:
        assert steps is not None  # relabelling says so
        alt_speed = steps.alternatives(seeds, env.instance.cruise_speed, n_rec)
        alt_plans = np.zeros_like(plans)
        alt_accel = np.zeros((b, n_rec), dtype=np.float32)
    k = 0
    while not env.done:
        accel, steer = env.expert.act()
        if env.step_index % every == 0:
            f, p = env.observe()
            feats[:, k], plans[:, k] = f, p
            controls[:, k, 0], controls[:, k, 1] = accel, steer
            applied[:, k] = in_effect
            valid[:, k] = ~env.done_mask
            times[k] = env.t
            if relabelling:
                stop = p[:, PLAN_INDEX["plan_stop"]] > 0.5
                other, _ = env.expert.act(alt_speed[:, k])
                alt_plans[:, k] = p
                alt_plans[:, k, PLAN_INDEX["target_speed"]] = np.where(
                    stop, p[:, PLAN_INDEX["target_speed"]], alt_speed[:, k]
                )
                alt_accel[:, k] = np.where(stop, accel, other)
            k += 1
        if accel_noise is not None:
            assert steer_noise is not None  # sampled together
            i = env.step_index
            accel, steer = accel + accel_noise[:, i], steer + steer_noise[:, i]
        in_effect = np.stack(np.broadcast_arrays(*clip_controls(accel, steer)), axis=1)
        env.step(accel, steer)
    data = ExpertData(
        times[:k],
        feats[:, :k],
        plans[:, :k],
        label_from_accel(controls[:, :k, 0]),
        controls[:, :k],
        valid[:, :k],
        applied=applied[:, :k],
    )
    if relabelling:
        _add_alternatives(data, alt_plans[:, :k], alt_accel[:, :k])
    metrics = env.metrics()
    assert isinstance(metrics, list)
    return metrics, data


def _add_alternatives(data: ExpertData, alt_plans: np.ndarray, alt_accel: np.ndarray) -> None:
    """The relabelled drive onto `data`: every recorded state under another target speed, its plan and
    the expert's acceleration there (the steering as recorded)."""
    alt_controls = data.controls.copy()
    alt_controls[..., 0] = alt_accel
    data.alt_plan, data.alt_label, data.alt_controls = alt_plans, label_from_accel(alt_accel), alt_controls


def run_expert_episode(name: str, seed: int, every: int = 1, **params: Any) -> tuple[EpisodeMetrics, ExpertData]:
    """One expert episode; ExpertData keeps a batch axis of 1 so batches concatenate simply."""
    metrics, data = run_expert_batch(name, [seed], every=every, **params)
    return metrics[0], data
