"""`dualloop qualify CANDIDATE.onnx [--baseline CURRENT.onnx] --logs ...`: the CI gate for a model change.

Exit 0: every criterion met; 1: the candidate is worse than the baseline beyond a tolerance (the
failed criteria are listed); 2: bad input (a file or a setting, named), or inputs that left every
criterion without anything to compare (NOT JUDGED, saying why)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dualloop.controller.cli_types import positive_int, positive_number
from dualloop.controller.console import console, print_error, print_warning
from dualloop.controller.qualify.criteria import load_criteria
from dualloop.controller.qualify.report import prepare_out_dir, summary_lines, write_report
from dualloop.controller.qualify.run import DEFAULT_STRESS_SEEDS, QualifyInputs, qualify
from dualloop.controller.replay.fleet import workers_warning
from dualloop.controller.training.recorded import log_paths
from dualloop.models import BASE_MODEL_PATH
from dualloop.sim.scenarios import OOD_SCENARIOS


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "qualify",
        help="one verdict for a model change: replay, stress set, shadow evidence (and INT8); exit 1 when worse",
    )
    p.add_argument("candidate", type=Path, help="the candidate model (.onnx)")
    p.add_argument(
        "--baseline", type=Path, default=BASE_MODEL_PATH, help="the current model (default: the shipped one)"
    )
    p.add_argument(
        "--logs",
        type=Path,
        nargs="+",
        default=[],
        metavar="DIR_OR_FILE",
        help="held-out recorded drives with the human's actions (files or folders), e.g. runs/real/heldout",
    )
    p.add_argument("--gate", type=Path, action="append", help="the candidate's gate files (default: beside it)")
    p.add_argument("--baseline-gate", type=Path, action="append", help="the baseline's gate files (default: beside it)")
    p.add_argument("--shadow", type=Path, nargs="+", default=[], metavar="LOG", help="recorded shadow sessions (MCAP)")
    p.add_argument("--int8", type=Path, help="the candidate's INT8 variant: per-class recall check")
    p.add_argument("--criteria", type=Path, metavar="FILE.toml", help="tolerances (docs/operations.md#qualify-a-model)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="one tolerance, over the file's, e.g. --set replay.agreement_drop=0.02 (none: off)",
    )
    p.add_argument(
        "--stress-seeds", type=int, default=DEFAULT_STRESS_SEEDS, help="episodes per stress scenario (0: no stress set)"
    )
    p.add_argument(
        "--stress-scenario",
        action="append",
        choices=OOD_SCENARIOS,
        help="OOD scenarios of the stress set (repeat; default: all)",
    )
    p.add_argument("--stress-duration", type=positive_number, metavar="S", help="shorter episodes (s), for a quick run")
    p.add_argument("--workers", type=positive_int, help="replay processes (default: the cores)")
    p.add_argument(
        "--transfer",
        type=Path,
        metavar="TRANSFER.json",
        help="the candidate recipe's leave-one-dataset-out report (`dualloop eval-logs --leave-one-out`): "
        "the report's headline, judged against the targets of a site never seen",
    )
    p.add_argument("--out", type=Path, default=Path("runs/qualify"), help="folder for qualify.html and qualify.json")
    p.set_defaults(fn=_qualify)


def _qualify(args: argparse.Namespace) -> int:
    if args.stress_seeds < 0:
        print_error(f"--stress-seeds {args.stress_seeds}: give 0 (no stress set) or more")
        return 2
    if args.stress_duration is not None and args.stress_duration <= 0:
        print_error(f"--stress-duration {args.stress_duration}: give a positive number of seconds")
        return 2
    # first: a folder that cannot take the report is said before the work, and an earlier run's
    # report is gone before this run can fail
    prepare_out_dir(args.out)
    inputs = QualifyInputs(
        candidate=args.candidate,
        logs=log_paths(args.logs),
        baseline=args.baseline,
        candidate_gates=args.gate,
        baseline_gates=args.baseline_gate,
        shadow=args.shadow,
        int8=args.int8,
        criteria=load_criteria(args.criteria, args.set),
        stress_seeds=args.stress_seeds,
        stress_scenarios=args.stress_scenario,
        stress_duration_s=args.stress_duration,
        workers=args.workers,
        transfer=args.transfer,
    )
    if (why := workers_warning(args.workers)) is not None:
        print_warning(why)
    console.print(
        f"qualifying {args.candidate} against {args.baseline} on {len(inputs.logs)} logs ...", highlight=False
    )
    result = qualify(inputs, lambda text: console.print(f"  {text} ...", highlight=False, markup=False))
    html_path, json_path = write_report(result, args.out)
    for line in summary_lines(result):
        console.print(line, highlight=False, markup=False)
    console.print(f"report: {html_path}  json: {json_path}", highlight=False)
    # nothing judged is no evidence either way: not a pass, and not "worse" (1) either
    return {"pass": 0, "fail": 1}.get(result.verdict, 2)
