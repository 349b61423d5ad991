"""The per-signal checks (ood/signals.py) on a real drive, the comma2k19 fixture (100 Hz highway driving,
a radar lead): each fires on the one-signal fault it is for and never on the clean drive, the live tick
and the vectorised replay give them byte for byte, and a check on a signal the session does not measure
is not applicable."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.gates import fault_injection as fi
from dualloop.controller.gates import real_faults as rf
from dualloop.controller.replay.lockstep import LoadedModel, SessionOptions, executor_config_for, run_replay
from dualloop.executor.snapshot import Check, CheckStatus, Reason
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES

COMMA = Path(__file__).resolve().parents[2] / "fixtures" / "comma2k19-example1.mcap"
SIGNAL_CHECKS = (
    Check.SIGNAL_STUCK,
    Check.SPEED_ACCEL,
    Check.GAP_RATE,
    Check.LEAD_FLICKER,
    Check.SPEED_REPEAT,
    Check.GAP_REPEAT,
    Check.GAP_STEP,
)
# (fault, signal, the check that must catch it, how soon after onset at the latest, s)
CASES = [
    (fi.STUCK, "ego_speed", "signal_stuck", 1.3),  # its threshold: 1.2 s of identical readings
    (fi.SPIKES, "lead_distance", "gap_rate", 1.0),  # the first spike, there and back (a quarter of the readings)
    (fi.FLICKER, "lead_present", "lead_flicker", 0.1),  # two toggles
    # the ego accelerates at 0.1-0.2 m/s^2 here: 0.1 m/s of speed change takes 0.5-1 s
    (fi.STUCK, "ego_speed", "speed_repeat", 1.0),
    (fi.STUCK, "lead_distance", "gap_repeat", 1.1),  # closing at 0.5-1.4 m/s: 0.6 m in about 1 s
    (fi.BIAS, "lead_distance", "gap_step", 0.02),  # +15 m at once, the relative speed unchanged
    (fi.UNIT, "ego_speed", "speed_accel", 0.02),  # km/h: the speed jumps, the acceleration does not
]
FIRST, STOP = 2000, 2250  # observations: 20.0-22.5 s, the ego at highway speed behind one lead


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return LoadedModel.load(BASE_MODEL_PATH, DEFAULT_GATES)


@pytest.fixture(scope="module")
def log(loaded: LoadedModel) -> rf.LoadedLog:
    return rf.LoadedLog.read(COMMA, loaded.model.card.feature_names)


@pytest.fixture(scope="module")
def clean(loaded: LoadedModel, log: rf.LoadedLog) -> rf.Verdicts:
    return rf.replay(loaded, log, log.observations)


def _faulted(log: rf.LoadedLog, episodes: list[fi.Episode]) -> list:
    for ep in episodes:
        assert fi.eligible(ep.fault, ep.signal, log.features, log.names, ep.first, ep.stop), ep
    return log.faulted(fi.inject(log.features, log.timestamps, episodes, log.names, np.random.default_rng(3)))


def test_no_signal_check_vetoes_the_clean_drive(clean: rf.Verdicts) -> None:
    for name in ("signal_stuck", "speed_accel", "gap_rate", "lead_flicker", "speed_repeat", "gap_repeat", "gap_step"):
        assert name in clean.veto, name
        assert not clean.veto[name].any(), name
        assert np.isfinite(clean.score[name]).any(), name  # it judged the drive


@pytest.mark.parametrize("fault,signal,check,within_s", CASES)
def test_each_check_fires_on_its_fault_in_a_real_drive(
    loaded: LoadedModel, log: rf.LoadedLog, clean: rf.Verdicts, fault: str, signal: str, check: str, within_s: float
) -> None:
    column = log.features[:, log.names.index(signal)] if signal in log.names else np.zeros(0)
    ep = fi.Episode(fault, signal, FIRST, STOP, fi.draw_magnitude(fault, signal, column, np.random.default_rng(0)))
    got = rf.replay(loaded, log, _faulted(log, [ep]))
    lo, hi, _ = rf._window_ticks(got.tick_ns, log, ep.first, ep)
    fired = np.flatnonzero(got.veto[check][lo:hi])
    assert fired.size, f"{check} never vetoed {fault} on {signal}"
    assert (got.tick_ns[lo + fired[0]] - got.tick_ns[lo]) / 1e9 <= within_s
    # its veto is the gate's (OOD_VETO), and before the window the drive is judged as the clean one
    assert got.veto[rf.ANY][lo + fired[0]]
    assert np.array_equal(got.veto[check][:lo], clean.veto[check][:lo])
    # the score tells the fault from the same ticks driven cleanly
    assert np.mean(got.score[check][lo:hi] > clean.score[check][lo:hi]) > 0.5


def test_live_ticks_and_the_replay_give_the_same_signal_checks(loaded: LoadedModel, log: rf.LoadedLog) -> None:
    """Every fault of CASES in one drive (the first 30 s), observation by observation through
    `advance_lockstep` (the live tick's gate step) and in one vectorised pass: the same scores, verdicts
    and statuses of the signal checks on every tick."""
    episodes = [
        fi.Episode(fi.STUCK, "ego_speed", 600, 800, 0.0),
        fi.Episode(fi.STUCK, "lead_distance", 900, 1050, 0.0),
        fi.Episode(fi.SPIKES, "lead_distance", 1100, 1300, 25.0),
        fi.Episode(fi.FLICKER, "lead_present", 1500, 1700, 0.0),
        fi.Episode(fi.UNIT, "ego_speed", 2000, 2100, fi.KMH_PER_MS),
        fi.Episode(fi.STUCK, "lead_rel_speed", 2300, 2500, 0.0),
        fi.Episode(fi.BIAS, "lead_distance", 2600, 2800, fi.BIAS_M),
    ]
    obs = _faulted(log, episodes)[:3000]
    runs = []
    for fast in (True, False):
        ex = loaded.executor(executor_config_for(log.header))
        runs.append(run_replay(ex, "s", obs, SessionOptions(provided_features=sorted(log.measured)), fast=fast)[0])
    fast_snaps, live_snaps = runs
    assert len(fast_snaps) == len(live_snaps)
    vetoed = set()
    for a, b in zip(fast_snaps, live_snaps):
        assert a.check_kinds == b.check_kinds
        at = [a.check_kinds.index(k) for k in SIGNAL_CHECKS]
        assert a.checks[at].tobytes() == b.checks[at].tobytes(), a.tick
        assert a.reasons == b.reasons, a.tick
        vetoed |= {a.check_kinds[j] for j in at if a.checks[j]["veto"]}
    assert vetoed == set(SIGNAL_CHECKS)  # the comparison covered every check's vetoes


def test_a_check_on_an_unmeasured_signal_is_not_applicable(loaded: LoadedModel, log: rf.LoadedLog) -> None:
    """A session measuring the ego speed alone: the speed's stuck check judges, the others never do."""
    at = log.names.index("ego_speed")
    obs = []
    for o in log.observations[:1500]:
        x = np.full_like(o.features, np.nan)  # not measured: NaN by contract
        x[at] = o.features[at]
        obs.append(replace(o, features=x))
    ex = loaded.executor(executor_config_for(log.header))
    snaps, _ = run_replay(ex, "s", obs, SessionOptions(provided_features=["ego_speed"]))
    kinds = snaps[0].check_kinds
    status = np.array([s.checks["status"] for s in snaps])
    stuck, *others = (kinds.index(k) for k in SIGNAL_CHECKS)
    assert (status[:, stuck] == CheckStatus.SCORED).all()
    for j in others:
        assert (status[:, j] == CheckStatus.NOT_APPLICABLE).all(), kinds[j]
        assert not any(s.checks[j]["veto"] for s in snaps)
    assert all(Reason.INVALID_INPUT not in s.reasons for s in snaps)
