"""Sequential filters: exact step delays, spike rejection, same-tick bypass, per-slot state."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.ood.filter import CusumFilter, CusumSettings, KOfNFilter, KOfNSettings, make_filter
from dualloop.ood.metrics import detection_delay


def _run(filt, trace: np.ndarray, immediate: np.ndarray | None = None) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Feed a (ticks, slots) exceedance trace; return the (ticks, slots) alarms."""
    out = []
    for t in range(trace.shape[0]):
        imm = None if immediate is None else immediate[t]
        out.append(filt.update(trace[t], immediate=imm))
    return np.array(out)


def _step(ticks: int, onset: int) -> np.ndarray:
    e = np.zeros((ticks, 1), bool)
    e[onset:] = True
    return e


@pytest.mark.parametrize("k,n", [(1, 1), (2, 3), (3, 5), (4, 4), (5, 10)])
def test_k_of_n_step_delay_is_k_minus_one(k: int, n: int) -> None:
    settings = KOfNSettings(k, n)
    alarms = _run(KOfNFilter(settings, 1), _step(40, 12))[:, 0]
    assert not alarms[:12].any()
    assert detection_delay(alarms, 12) == k - 1 == settings.step_delay_ticks()
    assert alarms[12 + k - 1 :].all()


@pytest.mark.parametrize("h,expected", [(1.0, 0), (2.0, 1), (2.5, 2), (3.0, 2), (6.0, 5)])
def test_cusum_step_delay_is_ceil_h_minus_one(h: float, expected: int) -> None:
    settings = CusumSettings(h=h, down=0.3)
    alarms = _run(CusumFilter(settings, 1), _step(40, 7))[:, 0]
    assert detection_delay(alarms, 7) == expected == settings.step_delay_ticks()
    assert not alarms[:7].any() and alarms[7 + expected :].all()


@pytest.mark.parametrize(
    "filt",
    [
        KOfNFilter(KOfNSettings(2, 4), 1),
        KOfNFilter(KOfNSettings(3, 5), 1),
        CusumFilter(CusumSettings(h=2.0, down=0.5), 1),
    ],
)
def test_isolated_single_tick_spikes_never_alarm(filt) -> None:  # type: ignore[no-untyped-def]
    trace = np.zeros((200, 1), bool)
    trace[::5] = True  # one spike every 5 ticks, i.e. never 2 within a 4-window
    assert not _run(filt, trace).any()


def test_release_after_step_ends_matches_documented_ticks() -> None:
    for settings in (KOfNSettings(3, 5), CusumSettings(h=3.0, down=0.5), CusumSettings(h=3.0, down=0.5, cap=5.0)):
        trace = np.zeros((60, 1), bool)
        trace[10:30] = True
        alarms = _run(make_filter(settings, 1), trace)[:, 0]
        clear = np.flatnonzero(~alarms[30:])[0]  # clean ticks until the alarm dropped
        assert clear + 1 == settings.release_ticks(), settings


def test_immediate_rows_alarm_in_the_same_tick_through_any_filter() -> None:
    for filt in (KOfNFilter(KOfNSettings(3, 5), 3), CusumFilter(CusumSettings(h=4.0), 3)):
        exceed = np.array([True, False, False])
        immediate = np.array([False, True, False])
        assert filt.update(exceed, immediate=immediate).tolist() == [False, True, False]


def test_slots_are_independent_and_reset_clears_one_slot() -> None:
    filt = KOfNFilter(KOfNSettings(2, 3), 4)
    on = np.array([True, True])
    assert filt.update(on, slots=np.array([1, 3])).tolist() == [False, False]
    assert filt.update(on, slots=np.array([3, 1])).tolist() == [True, True]  # order follows slots
    assert filt.update(np.array([False, False, False, False])).tolist() == [False, True, False, True]
    filt.reset(1)
    assert filt.update(np.array([True, False, False, False])).tolist() == [False, False, False, False]
    cus = CusumFilter(CusumSettings(h=2.0), 2)
    cus.update(np.array([True, True]))
    cus.reset(0)
    assert cus.update(np.array([True, True])).tolist() == [False, True]
    with pytest.raises(ValueError, match="2 exceedances for 4 slots"):
        filt.update(on)


def test_settings_validation_and_false_alarm_probability() -> None:
    with pytest.raises(ValueError):
        KOfNSettings(4, 3)
    with pytest.raises(ValueError):
        CusumSettings(h=0.5)
    p = KOfNSettings(3, 5).false_alarm_probability(1e-3)
    assert p == pytest.approx(10 * 1e-9, rel=0.01)
    # Monte Carlo check of the marginal formula at a visible rate.
    rng = np.random.default_rng(0)
    trace = rng.random((20000, 1)) < 0.2
    rate = _run(KOfNFilter(KOfNSettings(2, 3), 1), trace)[3:].mean()
    assert rate == pytest.approx(KOfNSettings(2, 3).false_alarm_probability(0.2), abs=0.01)
