"""Console output of `dualloop train`: progress bars while it runs, summary tables at the end."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dualloop.controller.training.log_eval import BASELINES, DatasetReport, ratio_text
from dualloop.controller.training.trainer import Hooks, TrainResult
from dualloop.sim import schema


@contextmanager
def progress_hooks(n_scenarios: int, max_epochs: int, console: Console | None = None) -> Iterator[Hooks]:
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
        console=console or Console(),
    ) as bar:
        data = bar.add_task("expert data", total=n_scenarios, note="")
        epochs = bar.add_task("training", total=max_epochs, note="")

        def on_scenario(name: str) -> None:
            bar.update(data, advance=1, note=name)

        def on_epoch(epoch: int, train_loss: float, val_loss: float) -> None:
            bar.update(epochs, completed=epoch + 1, note=f"loss {train_loss:.4f} val {val_loss:.4f}")

        def on_stage(text: str) -> None:
            bar.update(epochs, completed=max_epochs, note=text)  # early stopping ends the bar short

        yield Hooks(on_scenario, on_epoch, on_stage)
        bar.update(epochs, completed=max_epochs)


def _fmt(v: float | str, pct: bool = False) -> str:
    if isinstance(v, str):
        return v
    return f"{100 * v:.1f} %" if pct else f"{v:.4g}"


def summary_tables(result: TrainResult) -> list[Table]:
    m, card = result.metrics, result.card
    head = Table(title=f"{card.name} ({card.size_class}) -> {result.path}", show_header=False)
    rows = [
        ("version", card.version),
        ("hidden / decision vector", f"{m['hidden']} / {card.decision_vector_size}"),
        ("samples train / val / test", f"{int(m['n_train'])} / {int(m['n_val'])} / {int(m['n_test'])}"),
        ("epochs (best)", f"{int(m['epochs_run'])} ({int(m['best_epoch'])})"),
        (
            "test accuracy (majority baseline)",
            f"{_fmt(m['test_accuracy'], True)} ({_fmt(m['test_majority_baseline'], True)})",
        ),
        ("test balanced accuracy", _fmt(m["test_balanced_accuracy"], True)),
        ("controls RMSE accel / steer", f"{_fmt(m['test_rmse_accel'])} m/s^2 / {_fmt(m['test_rmse_steer'])} rad"),
        ("temperature", _fmt(m["temperature"])),
        ("test NLL before / after", f"{_fmt(m['test_nll_before'])} / {_fmt(m['test_nll_after'])}"),
        ("test ECE (15 bins) before / after", f"{_fmt(m['test_ece_before'])} / {_fmt(m['test_ece_after'])}"),
        ("seed", str(int(m["seed"]))),
        (
            "time data / train / total",
            " / ".join(f"{result.timings_s.get(k, 0.0):.1f} s" for k in ("data", "train", "total")),
        ),
    ]
    for kind, what in (("sim", "with a plan, simulator sensors"), ("realistic", "realistic sensing and drivers")):
        if f"test_accuracy_{kind}" in m:
            rows.append((f"test accuracy, {kind}/ drives ({what})", _fmt(m[f"test_accuracy_{kind}"], True)))
    for key in sorted(k for k in m if k.startswith("val_logs_") and k.endswith("_disagreement_ratio")):
        name = key.removeprefix("val_logs_").removesuffix("_disagreement_ratio")
        pre = f"val_logs_{name}"
        rows.append(
            (
                f"recorded validation {name}: agree / bal (best baseline)",
                f"{_fmt(m[pre + '_agreement'], True)} / {_fmt(m[pre + '_balanced_accuracy'], True)} "
                f"({m[pre + '_best_baseline']} {_fmt(m[pre + '_best_baseline_agreement'], True)} / "
                f"{_fmt(m[pre + '_best_baseline_balanced_accuracy'], True)}; disagreement x{_fmt(m[key])})",
            )
        )
    if "forward_b1_p50_us" in m:
        rows.append(("forward batch 1 p50 / p99", f"{m['forward_b1_p50_us']} / {m['forward_b1_p99_us']} us"))
    for k, v in rows:
        head.add_row(k, v)
    recall = Table(title="test recall per action")
    for name in schema.ACTIONS:
        recall.add_column(name, justify="right")
    recall.add_row(*(_fmt(m[f"test_recall_{a}"], True) for a in schema.ACTIONS))
    return [head, recall]


def log_report_table(reports: list[DatasetReport], title: str) -> Table:
    """Per dataset: the model's agreement and balanced accuracy beside each baseline's (each on its
    own rows; the model on the best baseline's rows for the ratio, with its 95% interval), and whether
    the evaluation's targets are met (disagreement <= 0.75x the best baseline's, balanced accuracy above
    every baseline's)."""
    t = Table(title=title)
    for col in ("dataset", "sessions", "rows", "model agree / bal", *BASELINES, "disagree ratio", "targets"):
        t.add_column(col, justify="right")
    pct = lambda v: "n/a" if not np.isfinite(v) else f"{100 * v:.1f}"  # noqa: E731
    for r in reports:
        cells = [f"{pct(s.agreement)} / {pct(s.balanced_accuracy)}" if s.rows else "n/a" for s in r.baselines.values()]
        t.add_row(
            r.dataset,
            str(r.sessions),
            str(r.model.rows),
            f"{pct(r.model.agreement)} / {pct(r.model.balanced_accuracy)}",
            *cells,
            f"{ratio_text(r.disagreement_ratio, r.disagreement_interval)} ({r.best_baseline})",
            "[green]met[/]" if r.meets_targets else "[red]not met[/]",
        )
    return t


def print_log_reports(reports: list[DatasetReport], title: str, console: Console | None = None) -> None:
    (console or Console(width=160)).print(log_report_table(reports, title))


def print_summary(result: TrainResult, console: Console | None = None) -> None:
    console = console or Console()
    for t in summary_tables(result):
        console.print(t)
