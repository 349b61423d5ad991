"""`dualloop replay` (one log or a fleet) and `dualloop diff`.

The modules a command runs are imported when it runs: a fleet's process pool starts before this
process imports numpy and rich, which it then does while the workers start (their imports took
~0.5 s CPU before the pool could start its own ~0.5 s)."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from dualloop.controller.cli_types import positive_int
from dualloop.controller.logs.outputs import refuse_overwriting_inputs
from dualloop.controller.replay.fleet import FLEET_SCHEMA, format_fleet, replay_many
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES

if TYPE_CHECKING:
    from dualloop.controller.logs.logfile import LogData

# what the fleet's summary needs in this process, imported while the pool's workers start
_SUMMARY_MODULES = ("dualloop.controller.console", "dualloop.controller.replay.evaluation")


def _import_summary_modules() -> None:
    for module in _SUMMARY_MODULES:
        importlib.import_module(module)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("replay", help="run recorded logs through a model in LOCKSTEP; one log or many")
    p.add_argument("logs", nargs="+", type=Path)
    p.add_argument("--model", type=Path, default=BASE_MODEL_PATH)
    p.add_argument("--gate", type=Path, action="append", help="gate files (default: the base model's two)")
    p.add_argument("--no-gate", action="store_true")
    p.add_argument(
        "--out",
        type=Path,
        help="one log of one session: the new log's path; a log of several sessions, or many logs: a folder",
    )
    p.add_argument(
        "--session",
        action="append",
        metavar="ID",
        help="one log: replay only this session (repeat for several; default: every session of the log)",
    )
    p.add_argument("--workers", type=positive_int, help="process pool size for many logs (default: the cores)")
    p.add_argument(
        "--ray",
        action="store_true",
        help="distribute over an existing Ray cluster (RAY_ADDRESS or `ray start --head`; pip install 'dualloop[ray]')",
    )
    p.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="write the evaluation against the labels and the baselines (per log, pooled, macro) as JSON",
    )
    p.add_argument(
        "--plot", type=Path, metavar="PATH.png", help="plot the pooled confusion matrices and agreement per log"
    )
    p.add_argument(
        "--report",
        type=Path,
        metavar="PATH",
        help=f"many logs: write the per-log and pooled replay report as JSON (schema {FLEET_SCHEMA})",
    )
    p.add_argument("--no-write", action="store_true", help="many logs: do not write the replayed logs")
    p.add_argument(
        "--foxglove",
        action="store_true",
        help="one log: add the plot topic /dualloop/<session>/plot to the new log, every value by name for "
        "Foxglove (docs/foxglove.md; ~+25%% CPU and +65%% size per log)",
    )
    p.add_argument(
        "--allow-truncated",
        action="store_true",
        help="one log: replay the complete part of each session of a log whose end is missing or broken "
        "(a killed recorder's)",
    )
    p.set_defaults(fn=_replay)

    p = sub.add_parser("diff", help="compare two logs of the same input; non-zero exit beyond tolerance")
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--tolerance", type=float, default=0.0, help="allowed fraction of changed ticks per field")
    p.add_argument("--field", action="append", help="fields that gate the exit code (default: missing, applied_index)")
    p.add_argument("--controls-tol", type=float, default=1e-4, help="absolute tolerance on controls")
    p.add_argument(
        "--session",
        metavar="ID",
        help="compare this session of a log that holds several (a server's recording) with the other log's "
        "(a log of one session, its replay say, is taken as it is)",
    )
    p.set_defaults(fn=_diff)


def _replay(args: argparse.Namespace) -> int:
    gates = (
        args.gate
        if args.gate is not None
        else ([g for g in DEFAULT_GATES if g.is_file()] if args.model == BASE_MODEL_PATH else [])
    )
    if args.no_gate:
        gates = []
    if len(args.logs) == 1 and not args.ray and not args.workers:
        return _replay_recording(args, gates)

    out_dir = None if args.no_write else (args.out or Path("runs/replay"))
    # named as fleet._replay_one names them: a log there named so would be replaced by another's replay
    outputs = [] if out_dir is None else [out_dir / f"{Path(p).stem}.replayed.mcap" for p in args.logs]
    _refuse_overwriting_inputs(args, gates, outputs)
    try:
        fleet = replay_many(
            args.logs,
            args.model,
            gates,
            workers=args.workers,
            use_ray=args.ray,
            out_dir=out_dir,
            while_waiting=_import_summary_modules,
        )
    except RuntimeError as err:  # Ray missing or no cluster: the message says what to do
        from dualloop.controller.console import print_error

        print_error(err)
        return 2
    from dualloop.controller.console import console

    console.print(format_fleet(fleet), highlight=False, markup=False)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(fleet.as_dict(), indent=2, allow_nan=False))
        console.print(f"report: {args.report}")
    console.print(
        f"replayed {len(fleet.reports)} logs ({fleet.ticks} ticks), {len(fleet.errors)} failed; top-1 "
        f"agreement with the actual actions {fleet.agreement_top1:.3f}; gate vetoed "
        f"{fleet.gate_veto_fraction * 100:.1f}% of ticks",
        highlight=False,
    )
    for path, why in fleet.errors.items():
        console.print(f"[red]failed:[/] {why if why.startswith(path) else f'{path}: {why}'}", highlight=False)
    _evaluate([fleet.reports[str(p)] for p in args.logs if str(p) in fleet.reports], args)
    return 1 if fleet.errors else 0


def _refuse_overwriting_inputs(args: argparse.Namespace, gates: list[Path], outputs: list[Path]) -> None:
    """Nothing replay writes (new logs, their reports, --json, --plot, --report) may land on a log,
    model or gate it was given: `replay x.mcap --out x.mcap` replaced the drive with its replay.
    FileExistsError: an OSError, which the command line reports as a user's error (exit 2)."""
    written = [*outputs, *(p for p in (args.json, args.plot, args.report) if p is not None)]
    refuse_overwriting_inputs(written, [*args.logs, args.model, *gates], FileExistsError)


def _replay_recording(args: argparse.Namespace, gates: list[Path]) -> int:
    """One log: each of its sessions (or the --session ones), one new log and report per session."""
    from dualloop.controller.console import console, print_error
    from dualloop.controller.logs.logfile import check_sessions
    from dualloop.controller.replay.lockstep import LoadedModel, ReplayOptions, read_recording, replay_data
    from dualloop.controller.replay.report import format_report
    from dualloop.executor.sessions import InvalidObservation

    source = Path(args.logs[0])
    recording = read_recording(source, args.session)
    check_sessions(source, recording.sessions, args.allow_truncated, "replay")
    several = len(recording.sessions) > 1
    folder = args.out or Path("runs/replay") / source.stem
    outs = _session_outputs(args, source, recording.sessions)
    _refuse_overwriting_inputs(
        args, gates, [p for out in outs if out is not None for p in (out, out.with_suffix(".json"))]
    )
    loaded = LoadedModel.load(args.model, gates)
    reports, skipped, failed = [], [], []
    for data, out in zip(recording.sessions, outs):
        if out is None:
            skipped.append(data.name)
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            result = replay_data(
                data,
                source,
                args.model,
                gates,
                out,
                ReplayOptions(plots=args.foxglove),
                loaded=loaded,
                column_log=recording.column_log,
            )
        except InvalidObservation as err:  # a session the server would have refused: the others still replay
            print_error(f"{source}: session {data.name!r} not replayed: {err}")
            failed.append(data.name)
            continue
        if several:  # the report and the evaluation name the session
            result.report.source = f"{source} session {data.name!r}"
        console.print(format_report(result.report), highlight=False)
        report_path = out.with_suffix(".json")
        report_path.write_text(json.dumps(result.report.as_dict(), indent=2, default=float))
        console.print(f"session {data.name!r}: new log: {out}  report: {report_path}", highlight=False)
        reports.append(result.report.as_dict())
    if several:
        console.print(
            f"replayed {len(reports)} of the {len(recording.sessions)} sessions of {source} into {folder}"
            + (f"; no observation to replay: {', '.join(repr(s) for s in skipped)}" if skipped else "")
            + (f"; failed: {', '.join(repr(s) for s in failed)}" if failed else ""),
            highlight=False,
            markup=False,
        )
    _evaluate(reports, args)
    return 1 if failed else 0


def _session_outputs(args: argparse.Namespace, source: Path, sessions: list[LogData]) -> list[Path | None]:
    """Each session's new log, known before any is written (None: a session of several opened, then
    cut before its first observation, which is not replayed)."""
    from dualloop.controller.replay.lockstep import session_file_name

    if len(sessions) == 1:
        return [args.out or Path("runs/replay") / f"{source.stem}.replayed.mcap"]
    folder = args.out or Path("runs/replay") / source.stem
    return [
        folder / session_file_name(source.stem, index, data.name) if data.observations else None
        for index, data in enumerate(sessions)
    ]


def _evaluate(reports: list[dict], args: argparse.Namespace) -> None:
    """The evaluation table of the replayed logs (in the order given); --json and --plot."""
    from dualloop.controller.console import console
    from dualloop.controller.replay.evaluation import format_evaluation, from_replay_reports, plot_evaluation

    evaluation, skipped = from_replay_reports(reports)
    for source, why in skipped.items():
        console.print(f"[yellow]not evaluated:[/] {source}: {why}", highlight=False)
    if not evaluation.logs:
        return
    console.print(format_evaluation(evaluation), highlight=False, markup=False)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(evaluation.as_dict(), indent=2, allow_nan=False))
        console.print(f"evaluation: {args.json}")
    if args.plot:
        console.print(f"plot: {plot_evaluation(evaluation, args.plot)}")


def _diff(args: argparse.Namespace) -> int:
    from dualloop.controller.console import console, print_error
    from dualloop.controller.replay.diff import (
        DEFAULT_FIELDS,
        NotSameInput,
        Tolerances,
        check_diff_options,
        diff_exit_code,
        diff_logs,
        format_diff,
    )

    fields = tuple(args.field or DEFAULT_FIELDS)
    check_diff_options(args.tolerance, args.controls_tol, fields)  # before the logs: a typo is not a difference
    try:
        report = diff_logs(args.a, args.b, tolerances=Tolerances(controls_abs=args.controls_tol), session=args.session)
    except NotSameInput as err:
        print_error(err)
        return 2
    console.print(format_diff(report), highlight=False)
    code = diff_exit_code(report, tolerance=args.tolerance, fields=fields)
    if code:
        console.print(f"[red]changed beyond tolerance {args.tolerance}[/]")
    return code
