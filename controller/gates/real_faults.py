"""`dualloop gate eval --real`: one-signal sensor faults injected into real logs, each faulted log and
its clean twin replayed through the model and gates, every check judged tick by tick (docs/real-faults.md).

Each faulted log is replayed in LOCKSTEP exactly as `dualloop replay` replays a log (`run_replay`, the
executor's vectorised path), at the log's native rate, and so is the clean log. The ticks of a fault's
window [onset, end) are compared with the same ticks of the clean replay: per check (the snapshot's
`checks`, plus the executor's verdicts that are not checks: invalid input, a stale observation, a
refused stream), the AUROC of its score on the faulted ticks (positives) against the clean ticks
(negatives); per episode, the first tick in the window the check vetoes and the clean replay did not
(the detection delay), and whether it came within 100 ms and within 1 s of onset. Outside the windows,
the share of ticks of the faulted replays that anything vetoed (false vetoes), per data set.
"""

from __future__ import annotations

import math
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Final

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from dualloop import ood
from dualloop.controller.contract.wire import observation_from_proto
from dualloop.controller.gates import fault_injection as fi
from dualloop.controller.gates.real_logs import RealDataset
from dualloop.controller.logs.format import sensor_profile
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.replay.lockstep import LoadedModel, SessionOptions, executor_config_for, run_replay
from dualloop.executor.checks import NAMES
from dualloop.executor.core import Executor
from dualloop.executor.lockstep_batch import TickTable, run_lockstep
from dualloop.executor.sessions import InvalidObservation
from dualloop.executor.snapshot import Check, CheckStatus, Observation, Reason
from dualloop.v2 import log_pb2

SCHEMA: Final = "dualloop.real-faults/1"
SLOT_S: Final = 10.0  # one episode per slot: onset in its first part, recovery in the rest
WARMUP_S: Final = 5.0  # no fault before the filters have seen this much of the drive
MAX_ROUNDS: Final = 12  # replays of one log per fault and signal, each with its own windows
PACK: Final = 8  # episodes at most in one faulted replay
# "the second after" a window: its vetoes are the fault's (the value jumping back is a change), reported
# apart; false vetoes are counted on the ticks outside the windows and those seconds
AFTER_S: Final = 1.0
PREFIX_OBS: Final = 64  # observations replayed before a frozen timestamp, to put the session in its state
# checks whose score is a confidence: lower is worse
LOWER_IS_WORSE: Final = frozenset({Check.MARGIN})
INVALID: Final = "invalid_input"
STALE: Final = "stale_observation"
REFUSED: Final = "stream_refused"
ANY: Final = "any"  # every verdict that distrusts the inputs or holds: the gates, invalid input, staleness
# reported, never "the best check": the combination, and the model's own confidence
NOT_INPUT_CHECKS: Final = frozenset({ANY, NAMES[Check.MARGIN]})
# targets: fault -> (best check's AUROC at least, detected by `any` within this many seconds, share of episodes)
STRICT: Final = (0.99, 0.1)
LOOSE: Final = (0.95, 1.0)
TARGETS: Final[dict[str, tuple[float, float]]] = {
    fi.STUCK: STRICT,
    fi.ZERO: STRICT,
    fi.NOISE: STRICT,
    fi.SPIKES: STRICT,
    fi.UNIT: STRICT,
    fi.FROZEN_TIME: STRICT,
    fi.BIAS: LOOSE,
    fi.FLICKER: LOOSE,
}
DETECTED_SHARE: Final = 0.95  # of the episodes, for "detected within"
TARGET_FALSE_VETOES: Final = 0.001  # per tick outside the fault windows
BIG: Final = float(np.finfo(np.float64).max)


@dataclass
class Verdicts:
    """Per tick (the replay's 5 ms grid): each check's score (higher = more anomalous, -inf where it did
    not judge, +inf for a verdict that is a veto by nature) and veto."""

    tick_ns: np.ndarray
    score: dict[str, np.ndarray]
    veto: dict[str, np.ndarray]


def verdicts(table: TickTable) -> Verdicts:
    """The checks of a replay's ticks, and the executor's verdicts that are not checks."""
    score: dict[str, np.ndarray] = {}
    veto: dict[str, np.ndarray] = {}
    if table.checks is not None:
        for i, kind in enumerate(table.check_kinds):
            name = NAMES.get(kind, kind.name.lower())
            c = table.checks[:, i]
            s = -c["score"] if kind in LOWER_IS_WORSE else c["score"]
            score[name] = np.where(c["status"] == CheckStatus.SCORED, s, -np.inf)
            veto[name] = c["veto"].astype(bool)
    invalid = ~table.finite.astype(bool)
    score[INVALID], veto[INVALID] = invalid.astype(np.float64), invalid
    stale = np.array([Reason.STALE_OBSERVATION in r for r in table.reasons], bool)
    score[STALE] = table.age_ns / np.maximum(table.observation_period_ns, 1)
    veto[STALE] = stale
    any_veto = table.gate_veto.astype(bool) | invalid | stale
    gate = (
        np.full(len(table), -np.inf)
        if table.gate_score is None or table.gate_threshold is None
        else np.nan_to_num(table.gate_score / table.gate_threshold, nan=-np.inf)
    )
    score[ANY], veto[ANY] = np.where(any_veto, np.inf, gate), any_veto
    score[REFUSED], veto[REFUSED] = np.zeros(len(table)), np.zeros(len(table), bool)
    return Verdicts(table.tick_ns, score, veto)


@dataclass
class LoadedLog:
    path: Path
    header: log_pb2.SessionHeader
    observations: list[Observation]
    features: np.ndarray  # (N, F) float32
    timestamps: np.ndarray  # (N,) int64
    names: list[str]  # the features' names (the model card's order: the observations')

    @classmethod
    def read(cls, path: Path, names: Sequence[str]) -> LoadedLog:
        data = read_log(path)
        obs = [observation_from_proto(m, 0) for m in data.observations]
        if not obs:
            raise ValueError(f"{path}: no observations to inject faults into")
        feats = np.array([o.features for o in obs], np.float32)
        if feats.shape[1] != len(names):
            raise ValueError(f"{path}: observations have {feats.shape[1]} features; the model has {len(names)}")
        ts = np.array([o.timestamp_ns for o in obs], np.int64)
        return cls(path, data.header, obs, feats, ts, list(names))

    @property
    def measured(self) -> set[str]:
        profile = sensor_profile(self.header)
        return set(self.names) if profile is None else set(profile)

    @property
    def minutes(self) -> float:
        return float(self.timestamps[-1] - self.timestamps[0]) / 60e9

    def faulted(self, f: fi.Faulted) -> list[Observation]:
        """The observations with the faulted values (a new Observation only where one changed)."""
        out = []
        changed = fi.changed_rows(f, self.features, self.timestamps)  # a dropped row is skipped below
        for i, o in enumerate(self.observations):
            if not f.keep[i]:
                continue
            out.append(replace(o, features=f.features[i], timestamp_ns=int(f.timestamps[i])) if changed[i] else o)
        return out


def _open(loaded: LoadedModel, log: LoadedLog) -> tuple[Executor, SessionOptions]:
    return loaded.executor(executor_config_for(log.header)), SessionOptions.of_header(log.header)


def replay(loaded: LoadedModel, log: LoadedLog, observations: Sequence[Observation]) -> Verdicts:
    """One LOCKSTEP replay, as `dualloop replay` runs it (shadow, the log's sensor profile and rate)."""
    ex, session = _open(loaded, log)
    tables: list[TickTable] = []
    run_replay(ex, log.header.session_id, observations, session, table_out=tables, snapshots=False)
    return verdicts(tables[0])


def refused_at(loaded: LoadedModel, log: LoadedLog, observations: list[Observation], first: int) -> int | None:
    """The index of the first faulted observation (from `first` on) the executor refuses after
    the observations before it; None when it accepts them all."""
    ex, session = _open(loaded, log)
    sid = log.header.session_id
    session.open(ex, sid)
    try:
        run_lockstep(ex, sid, observations[max(0, first - PREFIX_OBS) : first])
        for i in range(first, len(observations)):
            try:
                ex.advance_lockstep(sid, observations[i])
            except InvalidObservation:
                return i
            if observations[i].timestamp_ns == log.timestamps[i] and i > first:
                return None  # past the window, accepted throughout
    finally:
        ex.close_session(sid)
    return None


@dataclass
class EpisodeResult:
    fault: str
    signal: str
    log: str
    onset_s: float  # from the log's start: the first observation the fault changed
    duration_s: float  # from the onset to the window's end
    magnitude: float
    delay_s: dict[str, float]  # per check: first veto in the window the clean replay did not make; inf none
    vetoed: float  # share of the window's ticks `any` vetoed
    # how far the fault moved the reading over its first 100 ms and 1 s (fault_injection.moved_by)
    moved: tuple[float | None, float | None] = (None, None)


@dataclass
class Pool:
    """The window ticks of one fault on one signal, per check: faulted scores and clean scores."""

    faulted: dict[str, list[np.ndarray]] = field(default_factory=lambda: defaultdict(list))
    clean: dict[str, list[np.ndarray]] = field(default_factory=lambda: defaultdict(list))
    vetoed: dict[str, list[np.ndarray]] = field(default_factory=lambda: defaultdict(list))
    episodes: list[EpisodeResult] = field(default_factory=list)


@dataclass
class VetoCount:
    ticks: int = 0
    vetoes: int = 0

    def add(self, veto: np.ndarray) -> None:
        self.ticks += int(veto.size)
        self.vetoes += int(veto.sum())

    def as_dict(self) -> dict[str, Any]:
        return {"ticks": self.ticks, "vetoes": self.vetoes, "rate": self.vetoes / max(self.ticks, 1)}


def _rng(seed: int, *names: str) -> np.random.Generator:
    return np.random.default_rng([seed, *(zlib.crc32(n.encode()) for n in names)])


def plan_episodes(
    logs: list[LoadedLog], fault: str, signal: str, n: int, seed: int, dataset: str
) -> dict[tuple[int, int], list[fi.Episode]]:
    """Up to n episodes of `fault` on `signal` over the data set's logs, grouped by (log, round): each
    group is one faulted replay. Windows are drawn per log and round (until there are enough), kept where
    `fi.eligible`; the groups are taken in random order, at most PACK episodes from each, until there are
    n. A frozen timestamp ends the stream, so each of those is its own group."""
    rng = _rng(seed, dataset, fault, signal)
    by_group: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for r in range(MAX_ROUNDS):
        for k, log in enumerate(logs):
            if signal not in (fi.TIMESTAMPS, fi.ROWS) and signal not in log.measured:
                continue
            for first, stop in fi.draw_windows(log.timestamps, rng, SLOT_S, WARMUP_S):
                if fi.eligible(fault, signal, log.features, log.names, first, stop):
                    by_group[(k, r)].append((first, stop))
        if sum(min(PACK, len(w)) for w in by_group.values()) >= n:  # enough, PACK at most from each
            break
    # at most PACK episodes from each (log, round), the groups in random order: spread over the logs,
    # yet a few replays per fault and signal
    candidates: list[tuple[int, int, int, int]] = []
    keys = list(by_group)
    for g in rng.permutation(len(keys)):
        k, r = keys[g]
        windows = by_group[(k, r)]
        take = rng.choice(len(windows), min(PACK, len(windows), n - len(candidates)), replace=False)
        candidates += [(k, r, *windows[i]) for i in sorted(take)]
        if len(candidates) >= n:
            break
    groups: dict[tuple[int, int], list[fi.Episode]] = defaultdict(list)
    for j, (k, r, first, stop) in enumerate(candidates):
        column = logs[k].features[:, logs[k].names.index(signal)] if signal in logs[k].names else np.zeros(0)
        ep = fi.Episode(fault, signal, first, stop, fi.draw_magnitude(fault, signal, column, rng))
        groups[(k, j if fault == fi.FROZEN_TIME else r)].append(ep)
    return dict(groups)


def _window_ticks(tick_ns: np.ndarray, log: LoadedLog, first: int, ep: fi.Episode) -> tuple[int, int, int]:
    """(onset, end, end of the second after) as tick indices: the first tick at or after observation
    `first`'s (true) time, the first at or after the next healthy one's."""
    onset_ns, end_ns = log.timestamps[first], log.timestamps[ep.stop]
    return (
        int(np.searchsorted(tick_ns, onset_ns)),
        int(np.searchsorted(tick_ns, end_ns)),
        int(np.searchsorted(tick_ns, end_ns + int(AFTER_S * 1e9))),
    )


def run_dataset(
    loaded: LoadedModel,
    dataset: RealDataset,
    episodes: int,
    seed: int,
    faults: Sequence[str],
    progress: Progress | None = None,
    max_logs: int | None = None,
) -> dict[str, Any]:
    """Every fault's episodes on one data set, and their metrics (the JSON's `datasets[name]`)."""
    paths = list(dataset.logs)
    if max_logs is not None and len(paths) > max_logs:
        pick = _rng(seed, dataset.name, "logs").choice(len(paths), max_logs, replace=False)
        paths = [paths[i] for i in sorted(pick)]
    logs = [LoadedLog.read(p, loaded.model.card.feature_names) for p in paths]
    plans = {(f, s): plan_episodes(logs, f, s, episodes, seed, dataset.name) for f in faults for s in fi.SIGNALS[f]}
    task = None
    if progress is not None:
        total = len(logs) + sum(len(g) for g in plans.values())
        task = progress.add_task(f"{dataset.name}: clean replays", total=total)
    clean: dict[int, Verdicts] = {}
    clean_count = VetoCount()
    for k, log in enumerate(logs):
        clean[k] = replay(loaded, log, log.observations)
        clean_count.add(clean[k].veto[ANY])
        if progress is not None and task is not None:
            progress.advance(task)
    pools: dict[tuple[str, str], Pool] = {}
    outside, after = VetoCount(), VetoCount()
    # which check and which fault's replays the false vetoes came from
    by_check: dict[str, VetoCount] = {}
    by_fault: dict[str, VetoCount] = {}
    for (fault, signal), groups in plans.items():
        pool = pools.setdefault((fault, signal), Pool())
        if progress is not None and task is not None:
            progress.update(task, description=f"{dataset.name}: {fault} on {signal}")
        for (k, _), eps in groups.items():
            log = logs[k]
            rng = _rng(seed, dataset.name, fault, signal, str(k), str(eps[0].first))
            faulted = fi.inject(log.features, log.timestamps, eps, log.names, rng)
            obs = log.faulted(faulted)
            base = clean[k]
            if fault == fi.FROZEN_TIME:
                got = _frozen_verdicts(loaded, log, obs, eps[0], base)
            else:
                got = replay(loaded, log, obs)
                if not np.array_equal(got.tick_ns, base.tick_ns):
                    raise RuntimeError(f"{log.path}: the faulted replay's ticks are not the clean replay's (a bug)")
            inside = np.zeros(len(base.tick_ns), bool)  # the windows and the second after each
            for ep in eps:
                start, _, hi_after = _window_ticks(base.tick_ns, log, ep.first, ep)
                inside[start:hi_after] = True  # the window's ticks before its onset are neither
                onset = fi.first_change(faulted, log.features, log.timestamps, ep)
                lo, hi, _ = _window_ticks(base.tick_ns, log, onset, ep)
                by = [fi.moved_by(faulted, log.features, log.timestamps, log.names, ep, onset, s) for s in (0.1, 1.0)]
                _score_episode(pool, ep, log, got, base, lo, hi, onset, (by[0], by[1]))
                if fault != fi.FROZEN_TIME:
                    after.add(got.veto[ANY][hi:hi_after])
            if fault != fi.FROZEN_TIME:
                outside.add(got.veto[ANY][~inside])
                by_fault.setdefault(fault, VetoCount()).add(got.veto[ANY][~inside])
                for name, veto in got.veto.items():
                    if name not in NOT_INPUT_CHECKS:
                        by_check.setdefault(name, VetoCount()).add(veto[~inside])
            if progress is not None and task is not None:
                progress.advance(task)
    return {
        "source": str(dataset.source),
        # an imported log by its name (its scratch folder changes run to run: the JSON must not)
        "logs": [str(p.relative_to(dataset.source)) if p.is_relative_to(dataset.source) else p.name for p in paths],
        "minutes": sum(log.minutes for log in logs),
        "clean_vetoes": clean_count.as_dict(),
        "false_vetoes_outside": outside.as_dict(),
        "vetoes_in_second_after": after.as_dict(),
        "false_vetoes_outside_by_check": {name: c.as_dict() for name, c in sorted(by_check.items())},
        "false_vetoes_outside_by_fault": {name: c.as_dict() for name, c in by_fault.items()},
        "faults": {
            fault: {signal: _summarise(pools[(fault, signal)]) for f, signal in pools if f == fault} for fault in faults
        },
    }


def _frozen_verdicts(
    loaded: LoadedModel, log: LoadedLog, obs: list[Observation], ep: fi.Episode, base: Verdicts
) -> Verdicts:
    """A frozen timestamp in LOCKSTEP: the ticks before it are the clean replay's (the same inputs);
    the executor refuses the stream at the refused observation, which ends the session: from there on
    the stream-refused verdict vetoes and no check judges. Accepted, the frozen observations make no
    tick (time does not advance): no check judges the window."""
    at = refused_at(loaded, log, obs, ep.first)
    start = int(np.searchsorted(base.tick_ns, log.timestamps[ep.first]))
    score = {n: s.copy() for n, s in base.score.items()}
    veto = {n: v.copy() for n, v in base.veto.items()}
    for n in score:
        score[n][start:], veto[n][start:] = -np.inf, False
    if at is not None:
        refused = int(np.searchsorted(base.tick_ns, log.timestamps[at]))
        score[REFUSED][refused:], veto[REFUSED][refused:] = np.inf, True
        score[ANY][refused:], veto[ANY][refused:] = np.inf, True
    return Verdicts(base.tick_ns, score, veto)


def _score_episode(
    pool: Pool,
    ep: fi.Episode,
    log: LoadedLog,
    got: Verdicts,
    base: Verdicts,
    lo: int,
    hi: int,
    onset: int,
    moved: tuple[float | None, float | None],
) -> None:
    """Ticks [lo, hi) from the onset (observation `onset`, the first the fault changed) to the window's end."""
    tick_ns = base.tick_ns
    delays: dict[str, float] = {}
    for name in got.score:
        pool.faulted[name].append(got.score[name][lo:hi])
        pool.clean[name].append(base.score[name][lo:hi])
        pool.vetoed[name].append(got.veto[name][lo:hi])
        hits = np.flatnonzero(got.veto[name][lo:hi] & ~base.veto[name][lo:hi])
        delays[name] = float(tick_ns[lo + hits[0]] - log.timestamps[onset]) / 1e9 if hits.size else math.inf
    t0 = log.timestamps[0]
    pool.episodes.append(
        EpisodeResult(
            ep.fault,
            ep.signal,
            log.path.name,
            float(log.timestamps[onset] - t0) / 1e9,
            float(log.timestamps[ep.stop] - log.timestamps[onset]) / 1e9,
            ep.magnitude,
            delays,
            float(got.veto[ANY][lo:hi].mean()) if hi > lo else 0.0,
            moved,
        )
    )


def _auroc(faulted: list[np.ndarray], clean: list[np.ndarray]) -> float:
    pos, neg = np.concatenate(faulted), np.concatenate(clean)
    if not pos.size:
        return math.nan
    # a veto by nature (+inf) ranks above every score, "did not judge" (-inf) below
    return ood.auroc(np.clip(neg, -BIG, BIG), np.clip(pos, -BIG, BIG))


def _summarise(pool: Pool) -> dict[str, Any]:
    checks: dict[str, dict[str, float | None]] = {}
    for name in pool.faulted:
        delays = np.array([e.delay_s[name] for e in pool.episodes])
        found = delays[np.isfinite(delays)]
        checks[name] = {
            "auroc": _auroc(pool.faulted[name], pool.clean[name]),
            "detected_100ms": float((delays <= 0.1 + 1e-9).mean()),
            "detected_1s": float((delays <= 1.0 + 1e-9).mean()),
            "detected": float(np.isfinite(delays).mean()),
            "delay_median_s": float(np.median(found)) if found.size else None,
            "vetoed_in_window": float(np.concatenate(pool.vetoed[name]).mean()),
        }
    # the best single check: the highest AUROC of those that judge the inputs (not `any`, not the model's margin)
    single = {n: c for n, c in checks.items() if n not in NOT_INPUT_CHECKS and c["auroc"] == c["auroc"]}
    best = max(single, key=lambda n: single[n]["auroc"] or 0.0) if single else None
    return {
        "episodes": len(pool.episodes),
        "ticks": int(sum(a.size for a in pool.faulted.get(ANY, []))),
        "best_check": best,
        "best_auroc": None if best is None else single[best]["auroc"],
        "checks": checks,
        "episode_list": [
            {
                "log": e.log,
                "onset_s": round(e.onset_s, 3),
                "duration_s": round(e.duration_s, 3),
                "magnitude": e.magnitude,
                "delay_any_s": None if not math.isfinite(e.delay_s[ANY]) else e.delay_s[ANY],
                "vetoed": e.vetoed,
                "moved_100ms": e.moved[0],
                "moved_1s": e.moved[1],
            }
            for e in pool.episodes
        ],
    }


def jsonable(x: Any) -> Any:
    """The result with every non-finite number (an AUROC without ticks, no delay) as null."""
    if isinstance(x, dict):
        return {k: jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [jsonable(v) for v in x]
    if isinstance(x, float | np.floating):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def _little_moved(summary: dict[str, Any], signal: str, within: float) -> str:
    """How many of the episodes moved the reading by less than the signal's smallest spread in the
    time the target allows (a sensor's own noise): what the reader needs to tell a check that misses
    from a fault that barely showed."""
    floor = fi.MIN_SPREAD.get(signal)
    key = "moved_100ms" if within <= 0.1 else "moved_1s"
    moved = [e[key] for e in summary["episode_list"] if e[key] is not None]
    if floor is None or not moved:
        return ""
    little = sum(m < floor for m in moved)
    unit = fi.UNITS[signal]
    return f" ({little} of {len(moved)} moved the reading by less than {floor:g} {unit} in that time)" if little else ""


def targets(result: dict[str, Any]) -> list[str]:
    """The targets not met, each named: per data set, fault and signal, and the false vetoes."""
    failed = []
    for name, ds in result["datasets"].items():
        for fault, signals in ds["faults"].items():
            if fault not in TARGETS:
                continue
            auroc_min, within = TARGETS[fault]
            key = "detected_100ms" if within <= 0.1 else "detected_1s"
            for signal, r in signals.items():
                if not r["episodes"]:
                    continue
                best = r["best_auroc"]
                if best is None or not best >= auroc_min:
                    failed.append(
                        f"{name}: {fault} on {signal}: best AUROC {best if best is None else round(best, 3)} "
                        f"({r['best_check']}) < {auroc_min}"
                    )
                share = r["checks"][ANY][key]
                if share < DETECTED_SHARE:
                    failed.append(
                        f"{name}: {fault} on {signal}: detected within {within * 1000:.0f} ms in {share:.0%} of "
                        f"{r['episodes']} episodes < {DETECTED_SHARE:.0%}{_little_moved(r, signal, within)}"
                    )
        rate = ds["false_vetoes_outside"]["rate"]
        if rate > TARGET_FALSE_VETOES:
            failed.append(f"{name}: false vetoes outside fault windows {rate:.3%} > {TARGET_FALSE_VETOES:.1%}")
    return failed


def evaluate_real(
    loaded: LoadedModel,
    datasets: Sequence[RealDataset],
    episodes: int = 40,
    seed: int = 0,
    faults: Sequence[str] = fi.FAULTS,
    console: Console | None = None,
    max_logs: int | None = None,
) -> dict[str, Any]:
    console = console or Console()
    unknown = sorted(set(faults) - set(fi.FAULTS))
    if unknown:
        raise ValueError(f"unknown faults {unknown}; known: {', '.join(fi.FAULTS)}")
    result: dict[str, Any] = {
        "schema": SCHEMA,
        "model": f"{loaded.model.card.name} {loaded.model.card.version}",
        "gates": list(loaded.gate_paths),
        "seed": seed,
        "episodes_per_fault_and_signal": episodes,
        "max_logs": max_logs,
        "datasets": {},
    }
    with Progress(console=console, transient=True) as progress:
        for ds in datasets:
            result["datasets"][ds.name] = run_dataset(loaded, ds, episodes, seed, faults, progress, max_logs)
    result["targets"] = {
        "strict": {"faults": [f for f, t in TARGETS.items() if t == STRICT], "auroc_min": STRICT[0], "within_s": 0.1},
        "loose": {"faults": [f for f, t in TARGETS.items() if t == LOOSE], "auroc_min": LOOSE[0], "within_s": 1.0},
        "detected_share": DETECTED_SHARE,
        "false_vetoes_max": TARGET_FALSE_VETOES,
        "failed": targets(result),
    }
    return result


SHORT: Final = {
    "decision_vector_density": "dv",
    "input_density": "in",
    "input_range": "range",
    "input_change": "chg",
    "freeze": "frz",
    "margin": "marg",
    "signal_stuck": "stuck",
    "speed_accel": "v-a",
    "gap_rate": "gap",
    "lead_flicker": "flick",
    "speed_repeat": "v-rep",
    "gap_repeat": "g-rep",
    "gap_step": "g-step",
    "rel_accel": "r-acc",
    "rel_unit": "r-unit",
    "rel_sign": "r-sign",
    INVALID: "inval",
    STALE: "stale",
    REFUSED: "refus",
    ANY: "any",
}


def print_real(result: dict[str, Any], console: Console) -> None:
    for name, ds in result["datasets"].items():
        first = next((s for sig in ds["faults"].values() for s in sig.values() if s["episodes"]), None)
        shown = [c for c in (first or {"checks": {}})["checks"] if c in SHORT]
        fv, af, cl = ds["false_vetoes_outside"], ds["vetoes_in_second_after"], ds["clean_vetoes"]
        table = Table(
            title=f"{name}: {len(ds['logs'])} logs, {ds['minutes']:.1f} min; vetoes: clean {cl['rate']:.3%}, "
            f"outside fault windows {fv['rate']:.3%}, in the second after {af['rate']:.3%}",
            title_justify="left",
        )
        for col in ("fault", "signal", "eps", *(f"{SHORT[c]}" for c in shown), "best", "<=100ms", "<=1s", "delay"):
            table.add_column(col, justify="left" if col in ("fault", "signal", "best") else "right")
        for fault, signals in ds["faults"].items():
            for signal, r in signals.items():
                if not r["episodes"]:
                    table.add_row(fault, signal, "0")
                    continue
                c = r["checks"]
                delay = c[ANY]["delay_median_s"]
                table.add_row(
                    fault,
                    signal,
                    str(r["episodes"]),
                    *(f"{c[k]['auroc']:.2f}" for k in shown),
                    f"{SHORT.get(r['best_check'], r['best_check'])} {r['best_auroc']:.3f}",
                    f"{c[ANY]['detected_100ms']:.0%}",
                    f"{c[ANY]['detected_1s']:.0%}",
                    "-" if delay is None else f"{delay * 1000:.0f} ms",
                )
        console.print(table)
    console.print(
        "AUROC per check: the check's score on the fault windows' ticks against the same ticks of the clean "
        "replay; detection (<=100ms, <=1s, median delay): the first veto in the window by any check (`any`) "
        "that the clean replay did not make",
        highlight=False,
    )
    failed = result["targets"]["failed"]
    console.print(
        "[green]real-fault targets met[/]" if not failed else f"[red]{len(failed)} targets not met:[/]", highlight=False
    )
    for line in failed:
        console.print(f"  {line}", highlight=False, markup=False)
