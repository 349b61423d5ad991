"""`dualloop gate fit` and `dualloop gate eval`."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from dualloop.controller.cli_types import positive_int, whole_number
from dualloop.controller.console import console, print_error
from dualloop.controller.contract.gate_files import load_gate_for_model
from dualloop.controller.gates import fault_injection
from dualloop.controller.gates.evaluation import evaluate, present_mask
from dualloop.controller.gates.fitting import GateFitConfig, fit_gate_for_model
from dualloop.controller.gates.real_faults import evaluate_real, jsonable, print_real
from dualloop.controller.gates.real_logs import RealDataError, load_real_dir
from dualloop.controller.replay.lockstep import LoadedModel
from dualloop.controller.training.cli import out_dir_problem, out_file_problem
from dualloop.controller.training.recorded import recorded_drives_problem
from dualloop.executor.gating import GATE_SOURCES
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES
from dualloop.ood.calibrate import check_alpha
from dualloop.sim.schema import FEATURE_NAMES, PLAN_NAMES

# The rarest --alpha the fit can calibrate: a conformal quantile at alpha needs 1/alpha - 1 held-out rows
# (ood.calibrate_threshold), and the raw-input source's calibration driving gives about 160 000 (the
# decision vector's about 745 000). Below it the fit ran its minutes, then the calibration raised.
MIN_ALPHA = 1e-5


def alpha_problem(alpha: float) -> str | None:
    """What is wrong with --alpha (None: nothing): outside (0, 1), or rarer than the held-out driving
    can state (MIN_ALPHA)."""
    try:
        check_alpha(alpha, "--alpha")
    except ValueError as err:
        return str(err)
    if alpha < MIN_ALPHA:
        return (
            f"--alpha {alpha:g}: rarer than the fit's held-out driving can calibrate (about 160 000 rows state "
            f"quantiles down to {MIN_ALPHA:g}); give --alpha {MIN_ALPHA:g} or more"
        )
    return None


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    g.add_argument(
        "--alpha", type=float, default=1e-3, help=f"per-tick false-veto rate to calibrate at ({MIN_ALPHA:g} to 1)"
    )
    g.add_argument(
        "--out",
        type=Path,
        help="default: beside the model, named after it (<stem>.gate.npz for the decision vector, "
        "<stem>.inputs.gate.npz for the input features); the shipped model's: models/base.gate.npz and "
        "models/base.inputs.gate.npz",
    )
    g.add_argument(
        "--no-actuation",
        action="store_true",
        help="input_features: fit no actuation check (measured "
        "acceleration short of the command the vehicle was executing)",
    )
    g.add_argument(
        "--real-logs",
        type=Path,
        nargs="+",
        metavar="DIR_OR_FILE",
        default=(),
        help="recorded ordinary drives (training drives only, e.g. runs/real/train), each dataset a site: the "
        "threshold covers every site's own quantile, so that driving at a site the gate never saw is not OOD "
        "(docs/transfer.md)",
    )
    g.set_defaults(fn=_gate_fit)
    g = gate_sub.add_parser("eval", help="AUROC, detection delay, false vetoes, closed loop with/without, plots")
    g.add_argument("--model", type=Path, default=BASE_MODEL_PATH)
    g.add_argument("--gate", type=Path, action="append", help="repeat for several (default: the base model's two)")
    g.add_argument("--out", type=Path, default=Path("runs/gate-eval"))
    g.add_argument(
        "--present",
        help="comma-separated features the sensors measure (the others arrive as NaN); open loop only",
    )
    g.add_argument(
        "--check",
        action="store_true",
        help="exit 1 when a target is not met (AUROC >= 0.99 where each fault is observable, nominal false "
        "vetoes <= 0.1%% per tick)",
    )
    g.add_argument(
        "--real",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="instead of the simulator: inject one-signal sensor faults into the real drives of each folder "
        "(dualloop logs, or a shared data set such as ../shared/data/comma2k19-example1) and replay them "
        "(docs/real-faults.md); --check then judges the real-fault targets",
    )
    g.add_argument(
        "--episodes", type=positive_int, default=40, help="--real: episodes per fault and signal per data set"
    )
    g.add_argument(
        "--seed", type=whole_number(0), default=0, help="--real: the seed of every fault's times and magnitudes"
    )
    g.add_argument(
        "--max-logs", type=positive_int, help="--real: at most this many logs per data set (chosen by the seed)"
    )
    g.add_argument(
        "--faults", help=f"--real: comma-separated faults (default: all of {', '.join(fault_injection.FAULTS)})"
    )
    g.set_defaults(fn=_gate_eval)


def default_gate_path(model: Path, source: str) -> Path:
    """Where `gate fit` writes without --out: the shipped model's gates to the shipped paths; any other
    model's beside it, named after it (as gates_beside finds them and the refit suggestion names them),
    never over the shipped gate, which serves the shipped model."""
    if Path(model).resolve() == BASE_MODEL_PATH.resolve():
        return DEFAULT_GATES[GATE_SOURCES.index(source)]
    return Path(model).with_suffix(".inputs.gate.npz" if source == "input_features" else ".gate.npz")


def _fit_problem(args: argparse.Namespace, model: DecisionModel) -> str | None:
    """What is wrong with `gate fit`'s arguments, before minutes of driving and fitting (None: nothing)."""
    problem = alpha_problem(args.alpha)
    if problem is not None:
        return problem
    card = model.card
    if tuple(card.feature_names) != FEATURE_NAMES or tuple(p.name for p in card.plan) != PLAN_NAMES:
        n, sim = len(card.feature_names), len(FEATURE_NAMES)
        differs = f"takes {n} features, the simulator sends {sim}" if n != sim else "names other features or plan"
        return (
            f"--model {args.model}: gates fit only models on the simulator schema (the fit drives the simulator; "
            f"this model {differs}); serve it without gates (docs/operations.md)"
        )
    problem = out_file_problem(args.out)
    if problem is not None:
        return problem
    return recorded_drives_problem(args.real_logs, "--real-logs") if args.real_logs else None


def _gate_fit(args: argparse.Namespace) -> int:
    model = DecisionModel(args.model)
    if args.out is None:  # said first, so that a refusal below already names it
        args.out = default_gate_path(args.model, args.source)
        console.print(f"no --out: the gate goes to {args.out}", highlight=False)
    problem = _fit_problem(args, model)
    if problem is not None:
        print_error(problem)
        return 2
    real = tuple(str(p) for p in args.real_logs)
    console.print(
        f"fitting a {args.variant} gate on {args.source} of {args.model} from simulated nominal driving"
        + (f", calibrated on the sites of {len(real)} real log paths" if real else "")
        + " ..."
    )
    config = GateFitConfig(
        source=args.source, variant=args.variant, alpha=args.alpha, actuation=not args.no_actuation, real_logs=real
    )
    gate = fit_gate_for_model(model, config)
    out = args.out
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
    if gate.site_rows is not None:
        console.print(f"site rows kept for each sensor profile's threshold: {gate.site_rows.describe()}")
    return 0


def _gate_eval(args: argparse.Namespace) -> int:
    if args.real:
        return _gate_eval_real(args)
    model = DecisionModel(args.model)
    present = None if not args.present else [n.strip() for n in args.present.split(",") if n.strip()]
    present_mask(model, present)  # a name the model lacks: refused before the gates load and scoring starts
    problem = out_dir_problem(args.out)  # made before minutes of scoring and closed loop: it was made after
    if problem is not None:
        print_error(problem)
        return 2
    gates = [load_gate_for_model(g, model) for g in (args.gate or DEFAULT_GATES)]
    result = evaluate(model, gates, out_dir=args.out, console=console, present=present)
    (args.out / "gate_eval.json").write_text(json.dumps(result, indent=2, default=float))
    console.print(f"results and plots: {args.out}/")
    return 1 if args.check and result["targets"]["failed"] else 0


def _gate_eval_real(args: argparse.Namespace) -> int:
    faults = fault_injection.FAULTS if not args.faults else [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = sorted(set(faults) - set(fault_injection.FAULTS))
    if unknown:
        print_error(ValueError(f"--faults: unknown {unknown}; known: {', '.join(fault_injection.FAULTS)}"))
        return 2
    problem = out_dir_problem(args.out)
    if problem is not None:
        print_error(problem)
        return 2
    loaded = LoadedModel.load(args.model, args.gate or DEFAULT_GATES)
    with tempfile.TemporaryDirectory(prefix="dualloop-real-faults-") as scratch:
        try:
            datasets = [load_real_dir(d, Path(scratch)) for d in args.real]
        except (RealDataError, ValueError, OSError) as err:
            print_error(err)
            return 2
        console.print(f"importing done: {', '.join(f'{d.name} ({len(d.logs)} logs)' for d in datasets)}")
        result = evaluate_real(loaded, datasets, args.episodes, args.seed, faults, console, args.max_logs)
    print_real(result, console)
    path = args.out / "real_faults.json"
    path.write_text(json.dumps(jsonable(result), indent=1, allow_nan=False))
    console.print(f"results: {path}")
    return 1 if args.check and result["targets"]["failed"] else 0
