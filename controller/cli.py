"""The `dualloop` command line."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from rich.console import Console

from dualloop.controller.serve.config import ConfigError, load_server_config
from dualloop.executor.model_card import ModelFileError
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES, TEST_MODEL_PATH

# Wide enough for the scenario table when the output is a log file rather than a terminal.
console = Console(width=None if sys.stdout.isatty() else 200)


def _serve(args: argparse.Namespace) -> int:
    from dualloop.controller.serve.server import ControllerServer, new_event_loop

    config = load_server_config(
        args.config,
        model=args.model,
        gates=args.gate,
        host=args.host,
        port=args.port,
        allow_non_loopback=True if args.allow_non_loopback else None,
        realtime_priority=args.realtime_priority,
        record_dir=args.record_dir,
    )
    server = ControllerServer(config)

    async def run() -> None:
        port = await server.start()
        card = server.executor.card
        console.print(
            f"dualloop serving model {card.name} {card.version} (schema {card.schema_hash()}) on "
            f"{config.host}:{port}, tick {config.executor.tick_period_ms} ms, {server.scheduling}. "
            f"Ctrl-C stops."
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        await server.stop()
        s = server.runtime.stats
        console.print(
            f"stopped after {s.ticks} ticks, {server.runtime.ticker.missed} missed deadlines, "
            f"{s.snapshots_sent} snapshots sent"
        )

    loop = new_event_loop()
    loop.run_until_complete(run())
    return 0


def _info(args: argparse.Namespace) -> int:
    from dualloop.executor.model_runner import DecisionModel

    card = DecisionModel(args.model, warmup_batches=()).card
    console.print_json(card.to_json())
    console.print(f"schema hash: {card.schema_hash()}")
    return 0


def _make_test_model(args: argparse.Namespace) -> int:
    from dualloop.controller.training.driving_card import build_test_model

    card = build_test_model(args.out)
    console.print(f"wrote {args.out} (version {card.version}, schema {card.schema_hash()})")
    return 0


_BENCH_DURATION_S = {"tick": 60.0, "planner": 600.0, "sim": 3.0, "replay": 60.0, "gate": 0.0}
_BENCH_SESSIONS = {"planner": 32}


def _bench(args: argparse.Namespace) -> int:
    from dualloop.controller.bench.tick import bench_tick

    # what each bench runs unless told: the planner's busy/idle p99 ratio needs many turns of each
    # (60 s runs gave 0.5x to 1.6x on this VM, a 600 s run 1.02x with a 95% interval of 0.85-1.22x)
    duration = args.duration if args.duration is not None else _BENCH_DURATION_S[args.what]
    sessions = args.sessions if args.sessions is not None else _BENCH_SESSIONS.get(args.what, 8)
    if args.what == "sim":
        from dualloop.controller.bench.sim import bench_sim

        result = bench_sim(seconds=duration)
        console.print(result)
        return 0
    if args.what == "planner":
        from dualloop.controller.bench.planner import PHASE_S, bench_planner

        if duration < 4 * PHASE_S:
            console.print(
                f"[red]error:[/] bench planner --duration {duration:g}: too short, the planner is "
                f"idle and busy in turns of {PHASE_S:g} s and each needs two turns (at least "
                f"{4 * PHASE_S:g} s)",
                highlight=False,
            )
            return 2
        if args.compare_pure:
            from dualloop.controller.bench.plan_cost import bench_plan_cost

            bench_plan_cost(args.out, console)
        bench_planner(
            args.model,
            sessions,
            duration,
            args.out,
            args.guard_ms,
            args.realtime_priority or None,
            planner="behaviour",
            console=console,
        )
        return 0
    if args.what == "replay":
        from dualloop.controller.bench.replay import bench_replay
        from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES

        model = BASE_MODEL_PATH if args.model == TEST_MODEL_PATH else args.model
        bench_replay(
            model,
            tuple(args.gate) if args.gate else DEFAULT_GATES,
            out_dir=args.out,
            seconds=min(duration, 60.0),
            console=console,
        )
        return 0
    if args.what == "gate":
        from dualloop.controller.bench.gate import SESSION_COUNTS, bench_gate_table
        from dualloop.controller.gates.fitting import load_gate_for_model
        from dualloop.executor.model_runner import DecisionModel
        from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES

        model_path, gate_paths = args.model, args.gate
        if not gate_paths:  # the shipped model with its two gates, as `serve` runs them by default
            if args.model != TEST_MODEL_PATH:
                raise ConfigError("bench gate needs --gate FILE for a model other than models/base.onnx")
            model_path, gate_paths = BASE_MODEL_PATH, list(DEFAULT_GATES)
        model = DecisionModel(model_path)
        gates = [load_gate_for_model(g, model) for g in gate_paths]
        counts = sorted(set(SESSION_COUNTS) | ({args.sessions} if args.sessions else set()))  # plus --sessions
        bench_gate_table(
            model,
            gates,
            counts,
            out_dir=args.out,
            console=console,
            model_path=str(model_path),
            gate_paths=[str(g) for g in gate_paths],
            compare_pure=args.compare_pure,
        )
        return 0
    if args.what == "tick":
        result = bench_tick(args.model, sessions, duration, args.out, args.guard_ms, args.realtime_priority or None)
        ok = (
            result["executor"]["missed_deadlines"] == 0
            and result["p99_ratio_executor_over_bare"] <= 1.5
            and result["executor"]["lateness_us"]["p99"] < 500
        )
        console.print(
            "targets (0 missed, p99 <= 1.5x bare and < 500 us): "
            + ("[green]met[/]" if ok else "[yellow]not met in this run[/]")
        )
    return 0


def _train(args: argparse.Namespace) -> int:
    from dualloop.controller.training.trainer import compare_models, train_main

    result = train_main(args.size, args.seed, args.out, quick=args.quick)
    if args.check is not None:
        diffs = compare_models(args.check, result.path)
        console.print(
            f"[green]{result.path} reproduces {args.check} exactly (weights, card, version)[/]"
            if not diffs
            else f"[red]{result.path} differs from {args.check}:[/] " + "; ".join(diffs)
        )
        return 1 if diffs else 0
    return 0


def _quantize(args: argparse.Namespace) -> int:
    from dualloop.controller.training.quantize import quantize_main

    out = args.out or args.model.with_suffix(".int8.onnx")
    quantize_main(str(args.model), str(out))
    return 0


def _import(args: argparse.Namespace) -> int:
    if args.kind == "comma2k19":
        from dualloop.controller.logs.import_comma2k19 import Comma2k19Error
        from dualloop.controller.logs.import_comma2k19 import import_comma2k19 as run

        errors: tuple[type[Exception], ...] = (Comma2k19Error,)
    else:
        from dualloop.controller.logs.import_csv import CsvImportError
        from dualloop.controller.logs.import_csv import import_csv as run

        errors = (CsvImportError,)
    out = (
        args.out or Path(args.source).with_suffix(".mcap")
        if args.kind == "csv"
        else args.out or Path(f"{Path(args.source).name}.mcap")
    )
    try:
        report = run(args.source, out)
    except errors as err:
        console.print(f"[red]error:[/] {err}", highlight=False)
        return 2
    console.print(report.summary(), highlight=False)
    return 0


def _replay(args: argparse.Namespace) -> int:
    gates = (
        args.gate
        if args.gate is not None
        else ([g for g in DEFAULT_GATES if g.is_file()] if args.model == BASE_MODEL_PATH else [])
    )
    if args.no_gate:
        gates = []
    if len(args.logs) == 1 and not args.ray and not args.workers:
        import json

        from dualloop.controller.replay.lockstep import replay_log
        from dualloop.controller.replay.report import format_report

        out = args.out or Path("runs/replay") / f"{Path(args.logs[0]).stem}.replayed.mcap"
        out.parent.mkdir(parents=True, exist_ok=True)
        result = replay_log(args.logs[0], args.model, gates, out_path=out)
        console.print(format_report(result.report), highlight=False)
        report_path = out.with_suffix(".json")
        report_path.write_text(json.dumps(result.report.as_dict(), indent=2, default=float))
        console.print(f"new log: {out}  report: {report_path}")
        return 0
    from dualloop.controller.replay.fleet import replay_many

    try:
        fleet = replay_many(
            args.logs,
            args.model,
            gates,
            workers=args.workers,
            use_ray=args.ray,
            out_dir=args.out or Path("runs/replay"),
        )
    except RuntimeError as err:  # Ray missing or no cluster: the message says what to do
        console.print(f"[red]error:[/] {err}", highlight=False)
        return 2
    console.print(
        f"replayed {len(fleet.reports)} logs ({fleet.ticks} ticks), {len(fleet.errors)} failed; top-1 "
        f"agreement with the actual actions {fleet.agreement_top1:.3f}; gate vetoed "
        f"{fleet.gate_veto_fraction * 100:.1f}% of ticks",
        highlight=False,
    )
    for path, err in fleet.errors.items() if isinstance(fleet.errors, dict) else fleet.errors:
        console.print(f"[red]failed:[/] {path}: {err}", highlight=False)
    return 1 if fleet.errors else 0


def _diff(args: argparse.Namespace) -> int:
    from dualloop.controller.replay.diff import NotSameInput, Tolerances, diff_exit_code, diff_logs, format_diff

    try:
        report = diff_logs(args.a, args.b, tolerances=Tolerances(controls_abs=args.controls_tol))
    except NotSameInput as err:
        console.print(f"[red]error:[/] {err}", highlight=False)
        return 2
    console.print(format_diff(report), highlight=False)
    code = diff_exit_code(report, tolerance=args.tolerance, fields=tuple(args.field or ("missing", "applied_index")))
    if code:
        console.print(f"[red]changed beyond tolerance {args.tolerance}[/]")
    return code


def _gate_fit(args: argparse.Namespace) -> int:
    from dualloop.controller.gates.fitting import fit_gate_for_model
    from dualloop.executor.gating import GATE_SOURCES
    from dualloop.executor.model_runner import DecisionModel

    model = DecisionModel(args.model)
    console.print(f"fitting a {args.variant} gate on {args.source} of {args.model} from simulated nominal driving ...")
    gate = fit_gate_for_model(model, args.source, args.variant, alpha=args.alpha, actuation=not args.no_actuation)
    out = args.out or DEFAULT_GATES[GATE_SOURCES.index(args.source)]
    digest = gate.save(str(out))
    cal = gate.calibration
    console.print(
        f"wrote {out} (version {digest[:16]}): threshold {gate.threshold:.2f} at a per-tick false-veto "
        f"rate of {cal.alpha} (measured {cal.empirical_rate:.5f} on {cal.n} held-out ticks); norm band "
        f"[{gate.norm_band.low:.2f}, {gate.norm_band.high:.2f}]; filter {gate.filter}"
    )
    if gate.feature_range is not None:
        rng = gate.feature_range
        console.print(
            f"range guard: training range {'and change ' if rng.change_low else ''}+-{rng.margin:.0%} of "
            f"its span per feature; {rng.calibration_rate:.5f} of held-out ticks outside it"
        )
    if gate.actuation is not None:
        act = gate.actuation
        m, c = act.model, act.calibration
        console.print(
            f"actuation check: {act.settings.command_control} -> {act.settings.accel_feature} fitted as lag "
            f"{m.tau_s * 1000:.1f} ms, gain {m.gain:.3f}, offset {m.offset:+.3f} m/s^2 (rmse {m.rmse:.3f} on "
            f"{m.n} observations); shortfall threshold {c.threshold:.4f} m/s^2 at {c.alpha} per observation "
            f"(measured {c.empirical_rate:.6f} on {c.n} held-out observations)"
        )
    return 0


def _gate_eval(args: argparse.Namespace) -> int:
    import json

    from dualloop.controller.gates.evaluation import evaluate
    from dualloop.controller.gates.fitting import load_gate_for_model
    from dualloop.executor.model_runner import DecisionModel

    model = DecisionModel(args.model)
    gates = [load_gate_for_model(g, model) for g in (args.gate or DEFAULT_GATES)]
    result = evaluate(model, gates, out_dir=args.out, console=console)
    (args.out / "gate_eval.json").write_text(json.dumps(result, indent=2, default=float))
    console.print(f"results and plots: {args.out}/")
    return 0


def _demo(args: argparse.Namespace) -> int:
    from dualloop.controller.demo.suite import run_demo

    model = args.model or (BASE_MODEL_PATH if BASE_MODEL_PATH.is_file() else TEST_MODEL_PATH)
    if model == TEST_MODEL_PATH:
        console.print("[yellow]no trained model found (models/base.onnx): driving with the untrained test model[/]")
    scenarios = args.scenarios.split(",") if args.scenarios else None
    gates = (
        args.gate
        if args.gate
        else ([g for g in DEFAULT_GATES if g.is_file()] if model == BASE_MODEL_PATH and not args.no_gate else [])
    )
    seed = {} if args.seed is None else {"seed": args.seed}
    run_demo(
        model, args.out, scenarios, **seed, duration_s=args.duration, console=console, gates=gates, planner=args.planner
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dualloop", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="serve a model over gRPC (loopback by default)")
    p.add_argument("--model", type=Path, help="ONNX decision model with a dualloop model card")
    p.add_argument(
        "--gate",
        type=Path,
        action="append",
        help="OOD gate file fitted for this model (dualloop gate fit); repeat for several",
    )
    p.add_argument("--config", type=Path, help="server configuration (.toml or .yaml)")
    p.add_argument("--host", help="bind address (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (default 50151; 0 picks a free one)")
    p.add_argument("--allow-non-loopback", action="store_true", help="permit binding beyond loopback")
    p.add_argument("--realtime-priority", type=int, help="SCHED_FIFO priority (1-99) for the tick loop")
    p.add_argument("--record-dir", type=Path, help="record every session to MCAP in this folder")
    p.set_defaults(fn=_serve)

    p = sub.add_parser("info", help="print a model's card (schema, actions, version)")
    p.add_argument("model", type=Path)
    p.set_defaults(fn=_info)

    p = sub.add_parser("make-test-model", help="build the untrained test model from its fixed seed")
    p.add_argument("--out", type=Path, default=TEST_MODEL_PATH)
    p.set_defaults(fn=_make_test_model)

    p = sub.add_parser("bench", help="benchmarks that print numbers")
    p.add_argument(
        "what",
        choices=["tick", "sim", "gate", "planner", "replay"],
        help="tick: executor timing under gRPC load; sim: simulator steps per second next to highway-env; "
        "gate: gate cost next to the forward pass; planner: tick lateness with the behaviour planner busy "
        "on 32 sessions vs idle; replay: 60 s logs replayed, x real time on one core vs the per-tick path",
    )
    p.add_argument(
        "--gate",
        type=Path,
        action="append",
        help="gate file (bench gate; default: models/base.onnx with its two gates); repeat for several",
    )
    p.add_argument("--model", type=Path, default=TEST_MODEL_PATH)
    p.add_argument(
        "--compare-pure",
        action="store_true",
        help="bench gate: also run the gates' pure-Python path, interleaved tick by tick, and print the "
        "ratio; bench planner: first the planner's CPU per batch on its compiled and numpy paths, interleaved",
    )
    p.add_argument(
        "--sessions", type=int, help="REALTIME sessions (tick: 8, planner: 32); gate: a count added to its table"
    )
    p.add_argument("--duration", type=float, help="seconds (tick: 60, planner: 600, sim: 3, replay: 60 at most)")
    p.add_argument("--out", type=Path, default=Path("runs/bench"))
    p.add_argument(
        "--guard-ms",
        type=float,
        default=2.0,
        help="how long before each deadline the loop timer hands over to the busy wait",
    )
    p.add_argument(
        "--realtime-priority",
        type=int,
        default=50,
        help="SCHED_FIFO priority for the executor process and, for fairness, the bare ticker "
        "(0: normal scheduling; refused without CAP_SYS_NICE, which the report shows)",
    )
    p.set_defaults(fn=_bench)

    p = sub.add_parser("train", help="train a decision model from expert demonstrations and export it")
    p.add_argument("--size", choices=["small", "base", "large"], default="base")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--out", type=Path, default=Path("models"), help="folder for <size>.onnx")
    p.add_argument("--quick", action="store_true", help="little data, few epochs (writes <size>.quick.onnx)")
    p.add_argument("--check", type=Path, help="then compare with this model file (exit 1 if it differs)")
    p.set_defaults(fn=_train)

    p = sub.add_parser("quantize", help="INT8 variant with a per-class confusion report against FP32")
    p.add_argument("model", type=Path)
    p.add_argument("--out", type=Path, help="default: <model>.int8.onnx")
    p.set_defaults(fn=_quantize)

    p = sub.add_parser("import", help="turn a recorded drive into a dualloop log (MCAP)")
    p.add_argument("kind", choices=["comma2k19", "csv"])
    p.add_argument("source", type=Path, help="comma2k19 segment folder, or a CSV file")
    p.add_argument("--out", type=Path, help="output .mcap (default: next to the source name)")
    p.set_defaults(fn=_import)

    p = sub.add_parser("replay", help="run recorded logs through a model in LOCKSTEP; one log or many")
    p.add_argument("logs", nargs="+", type=Path)
    p.add_argument("--model", type=Path, default=BASE_MODEL_PATH)
    p.add_argument("--gate", type=Path, action="append", help="gate files (default: the base model's two)")
    p.add_argument("--no-gate", action="store_true")
    p.add_argument("--out", type=Path, help="one log: the new log's path; many: a folder")
    p.add_argument("--workers", type=int, help="process pool size for many logs (default: the cores)")
    p.add_argument(
        "--ray",
        action="store_true",
        help="distribute over an existing Ray cluster (RAY_ADDRESS or `ray start --head`; pip install 'dualloop[ray]')",
    )
    p.set_defaults(fn=_replay)

    p = sub.add_parser("diff", help="compare two logs of the same input; non-zero exit beyond tolerance")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--tolerance", type=float, default=0.0, help="allowed fraction of changed ticks per field")
    p.add_argument("--field", action="append", help="fields that gate the exit code (default: missing, applied_index)")
    p.add_argument("--controls-tol", type=float, default=1e-4, help="absolute tolerance on controls")
    p.set_defaults(fn=_diff)

    p = sub.add_parser("gate", help="fit and evaluate the OOD gate")
    gate_sub = p.add_subparsers(dest="gate_command", required=True)
    g = gate_sub.add_parser("fit", help="fit a gate for a model from simulated nominal driving")
    g.add_argument("--model", type=Path, default=BASE_MODEL_PATH)
    g.add_argument(
        "--source",
        choices=["decision_vector", "input_features"],
        default="decision_vector",
        help="what the gate scores: the model's decision vector, or the raw inputs (with limits on "
        "their values and on their change between observations)",
    )
    g.add_argument("--variant", choices=["single", "tied", "relative"], default="single")
    g.add_argument("--alpha", type=float, default=1e-3, help="per-tick false-veto rate to calibrate at")
    g.add_argument(
        "--out",
        type=Path,
        help="default: models/base.gate.npz (decision vector) or models/base.inputs.gate.npz (input features)",
    )
    g.add_argument(
        "--no-actuation",
        action="store_true",
        help="input_features: fit no actuation check (measured "
        "acceleration short of the command the vehicle was executing)",
    )
    g.set_defaults(fn=_gate_fit)
    g = gate_sub.add_parser("eval", help="AUROC, detection delay, false vetoes, closed loop with/without, plots")
    g.add_argument("--model", type=Path, default=BASE_MODEL_PATH)
    g.add_argument("--gate", type=Path, action="append", help="repeat for several (default: the base model's two)")
    g.add_argument("--out", type=Path, default=Path("runs/gate-eval"))
    g.set_defaults(fn=_gate_eval)

    p = sub.add_parser("demo", help="the main job: the scenario suite in closed loop over gRPC, with a report")
    p.add_argument("--model", type=Path, help="default: models/base.onnx")
    p.add_argument("--scenarios", help="comma-separated subset (default: all)")
    p.add_argument("--gate", type=Path, action="append", help="gate files (default: the base model's two)")
    p.add_argument("--no-gate", action="store_true", help="drive without the OOD gate")
    p.add_argument(
        "--planner",
        choices=["auto", "none", "behaviour"],
        default="auto",
        help="auto: the server's built-in planner plans the nominal scenarios, the simulator the "
        "out-of-distribution ones; none: the simulator plans all; behaviour: the built-in planner "
        "plans all",
    )
    p.add_argument("--duration", type=float, help="seconds of sim time per scenario (default: the scenario's own)")
    p.add_argument(
        "--seed", type=int, help="the episode seed of every scenario (default: 900001, held out from training)"
    )
    p.add_argument("--out", type=Path, default=Path("runs"))
    p.set_defaults(fn=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (ConfigError, ModelFileError, OSError) as err:
        console.print(f"[red]error:[/] {err}", highlight=False)
        return 2


if __name__ == "__main__":
    sys.exit(main())
