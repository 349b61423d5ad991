"""`dualloop gate fit` and `dualloop gate eval`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dualloop.controller.console import console
from dualloop.controller.gates.evaluation import evaluate
from dualloop.controller.gates.fitting import fit_gate_for_model
from dualloop.controller.serve.gate_files import load_gate_for_model
from dualloop.executor.gating import GATE_SOURCES
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES


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
    g.set_defaults(fn=_gate_eval)


def _gate_fit(args: argparse.Namespace) -> int:
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
    model = DecisionModel(args.model)
    gates = [load_gate_for_model(g, model) for g in (args.gate or DEFAULT_GATES)]
    present = None if not args.present else [n.strip() for n in args.present.split(",") if n.strip()]
    result = evaluate(model, gates, out_dir=args.out, console=console, present=present)
    (args.out / "gate_eval.json").write_text(json.dumps(result, indent=2, default=float))
    console.print(f"results and plots: {args.out}/")
    return 1 if args.check and result["targets"]["failed"] else 0
