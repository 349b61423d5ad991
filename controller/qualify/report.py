"""The qualification's report: one self-contained HTML page (plots embedded as PNG) and its JSON,
and the lines the terminal prints."""

from __future__ import annotations

import base64
import html
import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.gates.plots import plot_histograms, plot_scores_over_time
from dualloop.controller.qualify.plots import (
    plot_gate_detection,
    plot_migration,
    plot_per_log,
    plot_reliability,
    plot_stress_confidence,
)
from dualloop.controller.qualify.run import Qualification
from dualloop.controller.replay.evaluation import format_evaluation, plot_evaluation
from dualloop.controller.transfer.leave_out import Column
from dualloop.sim.scenarios import NOMINAL_SCENARIOS, OOD_SCENARIOS

_CSS = """
body{font-family:system-ui,sans-serif;max-width:1200px;margin:1em auto;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}.pass{color:#2a7d2a}.fail{color:#c0392b;font-weight:bold}
.banner{padding:.6em 1em;font-size:1.3em;border-radius:4px}.banner.pass{background:#e6f4e6}
.banner.fail{background:#fbe9e7}.banner.notjudged{background:#fff4d6}.na{color:#888}
img{max-width:100%;border:1px solid #eee}pre{background:#f6f6f6;
padding:.5em;overflow-x:auto;font-size:12px}
"""


def _f(x: Any, pct: bool = False) -> str:
    if x is None or (isinstance(x, float) and not np.isfinite(x)):
        return "n/a"
    return f"{100 * x:.1f}%" if pct else (f"{x:.4g}" if isinstance(x, float) else str(x))


def _img(path: Path, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<p><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></p>'


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _plots(q: Qualification, tmp: Path) -> dict[str, list[str]]:
    """section -> <img> elements."""
    out: dict[str, list[str]] = {"replay": [], "stress": []}
    if q.replay is not None:
        if q.replay.candidate.logs:
            ev = q.replay.candidate
            out["replay"].append(_img(plot_evaluation(ev, tmp / "replay.png"), "the candidate's replay evaluation"))
            out["replay"].append(_img(plot_per_log(ev, q.replay.baseline, tmp / "per_log.png"), "agreement per log"))
        if q.replay.actions:
            out["replay"].append(
                _img(plot_migration(q.replay.actions, q.replay.migration, tmp / "migration.png"), "migration matrix")
            )
    if q.stress is not None:
        cand, base = q.stress
        out["stress"] += [
            _img(plot_reliability(cand, base, tmp / "reliability.png"), "reliability diagrams"),
            _img(plot_stress_confidence(cand, base, tmp / "confidence.png"), "confidence under stress"),
            _img(plot_gate_detection(cand, base, tmp / "gate_auroc.png"), "gate detection"),
        ]
        # the gate evaluation's own plots need every scenario of the set
        if all(n in cand.scores for n in (*NOMINAL_SCENARIOS, *OOD_SCENARIOS)) and cand.gates:
            t = cand.threshold
            out["stress"].append(_img(plot_scores_over_time(cand.scores, t, tmp / "gate_scores.png"), "gate scores"))
            out["stress"].append(_img(plot_histograms(cand.scores, t, tmp / "gate_hist.png"), "score histograms"))
    return out


def _checks_html(q: Qualification) -> str:
    rows = [
        [
            html.escape(c.step),
            html.escape(c.name),
            _f(c.candidate),
            _f(c.baseline),
            html.escape(c.note) + ("" if c.limit is None else _f(c.limit)),
            f'<span class="{"na" if not c.judged else "pass" if c.passed else "fail"}">{c.status}</span>',
        ]
        for c in q.checks
    ]
    return _table(["step", "criterion", "candidate", "baseline", "limit", ""], rows)


def _stress_html(q: Qualification) -> str:
    assert q.stress is not None
    cand, base = q.stress
    rows = []
    for name in ["nominal", "stressed", *cand.per_scenario]:
        cc = cand.nominal if name == "nominal" else cand.stressed if name == "stressed" else cand.per_scenario[name]
        bb = base.nominal if name == "nominal" else base.stressed if name == "stressed" else base.per_scenario.get(name)
        row = [name, str(cc.ticks)]
        for cal in (cc, bb):
            row += [_f(None if cal is None else cal.accuracy, True), _f(None if cal is None else cal.confidence, True)]
            row += [_f(None if cal is None else cal.ece)]
        rows.append(row)
    calib = _table(["ticks", "n", "cand. acc", "cand. conf", "cand. ECE", "base acc", "base conf", "base ECE"], rows)
    gate_rows = []
    for name, r in cand.gate.items():
        b = base.gate.get(name, {})
        gate_rows.append(
            [
                name,
                html.escape(f"not judged ({r['not_judged']})") if r.get("not_judged") else _f(r["auroc_judged"]),
                _f(r["detected"], True),
                _f(r["delay_median_ticks"]),
                _f(b.get("auroc_judged")),
                _f(b.get("detected"), True),
            ]
        )
    gate = _table(
        ["OOD scenario", "cand. AUROC", "cand. detected", "cand. delay (ticks)", "base AUROC", "base detected"],
        gate_rows,
    )
    fv = (
        f"nominal false vetoes per tick: candidate {_f(cand.false_vetoes['per_tick'], True)}, baseline "
        f"{_f(base.false_vetoes['per_tick'], True)}; missing signals vetoed: candidate "
        f"{_f(cand.missing_vetoed, True)}, baseline {_f(base.missing_vetoed, True)}; gates: candidate "
        f"{cand.gates}, baseline {base.gates}; seeds {cand.seeds}"
    )
    return calib + gate + f"<p>{html.escape(fv)}</p>"


REPORT_NAMES = ("qualify.json", "qualify.html")


def prepare_out_dir(out_dir: Path) -> None:
    """Before any step: --out made and writable (ConfigError, one line, otherwise), and the report of
    an earlier run removed, so that a run that fails leaves none that a reader could take for its own."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir, prefix=".qualify-probe-"):
            pass
        for name in REPORT_NAMES:
            (out_dir / name).unlink(missing_ok=True)
    except OSError as err:
        raise ConfigError(
            f"--out {out_dir}: cannot write the report there ({err.strerror or err}); give a folder you can write to"
        ) from None


def write_report(q: Qualification, out_dir: Path) -> tuple[Path, Path]:
    """qualify.html and qualify.json in out_dir, each written under a temporary name and renamed
    once both are complete: never a half-written report, nor a new JSON beside an old page."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, html_path = (out_dir / n for n in REPORT_NAMES)
    with tempfile.TemporaryDirectory(prefix="qualify-plots-") as tmp:
        plots = _plots(q, Path(tmp))
    partial = {p: p.with_name(f".{p.name}.partial") for p in (json_path, html_path)}
    try:
        partial[json_path].write_text(json.dumps(_clean(q.as_dict()), indent=2, allow_nan=False))
        partial[html_path].write_text(_page(q, plots, json_path.name))
        for final, temp in partial.items():
            temp.replace(final)
    finally:
        for temp in partial.values():
            temp.unlink(missing_ok=True)
    return html_path, json_path


def _page(q: Qualification, plots: dict[str, list[str]], json_name: str) -> str:
    verdict = q.verdict
    m = q.models
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>qualify {html.escape(m['candidate']['name'])}"
        f"</title><style>{_CSS}</style></head><body>",
        f"<h1>Qualification of {html.escape(m['candidate']['path'])}</h1>",
        f"<p>candidate {html.escape(m['candidate']['name'])} {html.escape(m['candidate']['version'])} against baseline "
        f"{html.escape(m['baseline']['path'])} ({html.escape(m['baseline']['version'])})</p>",
        f'<div class="banner {verdict.replace(" ", "")}">{html.escape(_verdict_text(q))}</div>',
    ]
    if q.failed:
        parts.append("<ul>" + "".join(f"<li class='fail'>{html.escape(c.line())}</li>" for c in q.failed) + "</ul>")
    if q.transfer is not None:  # the headline: sites the recipe never saw
        rows = [[d.dataset, *_transfer_cells(d.left_out), *_transfer_cells(d.within)] for d in q.transfer.datasets]
        columns = ["dataset", "left out: disagreement", "NOMINAL", "vetoed"]
        columns += ["within: disagreement", "NOMINAL", "vetoed"]
        parts += ["<h2>Transfer: each dataset left out of training</h2>", _table(columns, rows)]
    parts += ["<h2>Criteria</h2>", _checks_html(q)]
    if q.replay is not None:
        parts.append("<h2>(a) Replay on recorded drives</h2>")
        for tag, ev in (("candidate", q.replay.candidate), ("baseline", q.replay.baseline)):
            if ev.logs:
                parts.append(f"<h3>{tag}</h3><pre>{html.escape(format_evaluation(ev))}</pre>")
        if q.replay.skipped:
            parts.append("<p>not evaluated: " + html.escape(json.dumps(q.replay.skipped)) + "</p>")
        parts += plots["replay"]
    if q.stress is not None:
        parts += ["<h2>(b) Stress set</h2>", _stress_html(q), *plots["stress"]]
    if q.shadow is not None:
        s = q.shadow.as_dict()
        rows = [
            [
                tag,
                _f(d["ticks"]),
                _f(d["agreement_applied"], True),
                _f(d["agreement_proposed"], True),
                _f(d["veto_rate"], True),
                _f(d["beside_ticks"]),
                _f(d["agreement_beside"], True),
            ]
            for tag, d in (("candidate", s["candidate"]), ("baseline", s["baseline"]))
            if d is not None
        ]
        columns = ["model", "ticks", "agree applied", "agree proposed", "vetoed", "ticks beside", "agree beside"]
        parts += ["<h2>(c) Shadow evidence</h2>", _table(columns, rows)]
    if q.int8 is not None:
        rows = [
            [
                r["action"],
                str(r["support"]),
                _f(r["fp32_recall"], True),
                _f(r["int8_recall"], True),
                _f(r["recall_drop"]),
            ]
            for r in q.int8["per_class"]
        ]
        parts += [
            "<h2>INT8 variant, per class</h2>",
            _table(["action", "support", "FP32 recall", "INT8 recall", "drop"], rows),
        ]
    parts.append(
        f"<p>timings (s): {html.escape(json.dumps({k: round(v, 1) for k, v in q.timings_s.items()}))}; "
        f"JSON: {html.escape(json_name)}</p></body></html>"
    )
    return "\n".join(parts)


def _transfer_cells(c: Column | None) -> list[str]:
    if c is None:
        return ["-", "-", "-"]
    ratio = f"{c.ratio_text()} ({c.best_baseline})"
    if c.driving is None:
        return [ratio, "-", "-"]
    return [ratio, f"{100 * c.driving.nominal:.2f}%", f"{100 * c.driving.vetoed:.2f}%"]


def _clean(x: Any) -> Any:
    """JSON-safe: numpy scalars and arrays as Python values, NaN and infinities as null."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return _clean(x.tolist())
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if np.isfinite(x) else None
    return x


def _verdict_text(q: Qualification) -> str:
    if q.verdict == "not judged":
        return f"NOT JUDGED: nothing to compare ({q.why_not_judged()})"
    if q.verdict == "fail":
        return f"FAIL: {len(q.failed)} of {len(q.checks)} criteria failed"
    unjudged = f" ({len(q.not_judged)} not judged)" if q.not_judged else ""
    return f"PASS{unjudged}"


def summary_lines(q: Qualification) -> list[str]:
    """What the terminal prints: every check, then the verdict and the failed criteria."""
    lines = [c.line() for c in q.checks]
    lines.append(f"verdict: {_verdict_text(q)}")
    lines += [f"  failed: {c.line()}" for c in q.failed]
    return lines
