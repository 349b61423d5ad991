"""`dualloop eval-logs`: a model's proposals on recorded drives against the human and the trivial
baselines, per dataset; with `--leave-one-out`, the training recipe held out one dataset at a time."""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.table import Table

from dualloop.controller.cli_types import positive_int, whole_number
from dualloop.controller.console import console, print_error
from dualloop.controller.logs.logfile import check_log_file
from dualloop.controller.training.log_eval import evaluate as evaluate_logs
from dualloop.controller.training.recorded import EGO_ACCEL_SUPPLIES, log_paths, read_log_rows
from dualloop.controller.training.report import print_log_reports
from dualloop.controller.transfer.leave_out import (
    NOMINAL_TARGET,
    RATIO_TARGET,
    VETO_TARGET,
    Column,
    TransferConfig,
    TransferReport,
    leave_one_dataset_out,
)
from dualloop.models import BASE_MODEL_PATH, gates_beside


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("eval-logs", help="a model's proposals on recorded drives vs the human and the baselines")
    p.add_argument(
        "logs",
        type=Path,
        nargs="+",
        metavar="DIR_OR_FILE",
        help="drives, e.g. runs/real/heldout; with --leave-one-out every drive (runs/real/train runs/real/heldout)",
    )
    p.add_argument(
        "--model",
        type=Path,
        default=BASE_MODEL_PATH,
        help="the model; with --leave-one-out, the within column's (its gates beside it, as qualify finds them)",
    )
    p.add_argument(
        "--leave-one-out",
        action="store_true",
        help="hold out each dataset in turn: train a model and its gate without it, score and replay it "
        "(minutes per dataset; docs/transfer.md)",
    )
    p.add_argument("--quick", action="store_true", help="--leave-one-out: little simulated data, few epochs")
    p.add_argument(
        "--dagger", type=whole_number(0), default=0, metavar="ROUNDS", help="--leave-one-out: DAgger rounds per model"
    )
    p.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="DATASET",
        help="--leave-one-out: hold out only this dataset (repeatable; the names eval-logs prints, e.g. "
        "openacc-vicolungo); the others still train its model",
    )
    p.add_argument("--seed", type=whole_number(0), default=TransferConfig.seed)
    p.add_argument(
        "--max-replay-files",
        type=positive_int,
        metavar="N",
        help="--leave-one-out: replay at most N drives per dataset",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("runs/transfer"),
        help="--leave-one-out: folder for transfer.json and the left-out models and gates",
    )
    p.add_argument("--check", action="store_true", help="--leave-one-out: exit 1 when a target is not met")
    p.add_argument(
        "--ego-accel",
        choices=EGO_ACCEL_SUPPLIES,
        default="logged",
        help="score the drives as a stack supplying ego_accel this way: as logged, derived from the speed "
        "(the slope over the previous 0.5 s, as a stack without an accelerometer gives it) or absent "
        "(the baselines see the same)",
    )
    p.add_argument(
        "--allow-truncated",
        action="store_true",
        help="score the complete part of each session of a log whose end is missing or broken (a killed recorder's)",
    )
    p.set_defaults(fn=_eval_logs)


def _eval_logs(args: argparse.Namespace) -> int:
    if args.only and not args.leave_one_out:
        print_error("--only: only with --leave-one-out (it names the datasets to hold out)")
        return 2
    try:
        paths = log_paths(args.logs)
    except FileNotFoundError as err:
        print_error(err)
        return 2
    if not paths:
        print_error(f"no .mcap drives in {', '.join(map(str, args.logs))}")
        return 2
    # as replay: a cut or damaged drive is never scored as if whole, an empty file never passes as
    # no drive (LogFileError: the command line says it in one line, exit 2). A second read of each
    # file (~10% of reading its rows): read_log_rows keeps no truncation to check afterwards.
    for path in paths:
        check_log_file(path, args.allow_truncated, "score")
    if not args.leave_one_out:
        rows = read_log_rows(paths).with_ego_accel(args.ego_accel)
        supply = "" if args.ego_accel == "logged" else f", ego_accel {args.ego_accel}"
        print_log_reports(evaluate_logs(args.model, rows), f"{args.model} on {len(rows.sessions)} sessions{supply}")
        return 0
    if args.ego_accel != "logged":
        print_error("--ego-accel: only without --leave-one-out (the left-out models train on the drives as logged)")
        return 2
    config = TransferConfig(
        seed=args.seed,
        quick=args.quick,
        dagger=args.dagger,
        max_replay_files=args.max_replay_files,
        only=tuple(args.only),
    )
    gates = gates_beside(args.model)
    if len(gates) != 2:
        print_error(
            f"{args.model}: the within column needs its two gates beside it (<stem>.gate.npz, <stem>.inputs.gate.npz)"
        )
        return 2
    try:
        report = leave_one_dataset_out(
            paths, args.model, gates, config, work_dir=args.out, progress=lambda line: console.print(line)
        )
    except ValueError as err:
        print_error(err)
        return 2
    (args.out / "transfer.json").write_text(report.to_json())
    console.print(transfer_table(report))
    console.print(f"results and left-out models: {args.out}/")
    for miss in report.failed:
        console.print(f"[red]target not met:[/] {miss}", highlight=False)
    return 1 if args.check and report.failed else 0


def _vetoed_by(c: Column) -> str:
    """The checks that vetoed, most first: "input_density 0.61%, ..." ("-" without a replay or a veto)."""
    if c.driving is None or not c.driving.vetoed_by:
        return "-"
    return ", ".join(f"{name} {100 * share:.2f}%" for name, share in c.driving.vetoed_by.items())


def _cells(c: Column | None) -> tuple[str, str, str]:
    if c is None:
        return ("-", "-", "-")
    ratio = f"{c.ratio_text()} ({c.best_baseline} {100 * c.best_baseline_agreement:.1f}%)"
    if c.driving is None:
        return (ratio, "-", "-")
    return (ratio, f"{100 * c.driving.nominal:.2f}%", f"{100 * c.driving.vetoed:.2f}%")


def transfer_table(report: TransferReport) -> Table:
    """One row per dataset: left out (the headline) beside within."""
    table = Table(
        title=f"leave one dataset out (targets: <= {RATIO_TARGET:.2f}x, >= {100 * NOMINAL_TARGET:.0f}% NOMINAL, "
        f"<= {100 * VETO_TARGET:.1f}% vetoed; [95% interval, 10 s blocks of each drive resampled])"
    )
    for name in (
        "dataset",
        "left out: disagreement",
        "NOMINAL",
        "vetoed",
        "vetoed by",
        "within: disagreement",
        "NOMINAL",
        "vetoed",
        "targets",
    ):
        table.add_column(name, justify="right")
    for d in report.datasets:
        table.add_row(
            d.dataset,
            *_cells(d.left_out),
            _vetoed_by(d.left_out),
            *_cells(d.within),
            "[green]met[/]" if not d.misses else "[red]not met[/]",
        )
    return table
