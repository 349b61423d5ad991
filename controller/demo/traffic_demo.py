"""`dualloop demo-traffic`: a scenario with every vehicle driven by the model through one DriveAgents
stream (controller/demo/traffic.py), against a server process on loopback, on held-out seeds.

Per seed it reports the agents, the collisions (between two agents, between an agent and a car the
simulator drives, off the road), the agent-ticks not NOMINAL, and the server's timing: LOCKSTEP ticks
have no wall-clock deadline (the client paces them), REALTIME ticks do: missed deadlines and
lateness from GetStats, the snapshots' own lateness, the client's late steps and the agent-snapshots
the server replaced before the client read them. In LOCKSTEP the figures that need a deadline do
not exist (null in --json, `-` in the table), and the server's ticks are those its snapshots carry.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from dualloop.controller.console import console
from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.demo.traffic import TrafficRecord, run_traffic
from dualloop.controller.logs.outputs import prepare_output_file
from dualloop.controller.server_process import ServerProcess, require_files
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.sim.env import make_batch
from dualloop.sim.scenarios import SCENARIOS
from dualloop.v2 import controller_pb2 as pb

# Seeds no model, gate or safety setting was fitted or tuned on (as demo-safety's).
HELD_OUT_SEEDS = (910_001, 910_002, 910_003)
CLOCKS = {"lockstep": pb.CLOCK_MODE_LOCKSTEP, "realtime": pb.CLOCK_MODE_REALTIME}


@dataclass
class TrafficRow:
    seed: int
    clock: str
    agents: int
    ticks: int
    wall_s: float
    collisions_between_agents: int
    collisions_with_others: int
    off_road: int
    left: int
    not_nominal_pct: float
    errors: int
    server_ticks: int  # the ticks the server ran for the agents (each decides every agent)
    # None: a figure that does not exist; in LOCKSTEP every one that needs a wall-clock deadline
    missed_deadlines: int | None
    server_lateness_p99_us: float | None
    server_lateness_max_us: float | None
    snapshot_lateness_p99_us: float | None
    client_behind: int | None
    agent_snapshots_dropped: int


def _row(seed: int, clock: str, rec: TrafficRecord, wall_s: float, stats: pb.GetStatsResponse) -> TrafficRow:
    late = np.asarray(rec.lateness_us, dtype=np.float64)
    # GetStats counts only the ticks run while a REALTIME session was open, so a LOCKSTEP run's
    # ticks are read from its snapshots; its deadline figures would read 0, as if all were on time
    realtime = clock == "realtime"
    return TrafficRow(
        seed=seed,
        clock=clock,
        agents=rec.agents,
        ticks=rec.ticks,
        wall_s=round(wall_s, 2),
        collisions_between_agents=rec.collisions_between_agents,
        collisions_with_others=rec.collisions_with_others,
        off_road=rec.off_road,
        left=len(rec.left),
        not_nominal_pct=round(100.0 * rec.not_nominal / max(rec.snapshots, 1), 2),
        errors=len(rec.errors),
        server_ticks=stats.ticks if realtime else rec.server_ticks,
        missed_deadlines=stats.missed_deadlines if realtime else None,
        server_lateness_p99_us=round(float(stats.lateness_p99_us), 1) if realtime else None,
        server_lateness_max_us=round(float(stats.lateness_max_us), 1) if realtime else None,
        snapshot_lateness_p99_us=round(float(np.percentile(late, 99)), 1) if late.size else None,
        client_behind=rec.client_behind if realtime else None,
        agent_snapshots_dropped=rec.agent_snapshots_dropped,
    )


def run_demo_traffic(
    model: Path,
    gates: list[Path],
    scenario: str,
    seeds: list[int],
    clock: str,
    duration_s: float | None,
) -> list[TrafficRow]:
    """One server process; each seed a DriveAgents stream with every vehicle of the scenario."""
    rows = []
    args = ["--model", str(model), *[a for g in gates for a in ("--gate", str(g))]]
    params: dict[str, Any] = {"duration_s": duration_s} if duration_s else {}
    with ServerProcess(args) as server, grpc.insecure_channel(server.address) as channel:
        for seed in seeds:
            env = make_batch(scenario, [seed], end_on_collision=False, **params)
            server.stub.GetStats(pb.GetStatsRequest(reset=True))
            t0 = time.monotonic()
            rec = run_traffic(env, channel, None, CLOCKS[clock])
            wall = time.monotonic() - t0
            rows.append(_row(seed, clock, rec, wall, server.stub.GetStats(pb.GetStatsRequest())))
            for err in rec.errors[:5]:
                console.print(f"[yellow]seed {seed}: {err}[/]")
            for when, back, front, v_back, v_front, s_back, s_front in rec.agent_collisions:
                console.print(
                    f"[red]seed {seed}, t={when:.2f} s: {back} ({v_back} m/s, {s_back}) ran into {front} "
                    f"({v_front} m/s, {s_front})[/]"
                )
    return rows


def _cell(value: float | None, fmt: str = ".0f") -> str:
    """A table cell: a figure that does not exist is a dash, as its null in --json."""
    return "-" if value is None else format(value, fmt)


def _print(rows: list[TrafficRow], scenario: str, model: Path) -> None:
    from rich.table import Table

    table = Table(title=f"{scenario}, every vehicle driven by {model.name} through one DriveAgents stream")
    cols: tuple[str, ...] = ("seed", "clock", "agents", "ticks", "coll. agents", "coll. others", "off-road", "left")
    cols += (
        "not NOMINAL %",
        "missed",
        "late p99 us",
        "late max us",
        "snap late p99 us",
        "client behind",
        "dropped",
        "wall s",
    )
    for c in cols:
        table.add_column(c, justify="right")
    for r in rows:
        red = lambda n: f"[red]{n}[/]" if n else "0"  # noqa: E731
        table.add_row(
            str(r.seed),
            r.clock,
            str(r.agents),
            str(r.ticks),
            red(r.collisions_between_agents),
            red(r.collisions_with_others),
            red(r.off_road),
            str(r.left),
            f"{r.not_nominal_pct:.2f}",
            _cell(r.missed_deadlines, "d"),
            _cell(r.server_lateness_p99_us),
            _cell(r.server_lateness_max_us),
            _cell(r.snapshot_lateness_p99_us),
            _cell(r.client_behind, "d"),
            str(r.agent_snapshots_dropped),
            f"{r.wall_s:.1f}",
        )
    console.print(table)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo-traffic", help="a scenario with every vehicle driven by the model through one DriveAgents stream"
    )
    p.add_argument("--model", type=Path, default=BASE_MODEL_PATH)
    p.add_argument("--gate", type=Path, action="append", help="gate files (default: the base model's two)")
    p.add_argument("--no-gate", action="store_true", help="drive without the OOD gates")
    p.add_argument("--scenario", default="dense_traffic", choices=sorted(SCENARIOS))
    p.add_argument(
        "--seeds", help=f"comma-separated episode seeds >= 0 (default: {','.join(map(str, HELD_OUT_SEEDS))})"
    )
    p.add_argument("--clock", choices=sorted(CLOCKS), default="lockstep")
    p.add_argument("--duration", type=float, help="seconds of sim time per seed, > 0 (default: the scenario's own)")
    p.add_argument("--json", type=Path, help="write every seed's row here (JSON; null: a figure that does not exist)")
    p.add_argument("--check", action="store_true", help="exit 1 when two agents collided on any seed")
    p.set_defaults(fn=_main)


def _seeds(text: str | None) -> list[int]:
    if text is None:
        return list(HELD_OUT_SEEDS)
    if not text.strip():  # an empty $SEEDS in a script: refused, not the long run of every default seed
        held_out = ",".join(map(str, HELD_OUT_SEEDS))
        raise ConfigError(f"--seeds {text!r}: empty; give comma-separated integers, or leave it out for {held_out}")
    try:
        seeds = [int(s) for s in text.split(",")]
    except ValueError:
        raise ConfigError(f"--seeds {text!r}: takes comma-separated integers") from None
    if min(seeds) < 0:  # numpy's seeding takes none below 0
        raise ConfigError(f"--seeds {text!r}: seeds must be integers >= 0")
    return seeds


def _check_args(args: argparse.Namespace, gates: list[Path]) -> list[int]:
    """Every argument checked before the server starts (a ConfigError: one line, exit 2); the seeds."""
    # 0 meant the scenario's own duration, below 0 no tick at all, nan a traceback
    if args.duration is not None and not (math.isfinite(args.duration) and args.duration > 0):
        raise ConfigError(f"--duration {args.duration}: must be a finite number of seconds > 0")
    seeds = _seeds(args.seeds)
    require_files(args.model, gates)
    if args.json:
        prepare_output_file(args.json, "--json", ConfigError)
    return seeds


def strict_json(value: object) -> str:
    """value as strict JSON: a figure that does not exist (nan: no snapshot lateness in a LOCKSTEP run,
    no onset in a run) is null, as JSON has no NaN (JavaScript's JSON.parse refuses it)."""

    def clean(v: object) -> object:
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        return [clean(x) for x in v] if isinstance(v, (list, tuple)) else v

    return json.dumps(clean(value), indent=2, allow_nan=False)


def _main(args: argparse.Namespace) -> int:
    shipped = [g for g in DEFAULT_GATES if g.is_file()] if args.model == BASE_MODEL_PATH else []
    gates = [] if args.no_gate else (args.gate or shipped)
    seeds = _check_args(args, gates)
    rows = run_demo_traffic(args.model, gates, args.scenario, seeds, args.clock, args.duration)
    _print(rows, args.scenario, args.model)
    if args.json:
        args.json.write_text(strict_json([asdict(r) for r in rows]))
    collided = [r.seed for r in rows if r.collisions_between_agents]
    if args.check and collided:
        console.print(f"[red]agents collided on seeds {collided}[/]")
        return 1
    return 0
