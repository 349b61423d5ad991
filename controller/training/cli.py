"""`dualloop train`, `dualloop quantize` and `dualloop make-test-model`."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from dualloop.controller.cli_types import whole_number
from dualloop.controller.console import console, print_error
from dualloop.controller.training.calibration_guard import CalibrationGuard, CalibrationRefused
from dualloop.controller.training.driving_card import build_test_model
from dualloop.controller.training.recorded import recorded_drives_problem
from dualloop.controller.training.report import print_summary, progress_hooks
from dualloop.controller.training.trainer import (
    DEFAULT_SEED,
    FULL_DATA,
    LOG_SHARE,
    QUICK_DATA,
    TrainOptions,
    TrainResult,
    compare_models,
    mlp_config,
    model_path,
    train,
)
from dualloop.executor.history import DEFAULT_HISTORY
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, TEST_MODEL_PATH


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("train", help="train a decision model from expert demonstrations and export it")
    p.add_argument("--size", choices=["small", "base", "large"], default="base")
    p.add_argument("--seed", type=whole_number(0), default=7)
    p.add_argument("--out", type=Path, default=Path("models"), help="folder for <size>.onnx")
    p.add_argument("--quick", action="store_true", help="little data, few epochs (writes <size>.quick.onnx)")
    p.add_argument("--check", type=Path, help="then compare with this model file (exit 1 if it differs)")
    p.add_argument(
        "--logs",
        type=Path,
        nargs="+",
        default=[],
        metavar="DIR_OR_FILE",
        help="recorded drives to train on beside the simulated ones (training drives only, e.g. runs/real/train)",
    )
    p.add_argument(
        "--log-share", type=float, default=LOG_SHARE, help="the recorded drives' share of the training weight"
    )
    p.add_argument(
        "--history",
        action="store_true",
        help="also feed the model the history features the executor derives from a session's observations "
        "(executor.history; ModelInfo.history_features)",
    )
    p.add_argument(
        "--dagger",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="rounds of driving the nominal scenarios with the model, labelling the states it reached with "
        "the simulated expert's action and training again on all of them (DAgger; each round about the "
        "time of the first training)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="write the model even when its calibrated test ECE or NLL is worse than its uncalibrated one "
        "or than the default model's on the same split (beyond the tolerances); it warns instead",
    )
    p.add_argument(
        "--calibration-reference",
        type=Path,
        default=BASE_MODEL_PATH,
        metavar="MODEL.onnx",
        help="the current default model the calibration is compared with (default: the shipped one)",
    )
    p.add_argument("--ece-tolerance", type=float, default=0.01, help="allowed rise of the test ECE")
    p.add_argument("--nll-tolerance", type=float, default=0.02, help="allowed rise of the test NLL")
    p.set_defaults(fn=_train)

    p = sub.add_parser("quantize", help="INT8 variant with a per-class confusion report against FP32")
    p.add_argument("model", type=Path)
    p.add_argument("--out", type=Path, help="default: <model>.int8.onnx")
    p.set_defaults(fn=_quantize)

    p = sub.add_parser("make-test-model", help="build the untrained test model from its fixed seed")
    p.add_argument("--out", type=Path, default=TEST_MODEL_PATH)
    p.set_defaults(fn=_make_test_model)


def _argument_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with the arguments, found before minutes of building data: a bad number, a log
    or model file that is missing or is not one (None: nothing)."""
    if not (args.ece_tolerance >= 0 and args.nll_tolerance >= 0):  # NaN fails too
        return "--ece-tolerance and --nll-tolerance must be >= 0"
    if not 0.0 <= args.log_share < 1.0:
        return f"--log-share must be in [0, 1) (the recorded drives' share of the weight); got {args.log_share}"
    if args.dagger < 0:
        return f"--dagger must be 0 or more rounds; got {args.dagger}"
    # a file where the folder goes failed with [Errno 17] after the whole run (made once all is checked)
    problem = out_dir_problem(args.out, make=False)
    if problem is not None:
        return f"{problem} (--out is the folder for <size>.onnx)"
    if args.logs:
        problem = recorded_drives_problem(args.logs, "--logs")
        if problem is not None:
            return problem
    for flag, model in (("--check", args.check), ("--calibration-reference", args.calibration_reference)):
        if model is not None:
            if not model.is_file():
                return f"{flag}: {model}: no such model file"
            DecisionModel(model, warmup_batches=())  # ModelFileError names the file and what is wrong
    return None


def _train(args: argparse.Namespace) -> int:
    problem = _argument_problem(args) or out_dir_problem(args.out)  # the second makes the folder
    if problem is not None:
        print_error(problem)
        return 2
    guard = CalibrationGuard(args.calibration_reference, args.ece_tolerance, args.nll_tolerance, args.force)
    try:
        result = train_main(
            args.size,
            args.seed,
            args.out,
            quick=args.quick,
            logs=args.logs,
            log_share=args.log_share,
            history=args.history,
            dagger=args.dagger,
            guard=guard,
        )
    except CalibrationRefused as err:
        print_error(err)
        return 1
    for warning in result.calibration_warnings:
        console.print(f"[yellow]warning (written with --force):[/] {warning}", highlight=False)
    if isinstance(result.reference_calibration, str):
        console.print(
            f"calibration not compared with {guard.reference}: {result.reference_calibration}", highlight=False
        )
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

    # needs the onnx package (the [dev] extra): imported when the command runs, so every other
    # command works without it
    from dualloop.controller.training.quantize import quantize_main

    out = args.out or args.model.with_suffix(".int8.onnx")
    quantize_main(args.model, out)
    return 0


def _make_test_model(args: argparse.Namespace) -> int:
    problem = out_file_problem(args.out)  # a file where its folder goes: not a bare [Errno 17]
    if problem is not None:
        print_error(problem)
        return 2
    card = build_test_model(args.out)
    console.print(f"wrote {args.out} (version {card.version}, schema {card.schema_hash()})")
    return 0


# Output paths checked before the work that fills them: `train`, `make-test-model`, `gate fit` and `gate
# eval` each ran minutes (or failed with a bare [Errno 17]) before finding a file where their folder
# should be. A missing folder is made, as every command that writes one does.


def _file_in_the_way(path: Path) -> Path | None:
    """The first of `path` and the folders above it that exists and is not a folder (None: none)."""
    for above in (path, *path.parents):
        if above.exists() and not above.is_dir():
            return above
    return None


def out_file_problem(out: Path, flag: str = "--out") -> str | None:
    """What stops writing the file `out` (None: nothing): a folder in its place, a file in place of a
    folder above it, a folder that cannot be written; a missing folder is made."""
    if out.is_dir():
        return f"{flag} {out}: is a folder; give a file name in it"
    return _folder_problem(out.parent, f"{flag} {out}", "give a path in a folder")


def out_dir_problem(out: Path, flag: str = "--out", make: bool = True) -> str | None:
    """The same for an output folder: refused when a file is in its place; made when missing (make:
    False, for a caller that checks more before it writes anything)."""
    return _folder_problem(out, f"{flag} {out}", "give a folder (it is made when missing)", make)


def _folder_problem(folder: Path, what: str, advice: str, make: bool = True) -> str | None:
    blocker = _file_in_the_way(folder)
    if blocker is not None:
        return f"{what}: {blocker} is a file, not a folder; {advice}"
    if not make:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"{what}: cannot write in {folder} (permissions); choose a folder you can write in"
    return None


def train_main(
    size: str,
    seed: int = DEFAULT_SEED,
    out_dir: Path = Path("models"),
    quick: bool = False,
    measure_latency_in_card: bool = True,
    logs: Sequence[Path] = (),
    log_share: float = LOG_SHARE,
    history: bool = False,
    dagger: int = 0,
    guard: CalibrationGuard | None = None,
) -> TrainResult:
    """CLI entry: trains with rich progress bars, prints the summary tables, returns the result."""
    data_config = QUICK_DATA if quick else FULL_DATA
    if history:
        data_config = replace(data_config, history=DEFAULT_HISTORY)
    config = mlp_config(size, quick)
    scenarios = len(data_config.scenarios) * (1 + dagger)  # each DAgger round drives each again
    with progress_hooks(scenarios, config.max_epochs) as hooks:
        result = train(
            size,
            seed,
            model_path(size, out_dir, quick),
            quick=quick,
            data_config=data_config,
            config=config,
            hooks=hooks,
            options=TrainOptions(
                logs=logs,
                log_share=log_share,
                dagger=dagger,
                guard=guard,
                measure_latency_in_card=measure_latency_in_card,
            ),
        )
    print_summary(result)
    return result
