"""Throughput of this simulator against highway-env at the same configuration.

    python -m controller.bench.sim --seconds 5

highway-env is an optional, bench-only dependency (`pip install highway-env`); when it is missing
the result says so instead of failing.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from dualloop.sim.env import make_batch
from dualloop.sim.scenarios import build_scenario
from dualloop.sim.world import DT


@dataclass
class BenchResult:
    vehicles: int
    hz: int
    batch: int
    ours_steps_per_s: float  # single episode, world physics + traffic only
    ours_env_steps_per_s: float  # single episode, full closed loop: sensors, expert, metrics
    ours_batch_episode_steps_per_s: float  # episode-steps/s when `batch` episodes step together
    highway_env_steps_per_s: float | None
    ratio_single: float | None  # ours_steps_per_s / highway_env_steps_per_s
    ratio_batch: float | None
    highway_env_note: str


def _time_loop(step: Any, seconds: float) -> float:
    """Steps per second of `step()` over about `seconds` of wall time."""
    n, start = 0, time.perf_counter()
    while True:
        for _ in range(200):
            step()
        n += 200
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n / elapsed


def _ours_world(vehicles: int, batch: int, seconds: float) -> float:
    world = build_scenario("nominal_cruise", list(range(batch)), n_traffic=vehicles).world
    accel, steer = np.zeros(batch), np.zeros(batch)
    return _time_loop(lambda: world.step(accel, steer), seconds)


def _ours_env(vehicles: int, seconds: float) -> float:
    env = make_batch("nominal_cruise", [0], n_traffic=vehicles, duration_s=3600.0)

    def step() -> None:
        env.observe()
        accel, steer = env.expert.act()
        env.step(accel, steer)

    return _time_loop(step, seconds)


def _highway_env(vehicles: int, hz: int, seconds: float) -> tuple[float | None, str]:
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # never open a window
    try:
        import gymnasium as gym
        import highway_env  # noqa: F401  (registers the environments)
    except ImportError as exc:
        return None, f"highway-env not importable ({exc}); pip install highway-env to compare"
    env = gym.make(
        "highway-v0",
        render_mode=None,
        config={
            "vehicles_count": vehicles,
            "simulation_frequency": hz,
            "policy_frequency": hz,
            "offscreen_rendering": True,
            "duration": 10**9,
        },
    )
    env.reset(seed=0)
    idle = 1  # DiscreteMetaAction IDLE
    state = {"resets": 0}

    def step() -> None:
        _, _, terminated, truncated, _ = env.step(idle)
        if terminated or truncated:  # a crash ends the episode; keep measuring on a fresh one
            state["resets"] += 1
            env.reset(seed=state["resets"])

    rate = _time_loop(step, seconds)
    env.close()
    version = getattr(highway_env, "__version__", "?")
    return rate, f"highway-env {version}, highway-v0, {state['resets']} resets during the run"


def bench_sim(vehicles: int = 20, hz: int = 200, seconds: float = 3.0, batch: int = 64) -> BenchResult:
    """Measure both simulators in this process; `hz` must match our fixed 5 ms step."""
    if abs(1.0 / hz - DT) > 1e-12:
        raise ValueError(f"this simulator steps at {1.0 / DT:.0f} Hz")
    single = _ours_world(vehicles, 1, seconds)
    env_rate = _ours_env(vehicles, seconds)
    batched = _ours_world(vehicles, batch, seconds) * batch
    hw, note = _highway_env(vehicles, hz, seconds)
    return BenchResult(
        vehicles=vehicles,
        hz=hz,
        batch=batch,
        ours_steps_per_s=single,
        ours_env_steps_per_s=env_rate,
        ours_batch_episode_steps_per_s=batched,
        highway_env_steps_per_s=hw,
        ratio_single=None if hw is None else single / hw,
        ratio_batch=None if hw is None else batched / hw,
        highway_env_note=note,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vehicles", type=int, default=20)
    parser.add_argument("--hz", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    print(json.dumps(asdict(bench_sim(args.vehicles, args.hz, args.seconds, args.batch)), indent=2))


if __name__ == "__main__":
    main()
