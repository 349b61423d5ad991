"""Actuation check: measured acceleration short of the command the vehicle was executing.

A slippery road (or weak brakes) shows in no feature while the car cruises; it shows when the car
brakes or accelerates, as a measured acceleration smaller than the command asked for. This check
needs the command in effect when each observation was taken (``Observation.actual`` on the wire:
what the vehicle was executing, as a shadow stack or a closed-loop simulator sends it). Without
one, or below ``min_speed`` (a car held by its brakes at a standstill does not decelerate),
there is no verdict: missing data never vetoes.

Per fresh observation (times from the observations' timestamps, so any sensor rate works):

- expected acceleration e: the command through a fitted first-order lag, gain and offset,
  e += (1 - exp(-dt / tau)) * (gain * command + offset - e), started at the measured value and
  judged from 3 tau after that start (the start's sensor noise has then decayed to 5%);
- shortfall s = (e - a) * sign(e): how much less than expected the car braked or accelerated
  (one-sided: braking harder than asked is not a low-friction symptom);
- its exponential mean m over ``window_s`` (single-sample sensor noise averages out);
- exceed = m > threshold (split-conformal on held-out nominal driving, like the gates' scores),
  confirmed by a k-of-n filter over observations;
- distrust: friction does not come back on its own, so a confirmed shortfall of at least
  ``hold_ratio`` x the threshold is remembered as a level d = m / (hold_ratio x threshold) that
  decays with ``distrust_tau_s``; the check vetoes while d >= 1, i.e. for distrust_tau_s x
  ln(peak / (hold_ratio x threshold)) after the shortfall was last confirmed, whether or not the
  car is braking meanwhile. A marginal exceedance (under hold_ratio x threshold, where nominal
  noise lives) is not held, so it costs no more false vetoes than the filter lets through.

``ActuationMonitor.step`` (live ticks, plain Python floats per row) and ``.scan`` (a replay's
observations of one slot) apply the same rule with the same float64 arithmetic, so both paths give
identical verdicts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from dualloop.ood.calibrate import ThresholdCalibration, calibrate_threshold

_NAN = math.nan
_INF = math.inf


@dataclass(frozen=True)
class ActuationSettings:
    """What the check reads and how it decides; stated, not fitted."""

    accel_feature: str = "ego_accel"  # measured longitudinal acceleration, m/s^2
    speed_feature: str = "ego_speed"  # m/s
    command_control: str = "accel"  # the control (in the actual action) that commands acceleration
    window_s: float = 0.1  # time constant of the shortfall's mean
    min_speed: float = 1.0  # m/s; below it no verdict (standstill, creeping)
    max_gap_s: float = 0.1  # a longer gap between observations restarts the model (command unknown in between)
    k: int = 3  # k of the last n verdicts over the threshold confirm a shortfall
    n: int = 5
    hold_ratio: float = 2.0  # only a confirmed shortfall this many thresholds deep is held
    distrust_tau_s: float = 2.0  # decay time constant of the held distrust

    def __post_init__(self) -> None:
        for name in ("window_s", "max_gap_s", "distrust_tau_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0.0):
                raise ValueError(f"actuation check: {name} must be a finite number > 0, got {value!r}")
        if not (math.isfinite(self.min_speed) and self.min_speed >= 0.0):
            raise ValueError(f"actuation check: min_speed must be a finite number >= 0, got {self.min_speed!r}")
        if not (math.isfinite(self.hold_ratio) and self.hold_ratio >= 1.0):
            raise ValueError(f"actuation check: hold_ratio must be a finite number >= 1, got {self.hold_ratio!r}")
        if not (isinstance(self.k, int) and isinstance(self.n, int) and 1 <= self.k <= self.n <= 64):
            raise ValueError(f"actuation check needs integers 1 <= k <= n <= 64, got k={self.k}, n={self.n}")
        if not (self.accel_feature and self.speed_feature and self.command_control):
            raise ValueError(
                "actuation check needs the names of its acceleration and speed features and command control"
            )

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ActuationSettings:
        kinds = {f.name: str(f.type) for f in dataclasses.fields(ActuationSettings)}  # annotations: strings
        unknown = sorted(set(d) - set(kinds))
        if unknown:
            raise ValueError(f"actuation settings: unknown fields {unknown}")
        cast = {"str": str, "int": int, "float": float}
        return ActuationSettings(**{k: cast[kinds[k]](v) for k, v in d.items()})


@dataclass(frozen=True)
class ActuationModel:
    """Measured acceleration = first-order lag (tau_s) of gain * command + offset; fitted."""

    tau_s: float
    gain: float
    offset: float  # m/s^2
    rmse: float  # of the fit, m/s^2, on the fitting observations
    n: int  # fitting observations

    def __post_init__(self) -> None:
        if not (
            math.isfinite(self.tau_s)
            and self.tau_s > 0.0
            and math.isfinite(self.gain)
            and self.gain > 0.0
            and math.isfinite(self.offset)
        ):
            raise ValueError(f"actuation model needs tau_s > 0, gain > 0 and a finite offset, got {self}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "tau_s": float(self.tau_s),
            "gain": float(self.gain),
            "offset": float(self.offset),
            "rmse": float(self.rmse),
            "n": int(self.n),
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ActuationModel:
        return ActuationModel(float(d["tau_s"]), float(d["gain"]), float(d["offset"]), float(d["rmse"]), int(d["n"]))


class ActuationEpisode(NamedTuple):
    """One drive for fitting or calibration, consecutive observations: NaN where unknown (no
    command yet, or the row is not valid)."""

    t_ns: np.ndarray  # (T,) int64 observation timestamps
    accel: np.ndarray  # (T,) measured acceleration
    speed: np.ndarray  # (T,)
    command: np.ndarray  # (T,) the command in effect when the observation was taken


@dataclass(frozen=True, eq=False)
class ActuationCheck:
    """Fitted model + settings + calibrated threshold on the smoothed shortfall (m/s^2)."""

    model: ActuationModel
    settings: ActuationSettings
    calibration: ThresholdCalibration

    @property
    def threshold(self) -> float:
        return self.calibration.threshold

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.to_dict(),
            "settings": self.settings.to_dict(),
            "calibration": self.calibration.to_dict(),
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> ActuationCheck:
        check = ActuationCheck(
            ActuationModel.from_dict(d["model"]),
            ActuationSettings.from_dict(d["settings"]),
            ThresholdCalibration.from_dict(d["calibration"]),
        )
        if not (math.isfinite(check.threshold) and check.threshold > 0.0):
            raise ValueError(f"actuation check threshold must be a finite number > 0, got {check.threshold}")
        return check

    def indices(self, feature_names: Sequence[str], control_names: Sequence[str]) -> tuple[int, int, int]:
        """(accel feature, speed feature, command control) positions; ValueError naming what is missing."""
        s, names, controls = self.settings, list(feature_names), list(control_names)
        missing = [n for n in (s.accel_feature, s.speed_feature) if n not in names]
        if missing:
            raise ValueError(f"actuation check reads features {missing}, which the inputs do not have")
        if s.command_control not in controls:
            raise ValueError(f"actuation check reads the control {s.command_control!r}; the controls are {controls}")
        return names.index(s.accel_feature), names.index(s.speed_feature), controls.index(s.command_control)

    def monitor(self, n_slots: int) -> ActuationMonitor:
        return ActuationMonitor(self, n_slots)


# per slot: (last observation time ns or None, expected accel or None, mean shortfall, k-of-n bits,
# distrust, time of the (re)start ns)
SlotState = tuple[int | None, float | None, float, int, float, int]
_START: SlotState = (None, None, 0.0, 0, 0.0, 0)
# The expected accel starts from one noisy measurement; it is judged only once the lag has forgotten
# that start (3 time constants: 5% of its error left), else a drive opening with a throttle step is
# vetoed for its first reading's noise (docs/design-notes/ood.md, "Actuation check: the warm-up after a (re)start").
_WARM_UP_TAUS = 3.0


def make_rule(
    model: ActuationModel, settings: ActuationSettings, threshold: float
) -> Callable[[SlotState, int, float, float, float], tuple[SlotState, float, bool]]:
    """The per-observation rule: ``advance(state, t_ns, accel, speed, command) -> (state, score,
    alarm)``; score is the mean shortfall (NaN: no verdict), or while distrust is held the held
    level if larger. Plain Python floats: this runs once per session per fresh observation."""
    tau, gain, offset = model.tau_s, model.gain, model.offset
    window, dtau, vmin = settings.window_s, settings.distrust_tau_s, settings.min_speed
    max_gap_ns = settings.max_gap_s * 1e9
    mask, k = (1 << settings.n) - 1, settings.k
    hold = threshold * settings.hold_ratio
    warm_up_ns = _WARM_UP_TAUS * tau * 1e9
    exp = math.exp
    factors: dict[int, tuple[float, float, float]] = {}  # per dt: lag, mean and decay factors

    def advance(state: SlotState, t_ns: int, a: float, v: float, c: float) -> tuple[SlotState, float, bool]:
        last, e, m, bits, d, start = state
        dt_ns = -1 if last is None else t_ns - last
        f = factors.get(dt_ns)
        if f is None and dt_ns >= 0:
            dt = dt_ns * 1e-9
            f = (-math.expm1(-dt / tau), -math.expm1(-dt / window), exp(-dt / dtau))
            if len(factors) > 64:  # observation times jitter: keep the cache small
                factors.clear()
            factors[dt_ns] = f
        if d and f is not None:
            d *= f[2]
        # a finite command, acceleration and speed, and moving: else no verdict (x - x is NaN for inf)
        if c - c != 0.0 or a - a != 0.0 or not v >= vmin or v - v != 0.0:
            return (t_ns, None, 0.0, 0, d, 0), (d * hold if d >= 1.0 else _NAN), d >= 1.0
        if e is None or dt_ns > max_gap_ns or f is None:
            # (re)start from the measurement: no evidence yet, and the warm-up begins now (warm_up_ns > 0)
            return (t_ns, a, 0.0, 0, d, t_ns), (d * hold if d >= 1.0 else _NAN), d >= 1.0
        e += f[0] * (gain * c + offset - e)
        if t_ns - start < warm_up_ns:
            return (t_ns, e, 0.0, 0, d, start), (d * hold if d >= 1.0 else _NAN), d >= 1.0
        m += f[1] * ((e - a if e >= 0.0 else a - e) - m)
        bits = ((bits << 1) | (m > threshold)) & mask
        confirmed = bits.bit_count() >= k
        if confirmed and m > d * hold:
            d = m / hold
        held = d >= 1.0
        return (t_ns, e, m, bits, d, start), (d * hold if held and d * hold > m else m), confirmed or held

    return advance


class ActuationMonitor:
    """One slot per session, the state as Python numbers (a tick has few rows). ``step`` advances
    the rows whose observation is fresh and repeats the last verdict for the others (a 100 Hz
    sensor on 200 Hz ticks); ``scan`` does the same for a replay's observations of one slot."""

    def __init__(self, check: ActuationCheck, n_slots: int) -> None:
        if n_slots < 1:
            raise ValueError(f"n_slots must be >= 1, got {n_slots}")
        self.check = check
        self.threshold = float(check.threshold)
        self.n_slots = n_slots
        self.advance = make_rule(check.model, check.settings, self.threshold)
        self._state: list[SlotState] = [_START] * n_slots
        self._last: list[tuple[float, bool]] = [(_NAN, False)] * n_slots

    def step(
        self,
        slots: Sequence[int],
        fresh: Sequence[bool],
        t_ns: Sequence[int],
        accel: Sequence[float],
        speed: Sequence[float],
        command: Sequence[float],
    ) -> tuple[list[float], list[bool]]:
        """Per row: (score, alarm). ``command`` NaN where the observation carries none."""
        state, last, advance = self._state, self._last, self.advance
        scores, alarms = [], []
        for slot, is_fresh, t, a, v, c in zip(slots, fresh, t_ns, accel, speed, command):
            if is_fresh:
                state[slot], s, alarm = advance(state[slot], t, a, v, c)
                last[slot] = (s, alarm)
            else:
                s, alarm = last[slot]
            scores.append(s)
            alarms.append(alarm)
        return scores, alarms

    def scan(
        self,
        slot: int,
        t_ns: Sequence[int] | npt.NDArray[np.int64],
        accel: Sequence[float] | npt.NDArray[np.floating[Any]],
        speed: Sequence[float] | npt.NDArray[np.floating[Any]],
        command: Sequence[float] | npt.NDArray[np.floating[Any]],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Consecutive fresh observations of one slot: (score (n,) float64, alarm (n,) bool), the
        slot left as observation-by-observation steps would leave it.

        The rule runs on each row that can have a verdict (a finite command, acceleration and speed,
        moving) and on the rows after held distrust; a stretch of the others with no distrust held
        gives no verdict and leaves only its last row's time (`advance`'s first return), so it is
        skipped in one step (a log without commands is one such stretch)."""
        t = np.asarray(t_ns, np.int64)
        a, v, c = (np.asarray(x, np.float64) for x in (accel, speed, command))
        n = len(t)
        scores, alarms = [_NAN] * n, [False] * n  # lists: a row's verdict is set in Python
        vmin = self.check.settings.min_speed
        with np.errstate(invalid="ignore"):
            verdict = np.isfinite(c) & np.isfinite(a) & np.isfinite(v) & (v >= vmin)
        quiet = ~verdict
        before = np.concatenate([[False], quiet[:-1]])
        after = np.concatenate([quiet[1:], [False]])
        starts, ends = np.flatnonzero(quiet & ~before).tolist(), (np.flatnonzero(quiet & ~after) + 1).tolist()
        times, acc, spd, cmd = t.tolist(), a.tolist(), v.tolist(), c.tolist()
        st, out, advance = self._state[slot], self._last[slot], self.advance
        i = 0
        for start, end in zip([*starts, n], [*ends, n]):  # rows start..end-1 have no verdict
            for k in range(i, start):
                st, s, alarm = advance(st, times[k], acc[k], spd[k], cmd[k])
                scores[k], alarms[k] = s, alarm
                out = (s, alarm)
            if start < end and not st[4]:  # no distrust to decay: the stretch leaves only its time
                st, out = (times[end - 1], None, 0.0, 0, st[4], 0), (_NAN, False)
                i = end
            else:  # stepped with the rows after it
                i = start
        self._state[slot], self._last[slot] = st, out
        return np.array(scores, np.float64), np.array(alarms, bool)

    def reset(self, slot: int) -> None:
        self._state[slot] = _START
        self._last[slot] = (_NAN, False)

    def state(self, slot: int) -> tuple[SlotState, tuple[float, bool]]:
        """(rule state, last verdict) of a slot (for tests)."""
        return self._state[slot], self._last[slot]


# -- fitting ------------------------------------------------------------------------------------


def _check_episodes(episodes: Sequence[ActuationEpisode], what: str) -> list[ActuationEpisode]:
    out = []
    for i, ep in enumerate(episodes):
        t = np.asarray(ep.t_ns, np.int64)
        arrays = [np.asarray(x, np.float64) for x in (ep.accel, ep.speed, ep.command)]
        if t.ndim != 1 or any(a.shape != t.shape for a in arrays):
            raise ValueError(
                f"{what} episode {i}: t_ns, accel, speed and command need one equal length, got "
                f"{[t.shape] + [a.shape for a in arrays]}"
            )
        if t.size > 1 and not np.all(np.diff(t) > 0):
            raise ValueError(f"{what} episode {i}: timestamps must strictly increase")
        out.append(ActuationEpisode(t, *arrays))
    if not out:
        raise ValueError(f"{what}: no episodes")
    return out


def _segments(ep: ActuationEpisode, settings: ActuationSettings) -> list[slice]:
    """Runs of observations the rule gives a verdict on, as it restarts them: a command, finite
    values, moving, and no gap longer than max_gap_s inside."""
    ok = np.isfinite(ep.command) & np.isfinite(ep.accel) & np.isfinite(ep.speed) & (ep.speed >= settings.min_speed)
    gap = np.concatenate([[True], np.diff(ep.t_ns) > settings.max_gap_s * 1e9])
    start = ok & (gap | ~np.concatenate([[False], ok[:-1]]))
    end = ok & (~np.concatenate([ok[1:], [False]]) | np.concatenate([start[1:], [True]]))
    return [slice(a, b + 1) for a, b in zip(np.flatnonzero(start).tolist(), np.flatnonzero(end).tolist()) if b > a]


class _Runs(NamedTuple):
    """Every run padded to one length, so the lag recursion steps all runs at once."""

    accel: np.ndarray  # (R, L)
    command: np.ndarray  # (R, L)
    dt: np.ndarray  # (R, L - 1) seconds, 0 in the padding
    valid: np.ndarray  # (R, L - 1): observation j + 1 is in the run


def _pad_runs(runs: list[tuple[ActuationEpisode, slice]]) -> _Runs:
    length = max(seg.stop - seg.start for _, seg in runs)
    r = len(runs)
    accel, command = np.zeros((r, length)), np.zeros((r, length))
    dt, valid = np.zeros((r, length - 1)), np.zeros((r, length - 1), bool)
    for i, (ep, seg) in enumerate(runs):
        n = seg.stop - seg.start
        accel[i, :n], command[i, :n] = ep.accel[seg], ep.command[seg]
        dt[i, : n - 1] = np.diff(ep.t_ns[seg]) * 1e-9
        valid[i, : n - 1] = True
    return _Runs(accel, command, dt, valid)


def _lag_terms(runs: _Runs, tau: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The measured accel a at every run's later observations, and the three parts of the expected
    accel there, which is linear in (gain, offset): e = start + gain * lag(command) + offset * lag(1),
    each run starting from its first observation (where e = a), as the rule does."""
    alpha = -np.expm1(-runs.dt / tau)
    keep = np.cumprod(1.0 - alpha, axis=1)  # share of the start value left
    lc, l1 = np.zeros_like(alpha), np.zeros_like(alpha)
    x_c, x_1 = np.zeros(len(alpha)), np.zeros(len(alpha))
    for j in range(alpha.shape[1]):
        x_c += alpha[:, j] * (runs.command[:, j + 1] - x_c)
        x_1 += alpha[:, j] * (1.0 - x_1)
        lc[:, j], l1[:, j] = x_c, x_1
    v = runs.valid
    return runs.accel[:, 1:][v], (runs.accel[:, :1] * keep)[v], lc[v], l1[v]


def fit_actuation_model(
    episodes: Sequence[ActuationEpisode],
    settings: ActuationSettings = ActuationSettings(),
    taus: Sequence[float] | None = None,
) -> ActuationModel:
    """Least squares over (tau, gain, offset): for each tau on a log grid, (gain, offset) in closed form;
    then a finer grid between the best coarse point's neighbours."""
    eps = _check_episodes(episodes, "actuation fitting")
    runs = [(ep, seg) for ep in eps for seg in _segments(ep, settings)]
    if not runs:
        raise ValueError("actuation fitting: no observations with a command while moving")
    padded = _pad_runs(runs)

    def solve(tau: float) -> tuple[float, float, float, int]:
        a, start, lc, l1 = _lag_terms(padded, tau)
        y, x = a - start, np.stack([lc, l1], axis=1)
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        resid = y - x @ coef
        return float(np.mean(resid * resid)), float(coef[0]), float(coef[1]), len(y)

    grid = np.geomspace(0.01, 2.0, 16).tolist() if taus is None else [float(t) for t in taus]
    results = {tau: solve(tau) for tau in grid}
    best = min(results, key=lambda tau: results[tau][0])
    if taus is None:
        i = grid.index(best)
        for tau in np.geomspace(grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)], 17).tolist():
            results[tau] = solve(tau)
        best = min(results, key=lambda tau: results[tau][0])
    mse, gain, offset, n = results[best]
    if n < 100:
        raise ValueError(f"actuation fitting: only {n} observations with a command while moving; need >= 100")
    return ActuationModel(tau_s=float(best), gain=gain, offset=offset, rmse=math.sqrt(mse), n=n)


def shortfall_scores(
    model: ActuationModel, settings: ActuationSettings, episodes: Sequence[ActuationEpisode]
) -> np.ndarray:
    """The rule's mean shortfall at every observation with a verdict (no threshold yet: nothing is
    confirmed or held), for calibration."""
    eps = _check_episodes(episodes, "actuation calibration")
    advance = make_rule(model, settings, _INF)
    out: list[float] = []
    for ep in eps:
        state: SlotState = _START
        for t, a, v, c in zip(ep.t_ns.tolist(), ep.accel.tolist(), ep.speed.tolist(), ep.command.tolist()):
            state, s, _ = advance(state, t, a, v, c)
            if s == s:
                out.append(s)
    return np.array(out)


def fit_actuation_check(
    train: Sequence[ActuationEpisode],
    calib: Sequence[ActuationEpisode],
    alpha: float,
    data_description: str,
    settings: ActuationSettings = ActuationSettings(),
) -> ActuationCheck:
    """Fit the actuation model on ``train``; threshold the mean shortfall on held-out ``calib`` at the
    per-observation rate ``alpha`` (split-conformal, as the gates' scores)."""
    model = fit_actuation_model(train, settings)
    scores = shortfall_scores(model, settings, calib)
    calibration = calibrate_threshold(scores, alpha, data_description)
    if not calibration.threshold > 0.0:
        raise ValueError(
            f"actuation calibration gave a threshold of {calibration.threshold}; the held-out data "
            "shows no shortfall noise at all, so it cannot be nominal driving"
        )
    return ActuationCheck(model, settings, calibration)
