"""The per-signal checks' C update (ood/_signals.c, chosen by ood.signals) gives the bits of the Python
reference (`SignalMonitor._update`) on random streams with every kind of fault, on real drives, at
sensor rates whose windows fill their 1,024 places, and through a live tick's rows with held
observations, several slots and sensor profiles; the comparison itself fails on a one-ulp difference."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.contract.wire import observation_from_proto
from dualloop.controller.gates.real_logs import load_real_dir
from dualloop.controller.logs.format import sensor_profile
from dualloop.controller.logs.logfile import read_log
from dualloop.ood import signals
from dualloop.ood.signal_settings import CHECKS, SignalSettings
from dualloop.ood.signals import SignalMonitor

pytestmark = pytest.mark.skipif(not signals.compiled_available(), reason="ood._signals did not build (no C compiler)")

NAMES = ["ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed", "yaw_rate"]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def both(n_slots: int = 1, settings: SignalSettings | None = None, names: list[str] = NAMES):
    s = settings or SignalSettings()
    python, compiled = SignalMonitor(n_slots, s, names, compiled=False), SignalMonitor(n_slots, s, names, compiled=True)
    assert not python.is_compiled and compiled.is_compiled
    return python, compiled


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit for bit (NaN included), not within a tolerance."""
    a, b = np.ascontiguousarray(a, np.float64), np.ascontiguousarray(b, np.float64)
    return a.shape == b.shape and bool(np.array_equal(a.view(np.int64), b.view(np.int64)))


def faulty_stream(rng: np.random.Generator, n: int, period_ns: int = 10_000_000) -> tuple[np.ndarray, np.ndarray]:
    """(x, times): a car following a lead with sensor noise, jittered and paused times, and five faults
    of random kinds on random signals (stuck, bias, spikes, dropouts, km/h, a flipped sign, a gap of 0)."""
    steps = rng.choice([period_ns, 2 * period_ns, 10 * period_ns, 60 * period_ns], n, p=[0.75, 0.15, 0.08, 0.02])
    times = np.cumsum(steps).astype(np.int64)
    speed = 12.0 + np.cumsum(rng.normal(0, 0.05, n))
    x = np.zeros((n, len(NAMES)), np.float32)
    x[:, 0], x[:, 1] = speed, rng.normal(0, 1.0, n)
    x[:, 2] = (rng.random(n) > 0.03).astype(np.float32)
    x[:, 3], x[:, 4] = 30.0 + np.cumsum(rng.normal(0, 0.3, n)), rng.normal(-1.0, 2.0, n)
    for _ in range(5):
        a, b = sorted(rng.integers(0, n, 2))
        col = int(rng.integers(0, 5))
        kind = int(rng.integers(0, 7))
        if kind == 0:
            x[a:b, col] = x[a, col]
        elif kind == 1:
            x[a:b, col] += rng.normal(0, 20.0)
        elif kind == 2:
            x[a:b, col] = np.nan
        elif kind == 3:
            x[a:b, 4] *= 3.6
        elif kind == 4:
            x[a:b, 4] *= -1.0
        elif kind == 5:
            x[a:b, 3] = 0.0
        else:
            x[a : a + 2, col] += 50.0  # a spike
    return x, times


@pytest.mark.parametrize("seed", range(6))
def test_compiled_equals_python_on_random_faulty_streams(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(20):
        x, times = faulty_stream(rng, 400)
        python, compiled = both()
        assert same_bits(python.scan(x, 0, times), compiled.scan(x, 0, times))


def test_compiled_equals_python_where_the_windows_fill() -> None:
    """A 10 kHz stream: each window holds more than 1,024 readings, and the oldest leaves as one comes
    (as the deques' maxlen), so the long windows give no verdict on both paths alike."""
    rng = np.random.default_rng(7)
    x, _ = faulty_stream(rng, 4000)
    times = np.arange(1, 4001, dtype=np.int64) * 100_000
    python, compiled = both()
    a, b = python.scan(x, 0, times), compiled.scan(x, 0, times)
    assert same_bits(a, b)
    assert np.isnan(a[2000:, CHECKS.index("speed_accel")]).all()  # the 0.5 s window never spans 0.5 s


def test_compiled_equals_python_on_live_ticks_with_held_rows_and_profiles() -> None:
    """`step` over several slots, some rows held (not fresh), one session without a lead radar, one slot
    reset halfway: the scores and the veto flags are the Python path's."""
    rng = np.random.default_rng(11)
    streams = [faulty_stream(rng, 300) for _ in range(4)]
    python, compiled = both(n_slots=6)
    radarless = np.array([n not in ("lead_distance", "lead_rel_speed") for n in NAMES])
    for mon in (python, compiled):
        mon.set_present(4, radarless)
    slots = [5, 0, 4, 2]
    vetoed = 0
    for k in range(300):
        x = np.stack([s[0][k] for s in streams])
        times = [int(s[1][k]) for s in streams]
        fresh = (rng.random(4) > 0.25).tolist()
        if k == 150:
            python.reset(0), compiled.reset(0)
        veto_p, veto_c = [False] * 4, [False] * 4
        rows_p = python.step(x, slots, fresh, times, veto_p)
        rows_c = compiled.step(x, slots, fresh, times, veto_c)
        assert same_bits(np.array(rows_p), np.array(rows_c)), k
        assert veto_p == veto_c, k
        vetoed += sum(veto_c)
    assert vetoed > 0  # the faults vetoed: the flags were compared where they matter


@pytest.mark.parametrize("name", ["comma2k19-example1.mcap", "real-drives/openacc-astazero-human"])
def test_compiled_equals_python_on_real_drives(name: str, tmp_path: Path) -> None:
    folder = FIXTURES / name
    paths = [folder] if folder.suffix == ".mcap" else list(load_real_dir(folder, tmp_path).logs)
    for path in paths:
        data = read_log(path)
        obs = [observation_from_proto(m, 0) for m in data.observations]
        x = np.array([o.features for o in obs], np.float64)
        times = np.array([o.timestamp_ns for o in obs], np.int64)
        names = list(data.header.feature_names)
        python, compiled = both(names=names)
        profile = sensor_profile(data.header)
        if profile is not None:
            for mon in (python, compiled):
                mon.set_present(0, np.array([n in profile for n in names]))
        assert same_bits(python.scan(x, 0, times), compiled.scan(x, 0, times)), path


def test_compiled_equals_python_for_other_settings_and_schemas() -> None:
    """Every setting reaches the C update (a changed one changes both paths alike), and a schema without
    some signals reads them as NaN."""
    rng = np.random.default_rng(5)
    x, times = faulty_stream(rng, 500)
    tight = SignalSettings(
        moving_speed=0.5, gap_jump_m=3.0, gap_floor_m=0.5, new_lead_rel_jump=0.5, gap_step_max_m=20.0,
        rel_span_s=0.02, rel_floor_m_s2=1.0, rel_unit_tolerance=0.3, rel_unit_m_s=0.2, stuck_s=0.3,
        speed_window_s=0.2, flicker_window_s=3.0, max_gap_s=0.2, gap_window_s=0.4, step_hold_s=1.0,
        prior_keep_s=1.0, step_confirm_s=0.1, hold_s=0.2, rel_sign_window_s=0.5,
    )  # fmt: skip
    python, compiled = both(settings=tight)
    a = python.scan(x, 0, times)
    assert same_bits(a, compiled.scan(x, 0, times))
    assert not same_bits(a, both()[1].scan(x, 0, times))  # the settings changed the verdicts
    names = ["ego_speed", "lead_present", "lead_distance"]  # no acceleration, no relative speed
    python, compiled = both(names=names)
    y = x[:, [0, 2, 3]]
    assert same_bits(python.scan(y, 0, times), compiled.scan(y, 0, times))


def test_the_comparison_fails_on_a_one_ulp_difference() -> None:
    rng = np.random.default_rng(1)
    x, times = faulty_stream(rng, 200)
    a = both()[1].scan(x, 0, times)
    b = a.copy()
    k = np.argwhere(np.isfinite(b) & (b != 0))[0]
    b[tuple(k)] = np.nextafter(b[tuple(k)], np.inf)
    assert not same_bits(a, b)


def test_the_module_refuses_what_it_cannot_read() -> None:
    mon = SignalMonitor(2, SignalSettings(), NAMES, compiled=True)
    checks = mon._checks
    good = np.zeros((1, 5))
    with pytest.raises(TypeError, match="float64"):
        checks.step(good.astype(np.float32), [0], [True], [1], None)
    with pytest.raises(ValueError, match="one item per row"):
        checks.step(good, [0, 1], [True], [1], None)
    with pytest.raises(IndexError, match="slot 2"):
        checks.step(good, [2], [True], [1], None)
    with pytest.raises(ValueError, match="same rows"):
        checks.scan(good, 0, np.zeros(2, np.int64), np.empty((2, 10)))
    with pytest.raises(ValueError, match="five truths"):
        checks.measure(0, (True, True))
    with pytest.raises(TypeError, match="veto"):
        checks.step(good, [0], [True], [1], np.zeros(1, bool))
    settings, nanos = mon._compiled_settings(), mon._compiled_nanos()
    with pytest.raises(ValueError, match="settings: expected 13 values"):
        type(checks)(1, settings[:-1], nanos, mon.thresholds)
    with pytest.raises(TypeError, match="nanos: expected a sequence of 9 numbers"):
        type(checks)(1, settings, 5, mon.thresholds)


def test_the_compiled_update_is_built_and_in_use_where_a_compiler_exists(c_compiler: str | None) -> None:
    if c_compiler is None:
        pytest.skip("no C compiler here: the Python path is the one installed")
    if os.environ.get("DUALLOOP_SIGNALS_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("DUALLOOP_SIGNALS_PURE_PYTHON asks for the Python path")
    assert SignalMonitor(1, SignalSettings(), NAMES).is_compiled


def test_the_environment_variable_asks_for_the_python_path() -> None:
    code = (
        "from dualloop.ood.signals import SignalMonitor, SignalSettings;"
        "print(SignalMonitor(1, SignalSettings(), ['ego_speed']).is_compiled)"
    )
    env = {**os.environ, "DUALLOOP_SIGNALS_PURE_PYTHON": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
