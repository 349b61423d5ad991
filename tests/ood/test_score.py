"""Scorer hot path: NaN/Inf vetoes, the norm guard, dtype and batch independence."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.ood.fit import fit_statistics, raw_norms
from dualloop.ood.score import GateScorer


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
