"""Scorer hot path: NaN/Inf vetoes, the norm guard, dtype and batch independence."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.ood.calibrate import FeatureRange
from dualloop.ood.fit import fit_statistics, raw_norms
from dualloop.ood.mahalanobis import _VECTORISED_FROM, GateScorer


@pytest.fixture(scope="module")
def setup() -> tuple[GateScorer, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(10)
    d = 32
    mean = 2.0 * rng.normal(size=d)
    train = mean + rng.normal(size=(3000, d))
    norms = raw_norms(train)
    scorer = GateScorer(
        fit_statistics(train), threshold=60.0, norm_low=float(norms.min()) * 0.9, norm_high=float(norms.max()) * 1.1
    )
    test = mean + rng.normal(size=(16, d))
    return scorer, test, mean


def test_nan_and_inf_rows_veto_without_disturbing_other_rows(setup) -> None:  # type: ignore[no-untyped-def]
    scorer, test, _ = setup
    clean, clean_flags = scorer.score(test)
    dirty = test.copy()
    dirty[3, 5] = np.nan
    dirty[7, 0] = np.inf
    dirty[9, :] = -np.inf
    d2, flags = scorer.score(dirty)
    bad = np.zeros(len(test), bool)
    bad[[3, 7, 9]] = True
    assert np.array_equal(flags.nonfinite, bad)
    assert np.isposinf(d2[bad]).all()
    assert flags.exceed[bad].all() and flags.immediate[bad].all()
    np.testing.assert_array_equal(d2[~bad], clean[~bad])  # other rows bit-identical
    assert not flags.norm_out.any() and not clean_flags.nonfinite.any()


def test_all_zero_vector_is_caught_by_norm_guard_even_with_open_band(setup) -> None:  # type: ignore[no-untyped-def]
    scorer, test, _ = setup
    x = test[:4].copy()
    x[2] = 0.0
    d2, flags = scorer.score(x)
    assert flags.norm_out.tolist() == [False, False, True, False]
    assert np.isfinite(d2).all() and not flags.nonfinite.any()
    open_band = GateScorer(scorer.stats, norm_low=0.0, norm_high=np.inf)  # uncalibrated
    assert open_band.score(np.zeros((1, x.shape[1])))[1].norm_out.tolist() == [True]


def test_attenuated_or_amplified_vector_is_invisible_to_d2_but_caught_by_norm_guard(setup) -> None:  # type: ignore[no-untyped-def]
    scorer, test, _ = setup
    d2, flags = scorer.score(test)
    for factor in (1e-3, 50.0):
        d2_s, flags_s = scorer.score(test * factor)
        np.testing.assert_allclose(d2_s, d2, rtol=1e-9)  # normalisation removes the scale
        assert flags_s.norm_out.all() and not flags.norm_out.any()


def test_float32_input_and_batch_composition(setup) -> None:  # type: ignore[no-untyped-def]
    scorer, test, _ = setup
    x32 = test.astype(np.float32)
    d2_batch, _ = scorer.score(x32)
    singles = np.array([scorer.score(x32[i : i + 1])[0][0] for i in range(len(x32))])
    np.testing.assert_allclose(d2_batch, singles, rtol=1e-12)
    np.testing.assert_allclose(d2_batch, scorer.score(test)[0], rtol=1e-5)
    big = np.repeat(x32, 20, axis=0)  # larger than the preallocated buffer: grows, same result
    np.testing.assert_allclose(scorer.score(big)[0], np.repeat(d2_batch, 20), rtol=1e-12)


def test_returned_arrays_are_not_overwritten_by_the_next_call(setup) -> None:  # type: ignore[no-untyped-def]
    scorer, test, mean = setup
    d2, flags = scorer.score(test[:2])
    kept = d2.copy(), flags.exceed.copy()
    scorer.score(np.vstack([-mean * 5, np.zeros_like(mean)]))
    assert np.array_equal(d2, kept[0]) and np.array_equal(flags.exceed, kept[1])


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # expected on this path
def test_huge_finite_values_keep_direction_and_trip_norm_guard(setup) -> None:  # type: ignore[no-untyped-def]
    scorer, test, _ = setup
    d2, _ = scorer.score(test[:1])
    d2_huge, flags = scorer.score(test[:1] * 1e200)  # squares overflow float64
    assert not flags.nonfinite[0] and flags.norm_out[0]
    np.testing.assert_allclose(d2_huge, d2, rtol=1e-9)


def test_wrong_width_is_a_wiring_error(setup) -> None:  # type: ignore[no-untyped-def]
    scorer, test, _ = setup
    with pytest.raises(ValueError, match=r"\(batch, 32\)"):
        scorer.score(test[:, :31])


def test_empty_batch_is_fine(setup) -> None:  # type: ignore[no-untyped-def]
    scorer, test, _ = setup
    d2, flags = scorer.score(test[:0])
    assert d2.shape == (0,) and flags.immediate.shape == (0,)


def _score_by_rows(scorer: GateScorer, x: np.ndarray, changes=None, context=None):  # type: ignore[no-untyped-def]
    """`GateScorer.score` through `score_rows`' per-row lists (what a batch of a few rows takes)."""
    x = np.asarray(x, np.float64)
    x = np.where(np.isinf(x), np.nan, x)
    r = scorer.score_rows(
        len(x), [x], changes=None if changes is None else [changes], context=None if context is None else [context]
    )
    return np.array(r.score, np.float64), [
        np.array(f, bool) for f in (r.nonfinite, r.norm_out, r.exceed, r.out_of_range)
    ]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the rescaled rows' path
@pytest.mark.parametrize("seed", range(3))
def test_many_rows_score_as_the_per_row_path_does(setup, seed: int) -> None:  # type: ignore[no-untyped-def]
    """Many rows are scored as arrays (`_score_many`): the same bits as the per-row lists, with NaN,
    Inf, all-zero, tiny and huge rows, values, changes and plans outside a feature range."""
    scorer, test, mean = setup
    rng = np.random.default_rng(seed)
    d = test.shape[1]
    low, high = mean - 3.0, mean + 3.0
    ranged = GateScorer(
        scorer.stats,
        threshold=60.0,
        norm_low=scorer.norm_low,
        norm_high=scorer.norm_high,
        feature_range=FeatureRange(
            low=tuple(low.tolist()),
            high=tuple(high.tolist()),
            margin=0.0,
            n=1,
            calibration_rate=0.0,
            change_low=(-5.0,) * d,
            change_high=(5.0,) * d,
            context_names=("p0", "p1"),
            context_low=(-1.0, -1.0),
            context_high=(1.0, 1.0),
        ),
    )
    for b in (_VECTORISED_FROM + 1, 500):
        x = (mean + rng.normal(0, 1.5, (b, d))).astype(np.float32 if seed == 1 else np.float64)
        x[rng.random((b, d)) < 0.01] = np.nan
        x[rng.random((b, d)) < 0.005] = np.inf
        x[3] = 0.0
        changes = rng.normal(0, 3, (b, d))
        changes[rng.random((b, d)) < 0.05] = np.nan
        context = rng.normal(0, 0.7, (b, 2))
        for gate, args in ((scorer, ()), (ranged, (changes, context)), (ranged, (None, context))):
            d2, flags = gate.score(x, *args)
            ref_d2, ref_flags = _score_by_rows(gate, x, *args)
            assert d2.tobytes() == ref_d2.tobytes()
            for got, ref in zip(flags, ref_flags):
                assert got.tobytes() == ref.tobytes()
        if seed == 2:  # squares beyond float64's comfortable range: rescaled on the per-row path
            x[5], x[6] = mean * 1e-160, mean * 1e160
            d2, flags = scorer.score(x)
            ref_d2, ref_flags = _score_by_rows(scorer, x)
            assert d2.tobytes() == ref_d2.tobytes() and all(
                a.tobytes() == r.tobytes() for a, r in zip(flags, ref_flags)
            )
