"""The main job: the scenario suite driven in closed loop by the controller over its gRPC API.

A server process serves the model on loopback; this process runs each scenario of the simulator as
an ordinary LOCKSTEP gRPC client, then prints one row per scenario and writes logs, plots and a
report under runs/<timestamp>/. Scenarios planned by the server's built-in planner and scenarios
planned by the simulator go to two server processes, one after the other (see plan_sources()).
Each server records its sessions (`--record-dir`): logs/<plan source>.mcap, one plot topic per
scenario (`/dualloop/<scenario>-<seed>/plot`), and foxglove-layout.json opens them in Foxglove.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import grpc
import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from dualloop.controller.demo.closed_loop import ClosedLoopRun, drive_over_grpc, session_id
from dualloop.controller.demo.harm import drive_offs, time_to_standstill, transition_step
from dualloop.controller.demo.report import plot_run, plot_tick_work, write_report
from dualloop.controller.logs.foxglove import layout
from dualloop.controller.server_process import ServerProcess
from dualloop.sim.scenarios import SCENARIOS
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import controller_pb2_grpc as pb_grpc

HELD_OUT_SEED = 900_001  # far from any training seed range


@dataclass
class ScenarioRow:
    scenario: str
    ood: bool
    seed: int
    collisions: int
    off_road: bool
    min_ttc_s: float
    min_gap_m: float
    hard_brakes: int
    max_jerk: float
    gate_vetoes: int  # ticks whose applied action was vetoed by the gate
    fallback_s: float
    tick_work_p99_us: float  # the executor's stages per tick (LOCKSTEP ticks have no wall-clock deadline)
    missed_deadlines: int
    round_trip_p99_us: float
    plan_updates: int
    ticks: int
    plan_changes: int = 0  # behaviour or target lane differs from the previous plan
    speed_changes: int = 0  # target speed moved by 2 m/s or more
    plan_source: str = ""
    # harm the safety layer's braking does (docs/demo.md)
    rear_end_collisions: int = 0  # of `collisions`, a car behind ran into the ego
    min_rear_ttc_s: float = float("inf")  # the car behind the ego in its lane
    phantom_braking_s: float = 0.0  # braking beyond 2 m/s^2 while nothing ahead called for it
    max_transition_step: float = 0.0  # m/s^2 per tick, at or next to a non-NOMINAL state
    time_to_standstill_s: float = float("nan")  # from the first non-NOMINAL tick; NaN: never stood
    drive_offs: int = 0  # moved again after a standstill in a non-NOMINAL state, unreleased


def _row(run: ClosedLoopRun, ood: bool, stats: pb.GetStatsResponse) -> ScenarioRow:
    m = run.metrics
    n = min(len(run.t), len(m.series.ego_speed))  # the speed after each tick's step
    speed, state = m.series.ego_speed[:n], run.safety_state[:n]
    return ScenarioRow(
        scenario=run.scenario,
        ood=ood,
        seed=run.seed,
        collisions=m.collisions,
        off_road=m.off_road,
        min_ttc_s=m.min_ttc_s,
        min_gap_m=m.min_lead_gap_m,
        hard_brakes=m.hard_brakes,
        max_jerk=m.max_abs_jerk,
        gate_vetoes=run.ticks_with(pb.REASON_CODE_OOD_VETO),
        fallback_s=float((run.safety_state == pb.SAFETY_STATE_FALLBACK_ACTIVE).sum()) * 0.005,
        tick_work_p99_us=float(np.nanpercentile(run.tick_work_us, 99)),
        missed_deadlines=stats.missed_deadlines,
        round_trip_p99_us=float(np.percentile(run.round_trip_us, 99)),
        plan_updates=run.plan_updates,
        ticks=len(run.t),
        plan_changes=run.plan_changes,
        speed_changes=run.speed_changes(),
        plan_source="+".join(run.plan_sources),
        rear_end_collisions=m.rear_end_collisions,
        min_rear_ttc_s=m.min_rear_ttc_s,
        phantom_braking_s=m.phantom_braking_s,
        max_transition_step=transition_step(run.applied_accel, run.safety_state),
        time_to_standstill_s=time_to_standstill(run.t[:n], speed, state, 0.005),
        drive_offs=drive_offs(speed, state),
    )


def _table(rows: list[ScenarioRow], model_name: str) -> Table:
    table = Table(title=f"closed loop over gRPC (LOCKSTEP), model {model_name}, held-out seeds")
    cols = [
        "scenario",
        "coll.",
        "rear-end",
        "min TTC s",
        "min rear TTC s",
        "phantom brake s",
        "min gap m",
        "hard brakes",
        "max jerk",
        "vetoes",
        "fallback s",
        "max trans. step",
        "to standstill s",
        "drive-offs",
        "tick work p99 us",
        "rtt p99 us",
        "plan upd.",
        "plan chg.",
        "speed chg.",
        "plan src",
    ]
    for c in cols:
        table.add_column(c, justify="left" if c == "scenario" else "right")
    for r in rows:
        coll = f"[red]{r.collisions}[/]" if r.collisions else "0"
        if r.off_road:
            coll += " [red]off-road[/]"
        table.add_row(
            r.scenario + (" (OOD)" if r.ood else ""),
            coll,
            f"[red]{r.rear_end_collisions}[/]" if r.rear_end_collisions else "0",
            f"{r.min_ttc_s:.1f}",
            f"{r.min_rear_ttc_s:.1f}",
            f"{r.phantom_braking_s:.2f}",
            f"{r.min_gap_m:.1f}",
            str(r.hard_brakes),
            f"{r.max_jerk:.1f}",
            str(r.gate_vetoes),
            f"{r.fallback_s:.2f}",
            f"{r.max_transition_step:.2f}",
            "-" if np.isnan(r.time_to_standstill_s) else f"{r.time_to_standstill_s:.2f}",
            f"[red]{r.drive_offs}[/]" if r.drive_offs else "0",
            f"{r.tick_work_p99_us:.0f}",
            f"{r.round_trip_p99_us:.0f}",
            str(r.plan_updates),
            str(r.plan_changes),
            str(r.speed_changes),
            r.plan_source,
        )
    return table


AUTO = "auto"  # the demo's default plan source, see plan_sources()


def plan_sources(names: Sequence[str], planner: str | None) -> dict[str, str | None]:
    """The server planner that plans each scenario, None where the simulator sends its own plans.

    "auto" (the default): the built-in behaviour planner plans the nominal scenarios, the simulator
    the out-of-distribution ones. Those exist to test the gate and the safe-state machine on broken
    inputs; the planner refuses the worst of them (NaN, km/h read as m/s) and the executor then
    degrades through STALE_PLAN, which made unit_mismatch_kmh spend longer in fallback than with the
    simulator's plans. "none" (or None): the simulator plans everything; a source name: it plans all.
    """
    if planner == AUTO:
        return {name: None if SCENARIOS[name].ood else "behaviour" for name in names}
    source = None if planner in (None, "none") else planner
    return {name: source for name in names}


def _collect_recording(folder: Path, target: Path) -> Path | None:
    """The server's one recording in `folder`, moved to `target` (the recorder names files by the
    time of day; the demo names them by plan source)."""
    files = sorted(folder.glob("*.mcap"))
    if len(files) != 1:
        return None
    files[0].replace(target)
    folder.rmdir()
    return target


@dataclass(frozen=True)
class _Suite:
    """What every server and scenario of one demo run share."""

    model: Path
    out: Path
    gate_args: tuple[str, ...]
    seed: int
    params: dict
    console: Console


def _drive_group(
    suite: _Suite,
    names: Sequence[str],
    source: str | None,
    progress: Progress,
    task: TaskID,
) -> tuple[dict[str, tuple[ScenarioRow, ClosedLoopRun]], pb.ModelInfo]:
    """Drive `names` against one server process whose planner is `source` (None: none)."""
    extra, model, out, console = suite.gate_args, suite.model, suite.out, suite.console
    if source:  # the CLI has no planner flag: a config file carries the section
        config = out / f"server-{source}.toml"
        config.write_text(f'[planner]\nsource = "{source}"\n')
        extra += ("--config", str(config))
    recording = out / "logs" / f".{source or 'simulator'}"
    extra += ("--record-dir", str(recording))
    server = ServerProcess(("--model", str(model), *extra))
    address = server.address
    results: dict[str, tuple[ScenarioRow, ClosedLoopRun]] = {}
    try:
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.ControllerServiceStub(channel)
            info = stub.GetModelInfo(pb.GetModelInfoRequest()).model
            gate_text = f", gates {info.gate_version} ({info.gate_source})" if info.gate_version else ", no OOD gate"
            plans = f"plans from the server's planner ({info.planner})" if info.planner else "plans from the simulator"
            console.print(
                f"[bold]dualloop demo[/]: model {model.name} ({info.model_version}){gate_text}, server "
                f"{address}; {plans} for {', '.join(names)}"
            )
            for name in names:
                progress.update(task, description=name)
                stub.GetStats(pb.GetStatsRequest(reset=True))
                run = drive_over_grpc(address, name, suite.seed, **suite.params)
                results[name] = (_row(run, SCENARIOS[name].ood, stub.GetStats(pb.GetStatsRequest())), run)
                progress.advance(task)
    finally:
        server.stop(timeout_s=10)  # the recorder writes the file's index and footer as the server stops
    if _collect_recording(recording, out / "logs" / f"{source or 'simulator'}.mcap") is None:
        console.print(f"[yellow]no single recording in {recording}[/]")
    return results, info


def run_demo(
    model: Path,
    out_root: Path = Path("runs"),
    scenarios: list[str] | None = None,
    seed: int = HELD_OUT_SEED,
    duration_s: float | None = None,
    console: Console | None = None,
    gates: Sequence[Path] = (),
    planner: str | None = AUTO,
) -> Path:
    """planner: "auto", "none" (None) or a server planner source for every scenario; see plan_sources().
    One server process per plan source: a server's planner plans all of its LOCKSTEP sessions."""
    console = console or Console()
    names = scenarios or list(SCENARIOS)
    out = out_root / datetime.now().strftime("%Y%m%d-%H%M%S")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    suite = _Suite(
        model,
        out,
        tuple(a for g in gates for a in ("--gate", str(g))),
        seed,
        {"duration_s": duration_s} if duration_s else {},
        console,
    )
    sources = plan_sources(names, planner)
    results: dict[str, tuple[ScenarioRow, ClosedLoopRun]] = {}
    with Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task("scenario suite", total=len(names))
        for source in dict.fromkeys(sources.values()):  # in order of first use
            group = [name for name in names if sources[name] == source]
            done, info = _drive_group(suite, group, source, progress, task)
            results.update(done)
    rows = [results[name][0] for name in names]
    runs = [results[name][1] for name in names]
    console.print(_table(rows, model.name))
    plots = [plot_run(run, out) for run in runs]
    lateness_plot = plot_tick_work(runs, out / "tick_work.png")
    (out / "summary.json").write_text(
        json.dumps(
            {
                "model": str(model),
                "model_version": info.model_version,
                "planner": planner or "none",
                "plan_sources": {name: source or "simulator" for name, source in sources.items()},
                "seed": seed,
                "rows": [r.__dict__ for r in rows],
            },
            indent=2,
            default=float,
        )
    )
    report = write_report(out, model, info.model_version, rows, plots, lateness_plot)
    (out / "foxglove-layout.json").write_text(json.dumps(layout([session_id(n, seed) for n in names]), indent=2))
    console.print(
        f"logs, plots and report: {out}/  (open {report}; the recordings logs/*.mcap in Foxglove "
        f"with {out / 'foxglove-layout.json'})"
    )
    return out
