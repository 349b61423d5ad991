"""End to end: fit_gate -> monitor.step per tick over session slots."""

from __future__ import annotations

import numpy as np

from dualloop import ood
from dualloop.ood.metrics import detection_delay, false_veto_rate


def _gate(
    filter_settings: ood.FilterSettings, norm_margin: float = 1.3
) -> tuple[ood.Gate, np.ndarray, np.random.Generator]:
    rng = np.random.default_rng(21)
    d = 24
    mean = 3.0 * rng.normal(size=d)
    x = mean + rng.normal(size=(12000, d))
    gate = ood.fit_gate(
        ood.FeatureRows(x[:8000]),
        ood.FeatureRows(x[8000:]),
        ood.FeatureSchema(tuple(f"f{i}" for i in range(d)), "input_features"),
        "synthetic nominal",
        ood.GateFitSettings(alpha=0.001, filter=filter_settings, norm_margin=norm_margin),
    )  # margin: nominal ticks must not hit the unfiltered guard
    return gate, mean, rng


def test_monitor_vetoes_nan_same_tick_and_confirms_a_shift_after_the_filter_delay() -> None:
    gate, mean, rng = _gate(ood.KOfNSettings(3, 5))
    n_slots, ticks, onset = 4, 60, 20
    monitor = gate.monitor(n_slots)
    alarms = np.zeros((ticks, n_slots), bool)
    for t in range(ticks):
        x = mean + rng.normal(size=(n_slots, mean.size))
        if t >= onset:
            x[1] = -mean + rng.normal(size=mean.size)  # slot 1: sustained OOD from the onset
        if t == 30:
            x[2, 0] = np.nan  # slot 2: one bad packet
        if t == 40:
            x[3] = 0.0  # slot 3: one all-zero sensor frame
        step = monitor.step(x.astype(np.float32))
        alarms[t] = step.alarm
        if t == 30:
            assert step.flags.nonfinite[2] and np.isposinf(step.score[2])
    assert detection_delay(alarms[:, 1], onset) == 2  # k - 1 ticks, as documented
    assert np.flatnonzero(alarms[:, 2]).tolist() == [30]  # same tick, and gone the next
    assert np.flatnonzero(alarms[:, 3]).tolist() == [40]
    assert not alarms[:, 0].any()


def test_monitor_with_slot_subset_and_reset() -> None:
    gate, mean, rng = _gate(ood.CusumSettings(h=2.0, down=0.5))
    monitor = gate.monitor(8)
    ood_row = (-mean)[None, :]
    slots = np.array([5])
    assert not monitor.step(ood_row, slots).alarm[0]
    assert monitor.step(ood_row, slots).alarm[0]  # ceil(2) - 1 = 1 tick delay
    monitor.reset(5)
    assert not monitor.step(ood_row, slots).alarm[0]


def test_filtered_false_veto_rate_on_nominal_data_is_far_below_alpha() -> None:
    gate, mean, rng = _gate(ood.KOfNSettings(2, 3), norm_margin=1.0)
    monitor = gate.monitor(16)
    steps = [monitor.step(mean + rng.normal(size=(16, mean.size))) for _ in range(2000)]
    alarms = np.array([s.alarm for s in steps]).ravel()
    exceed = np.array([s.flags.exceed for s in steps]).ravel()
    norm_hits = np.array([s.flags.norm_out for s in steps]).ravel()
    assert exceed.sum() > 10  # raw exceedances happen at ~alpha per row-tick ...
    assert not (alarms & ~norm_hits).any()  # ... but none survives the 2-of-3 filter
    rate = false_veto_rate(alarms, 0.005)["per_tick"]
    assert rate == norm_hits.mean() < 4 * gate.norm_band.alpha  # what is left is the unfiltered guard
    assert gate.nominal_veto_rate()["filtered_score"] < 1e-5


def test_norm_margin_widens_band_and_keeps_gross_faults_out() -> None:
    tight, mean, rng = _gate(ood.KOfNSettings(), norm_margin=1.0)
    wide, _, _ = _gate(ood.KOfNSettings(), norm_margin=1.3)
    assert wide.norm_band.low == tight.norm_band.low / 1.3 and wide.norm_band.high == tight.norm_band.high * 1.3
    assert wide.norm_band.empirical_rate == 0.0 < tight.norm_band.empirical_rate
    x = mean + rng.normal(size=(4, mean.size))
    x *= np.array([[0.0], [0.3], [1.0], [3.0]])  # dropped, attenuated, nominal, saturated
    assert wide.scorer().score(x)[1].norm_out.tolist() == [True, True, False, True]
