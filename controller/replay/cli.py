"""`dualloop replay` (one log or a fleet) and `dualloop diff`.

The modules a command runs are imported when it runs: a fleet's process pool starts before this
process imports numpy and rich, which it then does while the workers start (their imports took
~0.5 s CPU before the pool could start its own ~0.5 s)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from dualloop.controller.cli_types import positive_int
from dualloop.controller.interrupts import Terminated
from dualloop.controller.logs.outputs import refuse_overwriting_inputs
from dualloop.controller.replay.fleet import (
    FLEET_SCHEMA,
    FleetOptions,
    FleetResult,
    format_fleet,
    log_stem,
    output_paths,
    replay_many,
    workers_warning,
)
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES

if TYPE_CHECKING:
    from dualloop.controller.logs.logfile import LogData
    from dualloop.controller.replay.evaluation import EvaluationReport
    from dualloop.controller.replay.lockstep import Recording

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
        help="replay only this session of each log (repeat for several; default: every session of the log)",
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
    p.add_argument("--no-write", action="store_true", help="do not write the replayed logs (nor their reports)")
    p.add_argument(
        "--foxglove",
        action="store_true",
        help="add the plot topic /dualloop/<session>/plot to each new log, every value by name for "
        "Foxglove (docs/foxglove.md; ~+25%% CPU and +65%% size per log)",
    )
    p.add_argument(
        "--allow-truncated",
        action="store_true",
        help="replay the complete part of each session of a log whose end is missing or broken (a killed recorder's)",
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
    if args.no_gate and args.gate:
        from dualloop.controller.console import print_error

        print_error(f"--no-gate and --gate {' '.join(map(str, args.gate))}: give the gate files or --no-gate, not both")
        return 2
    gates = (
        args.gate
        if args.gate is not None
        else ([g for g in DEFAULT_GATES if g.is_file()] if args.model == BASE_MODEL_PATH else [])
    )
    if args.no_gate:
        gates = []
    elif not gates:  # the shipped gates are fitted to the shipped model only: another runs ungated
        from dualloop.controller.console import print_warning

        print_warning(
            f"{args.model}: replayed with no OOD gate (the shipped gates fit only the shipped model); "
            f"give its own with --gate, or --no-gate to say it is meant"
        )
    if len(args.logs) == 1 and not args.ray and not args.workers:
        return _replay_recording(args, gates)
    if not args.ray and (why := workers_warning(args.workers)) is not None:
        from dualloop.controller.console import print_warning

        print_warning(why)

    out_dir = None if args.no_write else (args.out or Path("runs/replay"))
    # named as replay_many names them (same-named logs in sub-folders; the same log twice refused)
    outputs = [] if out_dir is None else output_paths(args.logs, out_dir)
    _refuse_overwriting_inputs(args, gates, outputs)
    options = FleetOptions(tuple(args.session or ()), True, args.allow_truncated, args.foxglove)
    fleet = FleetResult()
    try:
        replay_many(
            args.logs,
            args.model,
            gates,
            workers=args.workers,
            use_ray=args.ray,
            out_dir=out_dir,
            while_waiting=_import_summary_modules,
            options=options,
            into=fleet,
        )
    except RuntimeError as err:  # Ray missing or no cluster: the message says what to do
        from dualloop.controller.console import print_error

        print_error(err)
        return 2
    except KeyboardInterrupt as stop:  # the pool already stopped; say how far it got, in the one line
        return _fleet_stopped(stop, fleet, len(args.logs), out_dir)
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
    _evaluate([fleet.reports[k] for k in fleet.order if k in fleet.reports], args)
    return 1 if fleet.errors else 0


def _fleet_stopped(stop: KeyboardInterrupt, fleet: FleetResult, logs: int, out_dir: Path | None) -> int:
    """The global handler's line (controller/cli.py) and exit code, with how many logs finished:
    their new logs are complete, the others were not written (no partial file is left)."""
    import signal

    from dualloop.controller.console import print_error

    term = isinstance(stop, Terminated)
    kept = f" (their new logs are in {out_dir})" if out_dir is not None and fleet.finished else ""
    print_error(
        f"dualloop replay: stopped by {'SIGTERM' if term else 'SIGINT (Ctrl-C)'} after {len(fleet.finished)} "
        f"of {logs} logs{kept}; the rest were not replayed"
    )
    return 128 + (signal.SIGTERM if term else signal.SIGINT)


def _refuse_overwriting_inputs(args: argparse.Namespace, gates: list[Path], outputs: list[Path]) -> None:
    """Nothing replay writes (new logs, their reports, --json, --plot, --report) may land on a log,
    model or gate it was given: `replay x.mcap --out x.mcap` replaced the drive with its replay.
    FileExistsError: an OSError, which the command line reports as a user's error (exit 2)."""
    written = [*outputs, *(p for p in (args.json, args.plot, args.report) if p is not None)]
    refuse_overwriting_inputs(written, [*args.logs, args.model, *gates], FileExistsError)


class OutputPathError(OSError):
    """An output path replay cannot write (a folder where a file goes or the reverse, a folder it
    cannot make, two outputs on one file, a plot format matplotlib lacks): an OSError, which the
    command line says in one line (exit 2). Raised before the replay: it was a raw errno line after."""


@dataclass(frozen=True)
class _Output:
    path: Path
    role: str  # what is written there, as the messages name it
    flag: str  # the option that names the path: what to change


def _replay_recording(args: argparse.Namespace, gates: list[Path]) -> int:
    """One log: each of its sessions (or the --session ones), one new log and report per session
    (none with --no-write). Every output path is checked before the model loads."""
    from dualloop.controller.console import print_error
    from dualloop.controller.logs.logfile import check_sessions
    from dualloop.controller.replay.lockstep import read_recording_positions

    source = Path(args.logs[0])
    if source.is_dir():  # the reader said "no such log (nor rotated parts ...)" of a folder
        print_error(f"{source}: a folder, not a log; replay takes .mcap files: pass those in it ({source}/*.mcap)")
        return 2
    if args.plot is not None:
        args.plot = _plot_path(args.plot)
    # --json and --plot before the log is read (a bad one failed after the replay); the new logs'
    # paths once the sessions are known (one session: a file; several: a folder)
    _check_outputs(_evaluation_outputs(args))
    recording, positions = read_recording_positions(source, args.session)
    check_sessions(source, recording.sessions, args.allow_truncated, "replay")
    outs = _session_outputs(args, source, recording.sessions, positions)
    logs = [] if args.no_write else [out for out in outs if out is not None]
    _refuse_overwriting_inputs(args, gates, [p for out in logs for p in (out, out.with_suffix(".json"))])
    several = len(recording.sessions) > 1
    folder = None if args.no_write or not several else (args.out or Path("runs/replay") / log_stem(source))
    if folder is not None:
        _check_folder(folder, f"the {len(recording.sessions)} sessions of {source}")
    written = [
        o
        for out in logs
        for o in (
            _Output(out, "the new log", "--out"),
            _Output(out.with_suffix(".json"), "its report (the new log's path with .json)", "--out"),
        )
    ]
    _check_outputs([*written, *_evaluation_outputs(args)])
    return _replay_sessions(args, gates, source, recording, outs, folder)


def _replay_sessions(
    args: argparse.Namespace,
    gates: list[Path],
    source: Path,
    recording: Recording,
    outs: list[Path | None],
    folder: Path | None,
) -> int:
    from dualloop.controller.console import console, print_error
    from dualloop.controller.replay.lockstep import LoadedModel, ReplayOptions, replay_data
    from dualloop.controller.replay.report import format_report
    from dualloop.executor.sessions import InvalidObservation

    several = len(recording.sessions) > 1
    by_session = several or bool(args.session)  # the sessions of a recording, named apart
    loaded = LoadedModel.load(args.model, gates)
    reports, skipped, failed = [], [], []
    for data, out in zip(recording.sessions, outs):
        if out is None:
            skipped.append(data.name)
            continue
        new_log = None if args.no_write else out
        if new_log is not None:  # made by _check_outputs; again in case it went during the replays before
            new_log.parent.mkdir(parents=True, exist_ok=True)
        try:
            result = replay_data(
                data,
                source,
                args.model,
                gates,
                new_log,
                ReplayOptions(plots=args.foxglove),
                loaded=loaded,
                column_log=recording.column_log,
            )
        except InvalidObservation as err:  # a session the server would have refused: the others still replay
            print_error(f"{source}: session {data.name!r} not replayed: {err}")
            failed.append(data.name)
            continue
        if by_session:  # the report and the evaluation name the session: each was named by the file
            result.report.source = f"{source} session {data.name!r}"
            if "source" in result.report.evaluation:
                result.report.evaluation["source"] = f"{source.name} {data.name}"
        # plain text: it quotes ids from the log (a plan id "[/x]" is no rich markup, and must not fail the print)
        console.print(format_report(result.report), highlight=False, markup=False)
        if new_log is not None:
            report_path = new_log.with_suffix(".json")
            report_path.write_text(json.dumps(result.report.as_dict(), indent=2, default=float))
            console.print(f"session {data.name!r}: new log: {new_log}  report: {report_path}", highlight=False)
        reports.append(result.report.as_dict())
    if several:
        console.print(
            f"replayed {len(reports)} of the {len(recording.sessions)} sessions of {source}"
            + (f" into {folder}" if folder is not None else " (--no-write: no log written)")
            + (f"; no observation to replay: {', '.join(repr(s) for s in skipped)}" if skipped else "")
            + (f"; failed: {', '.join(repr(s) for s in failed)}" if failed else ""),
            highlight=False,
            markup=False,
        )
    _evaluate(reports, args, by_session)
    return 1 if failed else 0


def _session_outputs(
    args: argparse.Namespace, source: Path, sessions: list[LogData], positions: list[int]
) -> list[Path | None]:
    """Each session's new log, known before any is written (None: a session of several opened, then
    cut before its first observation, which is not replayed)."""
    from dualloop.controller.replay.lockstep import session_file_name

    if len(sessions) == 1:
        out = args.out or Path("runs/replay") / f"{log_stem(source)}.replayed.mcap"
        # an existing folder takes the new log, as for a recording of several (it was "[Errno 21]")
        return [out / f"{log_stem(source)}.replayed.mcap" if out.is_dir() else out]
    folder = args.out or Path("runs/replay") / log_stem(source)
    return [
        folder / session_file_name(log_stem(source), index, data.name) if data.observations else None
        for index, data in zip(positions, sessions)
    ]


def _plot_path(plot: Path) -> Path:
    """The file --plot writes, its format checked before the replay (one matplotlib lacks was a
    traceback after it). matplotlib takes the format from the suffix; none: its default (png),
    appended to the name, which was printed without it."""
    if plot.is_dir():  # _check_outputs says so
        return plot
    from dualloop.controller.plotting import pyplot

    pyplot()  # matplotlib now, or the extra to install
    import matplotlib
    from matplotlib.backend_bases import FigureCanvasBase

    suffix = os.path.splitext(plot)[1][1:]  # as savefig reads it
    if not suffix:
        return plot.with_name(plot.name.rstrip(".") + "." + str(matplotlib.rcParams["savefig.format"]))
    formats = FigureCanvasBase.get_supported_filetypes()
    if suffix.lower() not in formats:
        raise OutputPathError(
            f"{plot}: matplotlib cannot write .{suffix} files; give --plot a path ending in one of "
            + ", ".join(f".{f}" for f in sorted(formats))
        )
    return plot


def _evaluation_outputs(args: argparse.Namespace) -> list[_Output]:
    outs = [_Output(args.json, "the evaluation (--json)", "--json")] if args.json else []
    return outs + ([_Output(args.plot, "the plot (--plot)", "--plot")] if args.plot else [])


def _check_folder(folder: Path, what: str) -> None:
    """`folder`, where a recording's sessions go, a folder or a path one can be made at."""
    if folder.exists() and not folder.is_dir():
        raise OutputPathError(
            f"{folder}: a file, not a folder; {what} are replayed into a folder, one log each: give --out "
            "a folder (or --session ID to replay one session into a file)"
        )
    _check_outputs([], [_Output(folder, "the folder of the new logs", "--out")])


def _check_outputs(outputs: list[_Output], folders: Sequence[_Output] = ()) -> None:
    """Each output a file path that can be written and no two the same file (`--out x.json` wrote
    the report over the new log); the folders they go in (and `folders`) made now, so one that cannot
    be is said before the replay, in one line (it was a raw errno line after it)."""
    seen: dict[Path, _Output] = {}
    for out in outputs:
        if out.path.is_dir():
            raise OutputPathError(f"{out.path}: a folder, but {out.role} is a file: give {out.flag} a file path")
        key = out.path.resolve()
        if key in seen:
            raise OutputPathError(
                f"{out.path}: {seen[key].role} and {out.role} would be written to this one file; "
                f"give {out.flag} another path"
            )
        seen[key] = out
    for out, folder in [*((o, o.path.parent) for o in outputs), *((f, f.path) for f in folders)]:
        # the nearest existing folder up the path (Path.parents: nearest first)
        blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            raise OutputPathError(f"{out.path}: {blocker} is a file, not a folder; give {out.flag} a path in a folder")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise OutputPathError(
                f"{out.path}: cannot make the folder {folder} ({err.strerror}); give {out.flag} a path "
                "in a folder you can write"
            ) from None
        if not os.access(folder, os.W_OK) or (out.path.is_file() and not os.access(out.path, os.W_OK)):
            raise OutputPathError(f"{out.path}: not writable; give {out.flag} a path you can write")


def _evaluate(reports: list[dict], args: argparse.Namespace, by_session: bool = False) -> None:
    """The evaluation table of the replayed logs (in the order given); --json and --plot. by_session:
    the rows are sessions of one recording, named "rec.mcap car-1" (each was "rec")."""
    from dualloop.controller.console import console
    from dualloop.controller.replay.evaluation import format_evaluation, from_replay_reports, plot_evaluation

    evaluation, skipped = from_replay_reports(reports)
    for source, why in skipped.items():
        console.print(f"[yellow]not evaluated:[/] {source}: {why}", highlight=False)
    if not evaluation.logs:
        return
    shown = _named_by_label(evaluation) if by_session else evaluation
    console.print(format_evaluation(shown), highlight=False, markup=False)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(evaluation.as_dict(), indent=2, allow_nan=False))
        console.print(f"evaluation: {args.json}")
    if args.plot:
        console.print(f"plot: {plot_evaluation(shown, args.plot)}")


def _named_by_label(evaluation: EvaluationReport) -> EvaluationReport:
    """A copy for the table and the plot, which name a row by its source's stem (a log's file name
    without .mcap): "rec.mcap car-1"'s stem is "rec", every session's. A suffix makes the whole label
    the stem ('/' cannot be in a stem)."""
    from dualloop.controller.replay.evaluation import EvaluationReport

    return EvaluationReport([replace(e, source=e.source.replace("/", "_") + ".session") for e in evaluation.logs])


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
