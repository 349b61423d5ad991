"""Site-conformal calibration (ood.sites): each site's own quantile, the largest of them raising a
sensor profile's threshold, only from sites that measure the profile's features, kept in the gate file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dualloop import ood
from dualloop.ood.marginal import profile_gate


def _correlated(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    mix = rng.normal(size=(d, d)) * 0.4 + np.eye(d)
    return rng.normal(size=(n, d)) @ mix + rng.uniform(2.0, 30.0, d)


def test_the_threshold_is_the_largest_sites_own_quantile() -> None:
    """Pooling would let the big site set the quantile; each site's own conformal quantile is taken and
    the largest wins; a site with fewer rows than the alpha needs states none."""
    rng = np.random.default_rng(0)
    big, shifted, tiny = rng.normal(size=50_000), rng.normal(size=2_000) + 3.0, rng.normal(size=50) + 10.0
    scores = np.concatenate([big, shifted, tiny])
    site = np.repeat([0, 1, 2], [len(big), len(shifted), len(tiny)])
    names = ("big", "shifted", "tiny")
    quantiles = ood.site_quantiles(scores, site, names, 0.01)
    assert set(quantiles) == {"big", "shifted"}  # 50 rows cannot state a 1% quantile
    assert quantiles["shifted"] == ood.calibrate_threshold(shifted, 0.01, "x").threshold
    assert ood.site_threshold(scores, site, names, 0.01) == quantiles["shifted"]
    pooled = ood.calibrate_threshold(scores, 0.01, "pooled").threshold
    assert (shifted > pooled).mean() > 0.05  # what pooling would have left the shifted site with
    assert ood.site_threshold(tiny, np.zeros(50, np.int64), ("tiny",), 0.01) is None


def test_site_rows_are_sampled_evenly_per_site_in_name_order() -> None:
    x = np.arange(30, dtype=np.float32).reshape(15, 2)
    sites = ["b"] * 10 + ["a"] * 5
    kept = ood.sample_site_rows(x, sites, per_site=4)
    assert kept.names == ("a", "b")
    np.testing.assert_array_equal(kept.site, [0] * 4 + [1] * 4)
    assert kept.rows[0, 0] == 20.0 and kept.rows[3, 0] == 28.0  # a's first and last rows kept
    assert kept.rows[4, 0] == 0.0 and kept.rows[7, 0] == 18.0  # b's too
    assert "a (4 rows)" in kept.describe()
    with pytest.raises(ValueError, match="site indices"):
        ood.SiteRows(kept.rows, kept.site + 5, kept.names)


def _gate(rng: np.random.Generator, d: int) -> tuple[ood.Gate, np.ndarray]:
    x = _correlated(rng, 30_000, d)
    gate = ood.fit_gate(
        ood.FeatureRows(x[:10_000]),
        ood.FeatureRows(x[10_000:20_000]),
        ood.FeatureSchema(tuple(f"f{i}" for i in range(d)), "input_features"),
        "synthetic",
        ood.GateFitSettings(alpha=0.01, norm_alpha=0.01, keep_calibration_rows=10_000),
    )
    return gate, x[20_000:]


def test_a_site_unlike_the_fitting_data_raises_a_profiles_threshold(tmp_path: Path) -> None:
    """A site whose ordinary rows score above the simulated quantile (shifted present features) raises
    the threshold of a profile it measures, so its own rows are vetoed at about alpha; a site that does
    not measure a present feature does not count; the rows survive a save and load with the hash."""
    rng = np.random.default_rng(1)
    d = 6
    gate, fresh = _gate(rng, d)
    present = np.array([True, True, True, False, False, False])
    shifted = fresh.copy()
    shifted[:, 1] *= 1.6  # another site's ordinary driving: a feature's typical value elsewhere
    shifted[:, ~present] = np.nan  # this site measures only the profile's features
    blind = fresh.copy()
    blind[:, 1] = np.nan  # a site without feature 1: says nothing about this profile
    blind[:, 0] *= 5.0
    base = profile_gate(gate, present)
    before = ood.score_in_chunks(base.scorer(256), base.marginal.complete(shifted[:5000]))[1].exceed.mean()
    assert before > 0.2  # the simulated threshold vetoes the other site's ordinary driving
    rows = np.concatenate([shifted[:5000], blind[:5000]])
    sites = ood.sample_site_rows(rows, ["shifted"] * 5000 + ["blind"] * 5000, per_site=5000)
    with_sites = ood.Gate(
        gate.stats, gate.calibration, gate.norm_band, gate.filter, gate.schema,
        calibration_rows=gate.calibration_rows, site_rows=sites,
    )  # fmt: skip
    judged = profile_gate(with_sites, present)
    assert judged.threshold > base.threshold and judged.site_threshold == judged.threshold
    after = ood.score_in_chunks(judged.scorer(256), judged.marginal.complete(shifted[5000:]))[1].exceed.mean()
    assert after < 0.03  # about alpha (0.01) on the site's fresh rows
    only_blind = ood.Gate(
        gate.stats, gate.calibration, gate.norm_band, gate.filter, gate.schema,
        calibration_rows=gate.calibration_rows, site_rows=ood.sample_site_rows(blind[:5000], ["blind"] * 5000, 5000),
    )  # fmt: skip
    assert profile_gate(only_blind, present).threshold == base.threshold
    path = tmp_path / "g.npz"
    digest = with_sites.save(path)
    loaded = ood.load_gate(path)
    assert loaded.version_hash == digest != gate.version_hash
    assert loaded.site_rows is not None and loaded.site_rows.names == ("blind", "shifted")
    assert profile_gate(loaded, present).threshold == judged.threshold


def test_a_gate_file_with_half_its_site_rows_is_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    gate, fresh = _gate(rng, 4)
    sites = ood.sample_site_rows(fresh[:1000], ["a"] * 1000, 1000)
    path = tmp_path / "g.npz"
    ood.Gate(gate.stats, gate.calibration, gate.norm_band, gate.filter, gate.schema, site_rows=sites).save(path)
    entries = dict(np.load(path))
    del entries["site_index"]
    np.savez(tmp_path / "bad.npz", **entries)
    with pytest.raises(ood.GateFileError, match="site rows need"):
        ood.load_gate(tmp_path / "bad.npz")
