"""`dualloop highway`: highway-env's ego driven by dualloop over gRPC, with and without the OOD gate,
next to highway-env's own IDM-driven ego on the same seeds.

One `dualloop serve` process per gate setting on loopback (the server's built-in behaviour planner
plans every LOCKSTEP session, as in `dualloop demo`); the episodes run one after the other.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
from rich.console import Console
from rich.table import Table

from dualloop.controller.highway.adapter import SUITE, Episode, drive_dualloop, drive_idm
from dualloop.controller.server_process import ServerProcess

# pygame is imported by highway-env; nothing here renders, and no window may open
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
FIRST_SEED = 1000


@dataclass
class Row:
    env: str
    driver: str
    episodes: list[Episode]

    @property
    def collisions(self) -> int:
        return sum(e.collided for e in self.episodes)


def serve_args(gates: Sequence[Path], config: Path) -> tuple[str, ...]:
    return (*(a for g in gates for a in ("--gate", str(g))), "--config", str(config), "--log-level", "ERROR")


def run_dualloop(
    model: Path,
    gates: Sequence[Path],
    envs: Sequence[str],
    seeds: Sequence[int],
    max_seconds: float | None,
    policy_hz: int | None = None,
) -> list[Episode]:
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "server.toml"
        config.write_text('[planner]\nsource = "behaviour"\n')
        with ServerProcess(("--model", str(model), *serve_args(gates, config)), Path(tmp)) as server:
            with grpc.insecure_channel(server.address) as channel:
                return [drive_dualloop(SUITE[e], s, channel, max_seconds, policy_hz) for e in envs for s in seeds]


def run_suite(
    model: Path,
    gates: Sequence[Path],
    envs: Sequence[str],
    n_seeds: int,
    with_gate: bool = True,
    max_seconds: float | None = None,
    policy_hz: int | None = None,
) -> list[Row]:
    unknown = [e for e in envs if e not in SUITE]
    if unknown:
        raise ValueError(f"--envs: unknown {', '.join(unknown)}; choose from {', '.join(SUITE)}")
    # a period of whole 5 ms ticks (200 % hz), dividing every suite env's simulation frequency (15 and 5 Hz)
    if policy_hz is not None and (policy_hz < 1 or 200 % policy_hz or 5 % policy_hz):
        raise ValueError(f"--policy-hz {policy_hz}: must divide the envs' simulation frequencies (1 or 5)")
    seeds = [FIRST_SEED + i for i in range(n_seeds)]
    runs: dict[str, list[Episode]] = {}
    if with_gate and gates:
        runs["dualloop + gate"] = run_dualloop(model, gates, envs, seeds, max_seconds, policy_hz)
    runs["dualloop, no gate"] = run_dualloop(model, (), envs, seeds, max_seconds, policy_hz)
    runs["highway-env IDM"] = [drive_idm(SUITE[e], s, max_seconds, policy_hz) for e in envs for s in seeds]
    return [
        Row(env, driver, [ep for ep in episodes if ep.env == env]) for env in envs for driver, episodes in runs.items()
    ]


def table(rows: list[Row], title: str) -> Table:
    t = Table(title=title)
    for c in ("env", "ego driver", "episodes", "collisions", "off-road", "min TTC s", "median min TTC s", "vetoes"):
        t.add_column(c, justify="left" if c in ("env", "ego driver") else "right")
    t.add_column("fallback s", justify="right")
    t.add_column("sim s", justify="right")
    for r in rows:
        ttc = [e.min_ttc_s for e in r.episodes]
        dual = r.driver != "highway-env IDM"
        t.add_row(
            r.env,
            r.driver,
            str(len(r.episodes)),
            f"[red]{r.collisions}[/]" if r.collisions else "0",
            str(sum(e.off_road for e in r.episodes)),
            f"{min(ttc):.1f}" if not math.isinf(min(ttc)) else "inf",
            f"{float(np.median(ttc)):.1f}" if not math.isinf(float(np.median(ttc))) else "inf",
            str(sum(e.vetoes for e in r.episodes)) if dual else "-",
            f"{sum(e.fallback_s for e in r.episodes):.2f}" if dual else "-",
            f"{sum(e.seconds for e in r.episodes):.0f}",
        )
    return t


def print_suite(rows: list[Row], model: Path, console: Console, policy_hz: int | None = None) -> None:
    hz = f"{policy_hz} Hz policy" if policy_hz else "the envs' own policy frequency"
    console.print(
        table(
            rows,
            f"highway-env closed loop, model {model.name}, seeds {FIRST_SEED}.., {hz} "
            "(TTC to the in-lane lead, sampled at the policy frequency)",
        )
    )
