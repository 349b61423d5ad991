"""The compiled path (ood/_tick.c, chosen by ood.compiled) decides exactly as the pure-Python one,
which stays the reference: the same score bits, thresholds, alarms, filter states, changes and freeze
counts, on rows of every kind (nominal, far, all-zero, out of range, NaN, Inf, overflowing, tiny),
every gate variant and filter kind, and zero thresholds. The comparison itself is shown to fail on
a one-ulp difference. And where a C compiler exists, the module must have built and be in use, so a
bench or CI run never measures the fallback without saying so."""

from __future__ import annotations

import os

import numpy as np
import pytest

from dualloop.ood import (
    ChangeTracker,
    CusumSettings,
    FreezeDetector,
    GateBank,
    GateMonitor,
    KOfNSettings,
    blas,
    make_filter,
)
from dualloop.ood import compiled as ood_compiled
from dualloop.ood.score import GateScorer
from tests.ood.test_one_row import _range, _row, _stats

needs_compiled = pytest.mark.skipif(not ood_compiled.available(), reason="ood._tick did not build (no C compiler)")


def _path(compiled: bool):  # noqa: ANN202 - a context manager
    class _Use:
        def __enter__(self) -> None:
            self.before = ood_compiled.use_compiled(compiled)

        def __exit__(self, *exc: object) -> None:
            ood_compiled.use_compiled(self.before)

    return _Use()


def test_the_compiled_module_is_built_and_in_use_where_a_compiler_exists(c_compiler: str | None) -> None:
    if c_compiler is None:
        pytest.skip("no C compiler here: the pure-Python path is the one installed")
    if os.environ.get("DUALLOOP_GATE_PURE_PYTHON", "") not in ("", "0"):
        pytest.skip("DUALLOOP_GATE_PURE_PYTHON asks for the pure-Python path")
    assert ood_compiled.available(), "a C compiler exists but ood._tick did not build: reinstall (pip install -e .)"
    rng = np.random.default_rng(0)
    stats = _stats(rng, 8, "single")
    bank = GateBank([GateMonitor(GateScorer(stats, 1.0), make_filter(KOfNSettings(), 2))], 2)
    assert bank.compiled and ChangeTracker(2, 8).is_compiled and FreezeDetector(2, 8).is_compiled
    assert bank.products_in_c is (blas.find() is not None)
    with _path(False):
        assert not GateBank([GateMonitor(GateScorer(stats, 1.0), make_filter(KOfNSettings(), 2))], 2).compiled
        assert not ChangeTracker(2, 8).is_compiled and not FreezeDetector(2, 8).is_compiled


class _Counting:
    """Delegates to a compiled kernel, counting the ticks it decided itself."""

    def __init__(self, kernel: object) -> None:
        self.kernel, self.decided = kernel, 0
        self.blas = kernel.blas

    def _count(self, out: object) -> object:
        self.decided += out is not None and out is not NotImplemented
        return out

    def step(self, *args: object) -> object:
        return self._count(self.kernel.step(*args))

    def decide(self, *args: object) -> object:
        return self._count(self.kernel.decide(*args))


def _bank(stats: list, ranges: list, thresholds: list[float], filters: list, n_slots: int, compiled: bool) -> GateBank:
    with _path(compiled):
        monitors = [
            GateMonitor(
                GateScorer(
                    s, t, 0.2 * float(np.linalg.norm(s.center)), 5.0 * float(np.linalg.norm(s.center)), n_slots, r
                ),
                make_filter(f, n_slots),
            )
            for s, r, t, f in zip(stats, ranges, thresholds, filters)
        ]
        return GateBank(monitors, n_slots)


def _setup(
    variants: tuple[str, ...], zero_threshold: bool, seed: int, n_slots: int = 3
) -> tuple[list, list, GateBank, GateBank]:
    rng = np.random.default_rng(seed)
    dims = [19, 64, 7, 12][: len(variants)]
    stats = [_stats(rng, d, v) for d, v in zip(dims, variants)]
    ranges = [_range(rng, s, 3) if g % 2 == 0 else None for g, s in enumerate(stats)]
    filters = [KOfNSettings(2, 4), CusumSettings(2.0, 0.5, cap=4.0), KOfNSettings(3, 5), CusumSettings(3.0, 1.0)]
    thresholds = [
        float(np.quantile(GateScorer(s).score(s.center[None] + rng.normal(size=(200, s.dim)) * 0.05)[0], 0.9))
        for s in stats
    ]
    if zero_threshold:  # the ranking's IEEE division by zero, and a gate that exceeds on every positive score
        thresholds[-1] = 0.0
    return (
        stats,
        ranges,
        _bank(stats, ranges, thresholds, filters, n_slots, True),
        _bank(stats, ranges, thresholds, filters, n_slots, False),
    )


def _first_difference(
    fast: GateBank, reference: GateBank, stats: list, ranges: list, ticks: int, seed: int
) -> int | None:
    """Drive both banks with the same random one-row ticks; the first tick where they differ in any bit
    (score, threshold, alarm, any filter's state), else None."""
    rng = np.random.default_rng(seed)
    kinds = [0] * 10 + [1, 1, 2, 3, 4, 5, 6, 7]
    for tick in range(ticks):
        slot = int(rng.integers(fast.n_slots))
        rows = [_row(rng, s, kinds[rng.integers(len(kinds))] if rng.random() < 0.5 else 0)[None] for s in stats]
        rows = [r.astype(np.float32 if rng.random() < 0.5 else np.float64) for r in rows]
        nan_rows = None
        if any(not np.isfinite(r).all() for r in rows):
            if rng.random() < 0.5:
                nan_rows = np.array([True])
            else:
                rows = [np.where(np.isinf(r), np.nan, r) for r in rows]
        changes = [
            None if ranges[g] is None else rng.normal(size=(1, s.dim)) * (1.0 if rng.random() < 0.9 else 5.0)
            for g, s in enumerate(stats)
        ]
        if rng.random() < 0.5:
            changes = [None if c is None else c.tolist() for c in changes]  # as ChangeTracker gives them
        context = [
            None if ranges[g] is None else rng.uniform(-1.2, 1.2, size=(1, 3)).astype(np.float32)
            for g in range(len(stats))
        ]
        changes = None if rng.random() < 0.2 else changes
        context = None if rng.random() < 0.2 else context
        also = [bool(rng.random() < 0.05)] if rng.random() < 0.5 else None
        with np.errstate(all="ignore"):
            a = fast.step([slot], rows, nan_rows, also, changes, context)
            b = reference.step([slot], rows, nan_rows, also, changes, context)
        if (
            a.score.tobytes() != b.score.tobytes()
            or a.threshold.tobytes() != b.threshold.tobytes()
            or a.alarm.tolist() != b.alarm.tolist()
            or any(f.filter.slot_states != r.filter.slot_states for f, r in zip(fast.monitors, reference.monitors))
        ):
            return tick
    return None


@needs_compiled
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize(
    "variants", [("single", "single"), ("single", "tied", "relative", "single"), ("relative", "tied")]
)
@pytest.mark.parametrize("zero_threshold", [False, True])
@pytest.mark.parametrize("products", ["C", "numpy"])
def test_compiled_decisions_equal_pure_python_bit_for_bit(
    variants: tuple[str, ...], zero_threshold: bool, products: str
) -> None:
    stats, ranges, fast, reference = _setup(variants, zero_threshold, seed=11)
    assert fast.compiled and not reference.compiled
    one = fast._one_row
    if products == "numpy":  # numpy's calls (on rows widened in C) make the products, Kernel.decide the rest
        one.use_kernel(ood_compiled.module().Kernel(*one.kernel_args()))
    elif not one.one_call:
        pytest.skip("numpy's BLAS routines were not found: numpy makes the products")
    counting = _Counting(one._kernel)
    one.use_kernel(counting)
    assert one.one_call is (products == "C")
    assert _first_difference(fast, reference, stats, ranges, 800, seed=5) is None
    assert counting.decided > 300  # the compiled kernel decided most ticks itself, not the fallbacks


@needs_compiled
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("where", ["decisions", "products"])
def test_the_comparison_fails_on_a_one_ulp_difference(where: str) -> None:
    """A kernel whose first gate's ||c W||^2 (or, making the products itself, one entry of its
    whitening) is one ulp off must be caught: the test above can fail."""
    stats, ranges, fast, reference = _setup(("single", "single"), False, seed=11)
    one = fast._one_row
    n_linear, tail, gates = one.kernel_args()
    blas = one.blas_args
    if where == "decisions":
        gates[0] = (float(np.nextafter(gates[0][0], np.inf)),) + gates[0][1:]
    else:
        if blas is None:
            pytest.skip("numpy's BLAS routines were not found: numpy makes the products")
        proj, wide, out = blas[4][0]
        proj = proj.copy()
        w = fast.scorer.width  # where x W's block starts
        proj[0, w] = np.nextafter(proj[0, w], np.inf)
        blas = (*blas[:4], [(proj, wide, out)] + list(blas[4][1:]))
    one.use_kernel(ood_compiled.module().Kernel(n_linear, tail, gates, blas))
    assert _first_difference(fast, reference, stats, ranges, 400, seed=5) is not None


@needs_compiled
def test_the_products_are_made_in_c_where_numpys_blas_is_found() -> None:
    """numpy's wheels ship the OpenBLAS ood.blas looks for; the tick is then one C call, with numpy's bits
    (checked when the kernel is built, and by the comparisons above)."""

    stats, _, fast, _ = _setup(("single", "relative"), False, seed=3)
    assert fast._one_row.one_call is (blas.find() is not None)
    if blas.find() is None:
        pytest.skip("this numpy's BLAS is not one ood.blas knows: numpy makes the products")


@needs_compiled
def test_kernel_leaves_what_it_cannot_read_to_python_before_moving_a_filter() -> None:
    stats, ranges, fast, _ = _setup(("single", "single"), False, seed=2)
    one = fast._one_row
    rows = [s.center[None].copy() for s in stats]
    for src, (proj, _, out) in zip(rows, one._products):  # what OneRowTick.step has numpy do first
        src.dot(proj, out=out)
    np.vecdot(one._blocks, one._blocks, out=one._squares)
    assert one._kernel.decide(0, rows, None, None, None) is not NotImplemented  # a clean row: decided
    for m in fast.monitors:
        m.filter.slot_states[0] = m.filter.zero
    odd_changes = [[[1.0] * (stats[0].dim - 1)], None]  # a change row shorter than its limits
    assert one._kernel.decide(0, rows, None, odd_changes, None) is NotImplemented
    assert one._kernel.decide(0, rows, None, [np.zeros((1, stats[0].dim), np.int64), None], None) is NotImplemented
    assert [m.filter.slot_states[0] for m in fast.monitors] == [m.filter.zero for m in fast.monitors]


def _rows_bits(rows: list) -> list[bytes]:
    return [np.array(r, np.float64).tobytes() for r in rows]


@needs_compiled
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_change_tracker_compiled_equals_python(dtype: type) -> None:
    rng = np.random.default_rng(4)
    dim, n_slots = 6, 4
    with _path(True):
        fast = ChangeTracker(n_slots, dim)
    with _path(False):
        reference = ChangeTracker(n_slots, dim)
    now = 1_700_000_000_000_000_000
    for tick in range(600):
        n = int(rng.integers(1, n_slots + 1))
        slots = rng.permutation(n_slots)[:n].tolist()
        x = (rng.normal(size=(n, dim)) * 10.0).astype(np.float32)
        x[rng.random(size=(n, dim)) < 0.03] = np.nan
        x[rng.random(size=(n, dim)) < 0.01] = np.inf
        fresh = (rng.random(n) < 0.7).tolist()
        finite = np.isfinite(x).all(axis=1).tolist()
        # irregular sensor clocks at 10-200 Hz; now and then a repeated or earlier timestamp (no rate)
        now += int(rng.integers(5_000_000, 100_000_000))
        times = [now - int(rng.integers(0, 3_000_000)) for _ in slots]
        if rng.random() < 0.05:
            times[0] -= 200_000_000
        if rng.random() < 0.05:
            fast.reset(slots[0])
            reference.reset(slots[0])
        a = fast.step(x.astype(dtype), slots, fresh, finite, times)
        b = reference.step(x.astype(dtype), slots, fresh, finite, times)
        assert _rows_bits(a) == _rows_bits(b), tick
        (last_a, t_a, change_a), (last_b, t_b, change_b) = fast.state, reference.state
        assert change_a.tobytes() == change_b.tobytes() and t_a == t_b, tick
        assert [None if v is None else np.array(v).tobytes() for v in last_a] == [
            None if v is None else np.array(v).tobytes() for v in last_b
        ], tick


@needs_compiled
@pytest.mark.parametrize("rest", [None, (1, 0.125)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_freeze_detector_compiled_equals_python(dtype: type, rest: tuple[int, float] | None) -> None:
    """The same alarms and counts, with and without the rest rule, on slots that compare every feature
    or only a sensor profile's (the others NaN), with stretches at rest on and around its limit."""
    rng = np.random.default_rng(8)
    dim, n_slots = 5, 3
    with _path(True):
        fast = FreezeDetector(n_slots, dim, 2, rest)
    with _path(False):
        reference = FreezeDetector(n_slots, dim, 2, rest)
    profiles = [None, np.array([True, True, False, True, False]), np.array([False, False, True, True, True])]
    held = rng.normal(size=(n_slots, dim)).astype(np.float32)
    most = rested = 0
    for tick in range(900):
        n = int(rng.integers(1, n_slots + 1))
        slots = rng.permutation(n_slots)[:n].tolist()
        x = rng.normal(size=(n, dim)).astype(np.float32)
        for r, slot in enumerate(slots):
            if rng.random() < 0.5:  # a stuck sensor repeats itself, NaN included
                x[r] = held[slot]
            elif rng.random() < 0.1:
                x[r, rng.integers(dim)] = np.nan
                held[slot] = x[r]
            elif rng.random() < 0.2:  # at rest, or just above it
                held[slot, 1] = rng.choice([0.0, -0.0, 0.125, -0.125, 0.1250001, 0.2])
                x[r] = held[slot]
        fresh = (rng.random(n) < 0.8).tolist()
        if rng.random() < 0.03:
            fast.reset(slots[0])
            reference.reset(slots[0])
        if rng.random() < 0.02:
            present = profiles[int(rng.integers(len(profiles)))]
            fast.set_present(slots[0], present)
            reference.set_present(slots[0], present)
        assert fast.step(x.astype(dtype), slots, fresh) == reference.step(x.astype(dtype), slots, fresh), tick
        (last_a, count_a), (last_b, count_b) = fast.state, reference.state
        assert last_a.tobytes() == last_b.tobytes() and count_a.tolist() == count_b.tolist(), tick
        most = max(most, *count_b.tolist())
        rested += rest is not None and bool(np.any(np.abs(x[:, 1]) == 0.125))
    assert most >= 2  # freezes did happen
    assert rest is None or rested > 20  # and repeats at rest


@pytest.mark.slow
def test_executor_ticks_equal_on_both_paths() -> None:
    """The shipped model and gates, one and three sessions, nominal rows with faults injected: every
    snapshot's gate score bits, threshold, veto, reasons and applied action agree between the paths."""
    from dualloop.controller.contract.gate_files import load_gate_for_model
    from dualloop.controller.gates.fitting import nominal_inputs
    from dualloop.executor.config import ExecutorConfig
    from dualloop.executor.core import Executor
    from dualloop.executor.model_runner import DecisionModel
    from dualloop.executor.snapshot import Observation
    from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES

    model = DecisionModel(BASE_MODEL_PATH)
    gates = [load_gate_for_model(g, model) for g in DEFAULT_GATES]
    rows = nominal_inputs([3], every=1, scenarios=("nominal_cruise",), noise=None)[0]
    accel_at = model.card.feature_names.index("ego_accel")
    rng = np.random.default_rng(1)
    for sessions in (1, 3):
        executors = []
        for compiled in (True, False):
            with _path(compiled):
                ex = Executor(model, ExecutorConfig(max_sessions=sessions), gates)
            for i in range(sessions):
                ex.open_session(f"s{i}")
            executors.append(ex)
        assert executors[1].gating.bank.compiled is False
        assert executors[0].gating.bank.compiled is ood_compiled.available()
        stuck = None
        for k in range(500):
            obs = {}
            for i in range(sessions):
                x = rows[(k + 97 * i) % len(rows)].copy()
                fault = rng.random()
                if fault < 0.03:
                    x[rng.integers(len(x))] = np.nan
                elif fault < 0.06:
                    x = x * 50.0
                elif fault < 0.08:
                    x[:] = 0.0
                elif fault < 0.15:
                    stuck = x if stuck is None else stuck
                    x = stuck.copy()
                if rng.random() < 0.2 and k:
                    continue  # no fresh observation for this session this tick
                obs[f"s{i}"] = x
            snaps = [
                ex.step(
                    {
                        sid: Observation(
                            seq=k + 1,
                            timestamp_ns=k * 5_000_000,
                            features=x,
                            actual_controls=np.array([x[accel_at], 0.0], np.float32),
                        )
                        for sid, x in obs.items()
                    },
                    now_ns=k * 5_000_000,
                )
                for ex in executors
            ]
            for a, b in zip(*snaps):
                assert np.float64(a.gate_score).tobytes() == np.float64(b.gate_score).tobytes(), (sessions, k)
                assert (a.gate_threshold, a.gate_veto, a.reasons, a.safety_state, a.applied.index) == (
                    b.gate_threshold,
                    b.gate_veto,
                    b.reasons,
                    b.safety_state,
                    b.applied.index,
                ), (sessions, k)
