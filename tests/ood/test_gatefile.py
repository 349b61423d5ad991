"""Gate file: exact round trip, schema refusal, integrity checks, no pickle."""

from __future__ import annotations

import dataclasses
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from dualloop import ood
from dualloop.ood.gatefile import load_gate

D = 12
NAMES = [f"h{i}" for i in range(D)]


@pytest.fixture(scope="module", params=["single", "tied", "relative"])
def fitted(request) -> tuple[ood.Gate, np.ndarray]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(11)
    y = rng.integers(0, 3, size=3000)
    centres = 2.0 * rng.normal(size=(3, D)) + 4.0 * rng.normal(size=D)
    x = centres[y] + rng.normal(size=(3000, D))
    gate = ood.fit_gate(
        ood.FeatureRows(x[:2000]),
        ood.FeatureRows(x[2000:]),
        ood.FeatureSchema(tuple(NAMES), "decision_vector"),
        "synthetic 3-class, seed 11",
        ood.GateFitSettings(variant=request.param, alpha=0.01, filter=ood.CusumSettings(h=3, down=0.25)),
        labels=y[:2000] if request.param != "single" else None,
    )
    test = np.vstack([x[:50] * 1.1, rng.normal(size=(10, D)), np.zeros((1, D))])
    test[5, 2] = np.nan
    return gate, test


def test_round_trip_gives_identical_scores_and_hash(fitted, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gate, test = fitted
    path = tmp_path / "gate"  # no suffix on purpose: the file must land exactly here
    digest = gate.save(str(path))
    assert path.exists() and digest == gate.version_hash and len(digest) == 64
    loaded = load_gate(path, expected_feature_names=NAMES, expected_source="decision_vector")
    assert loaded.version_hash == digest
    assert loaded.calibration == gate.calibration and loaded.norm_band == gate.norm_band
    assert loaded.filter == gate.filter and loaded.schema == gate.schema and loaded.variant == gate.variant
    a, fa = gate.scorer().score(test)
    b, fb = loaded.scorer().score(test)
    assert np.array_equal(a, b)
    for x, y in zip(fa, fb):
        assert np.array_equal(x, y)
    # Saving the loaded gate again reproduces the same hash.
    assert loaded.save(str(tmp_path / "again.npz")) == digest


def test_calibration_record_is_stored(fitted, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gate, _ = fitted
    gate.save(str(tmp_path / "g.npz"))
    with np.load(tmp_path / "g.npz", allow_pickle=False) as npz:
        meta = json.loads(str(npz["metadata"][()]))
    cal = meta["calibration"]
    assert cal["alpha"] == 0.01 and cal["n"] == 1000 and cal["data_description"] == "synthetic 3-class, seed 11"
    assert 0.0 <= cal["empirical_rate"] <= 0.01
    assert meta["schema"] == {"feature_names": NAMES, "source": "decision_vector"}
    assert meta["filter"] == {"kind": "cusum", "h": 3.0, "down": 0.25, "cap": None}
    assert meta["variant"] == gate.variant and meta["version_hash"] == gate.version_hash


def test_schema_mismatch_is_refused_with_the_difference(fitted, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gate, _ = fitted
    path = tmp_path / "g.npz"
    gate.save(str(path))
    with pytest.raises(
        ValueError, match=r"g\.npz.*gate has 12 features, caller expects 13.*expected but not in gate: \['extra'\]"
    ):
        load_gate(path, expected_feature_names=NAMES + ["extra"])
    renamed = NAMES[:4] + ["speed"] + NAMES[5:]
    with pytest.raises(ValueError, match=r"expected but not in gate: \['speed'\]; in gate but not expected: \['h4'\]"):
        load_gate(path, expected_feature_names=renamed)
    swapped = NAMES[:]
    swapped[1], swapped[2] = swapped[2], swapped[1]
    with pytest.raises(ValueError, match=r"different order; first difference at position 1: gate 'h1', caller 'h2'"):
        load_gate(path, expected_feature_names=swapped)
    with pytest.raises(ValueError, match=r"source mismatch.*'decision_vector'.*'input_features'"):
        load_gate(path, expected_source="input_features")


def _rewrite(src: Path, dst: Path, edit) -> None:  # type: ignore[no-untyped-def]
    with np.load(src, allow_pickle=False) as npz:
        entries = {k: npz[k] for k in npz.files}
    edit(entries)
    with open(dst, "wb") as f:
        np.savez(f, **entries)


def test_corrupt_or_incomplete_files_are_refused(fitted, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gate, _ = fitted
    good = tmp_path / "good.npz"
    gate.save(str(good))

    def tamper_threshold(e: dict) -> None:  # type: ignore[type-arg]
        meta = json.loads(str(e["metadata"][()]))
        meta["calibration"]["threshold"] *= 2
        e["metadata"] = np.array(json.dumps(meta))

    def drop_field(e: dict) -> None:  # type: ignore[type-arg]
        meta = json.loads(str(e["metadata"][()]))
        del meta["norm_band"]
        e["metadata"] = np.array(json.dumps(meta))

    def format_v1(e: dict) -> None:  # type: ignore[type-arg]
        meta = json.loads(str(e["metadata"][()]))
        meta["format_version"] = 1
        e["metadata"] = np.array(json.dumps(meta))

    def flip_whitening(e: dict) -> None:  # type: ignore[type-arg]
        e["whiten"] = e["whiten"].copy()
        e["whiten"][0, 0] += 1e-12

    def null_filter(e: dict) -> None:  # type: ignore[type-arg]
        meta = json.loads(str(e["metadata"][()]))
        meta["filter"] = None  # found by tests/fuzz: was an AttributeError
        e["metadata"] = np.array(json.dumps(meta))

    def nan_threshold(e: dict) -> None:  # type: ignore[type-arg]
        text = str(e["metadata"][()])
        e["metadata"] = np.array(text.replace('"threshold":', '"threshold":NaN,"was":', 1))

    cases = [
        (tamper_threshold, "content hash mismatch"),
        (nan_threshold, r"metadata is not valid JSON \(NaN is not a JSON number\)"),
        (null_filter, r"bad or missing metadata field \(AttributeError"),
        (drop_field, r"lacks fields \['norm_band'\]"),
        # v1's change limits were per observation at the fitting rate: refused, with what to do
        (format_v1, r"format v1, whose change limits are per observation.*Refit the gate \(dualloop gate fit\)"),
        (flip_whitening, "content hash mismatch"),
        (lambda e: e.pop("center"), r"missing arrays \['center'\]"),
        (lambda e: e.pop("metadata"), "no 'metadata' entry"),
        (lambda e: e.update(center=e["center"][:-1]), "inconsistent array shapes: center"),
    ]
    for i, (edit, message) in enumerate(cases):
        bad = tmp_path / f"bad{i}.npz"
        _rewrite(good, bad, edit)
        with pytest.raises(ood.GateFileError, match=rf"bad{i}\.npz.*{message}"):
            load_gate(bad)

    truncated = tmp_path / "truncated.npz"
    truncated.write_bytes(good.read_bytes()[:200])
    with pytest.raises(ValueError, match=r"truncated\.npz: unreadable"):
        load_gate(truncated)


def test_pickled_payloads_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "evil.npz"
    with open(path, "wb") as f:
        np.savez(f, metadata=np.array([{"a": 1}], dtype=object))
    with pytest.raises(ValueError, match=r"evil\.npz: unreadable or not a pickle-free"):
        load_gate(path)
    assert zipfile.is_zipfile(path)


def test_feature_range_round_trips_and_older_files_without_one_still_load(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    x = rng.normal(size=(3000, D)) + 3.0
    changes = rng.normal(scale=0.1, size=(3000, D))
    changes[0] = np.nan  # a first observation: no change known, ignored by the fit
    gate = ood.fit_gate(
        ood.FeatureRows(x[:2000], changes[:2000]),
        ood.FeatureRows(x[2000:], changes[2000:]),
        ood.FeatureSchema(tuple(NAMES), "input_features"),
        "synthetic",
        ood.GateFitSettings(alpha=0.01, range=ood.RangeSettings(margin=0.25, change_note="per observation at 5 ms")),
    )
    r = gate.feature_range
    assert r is not None and len(r.low) == D and len(r.change_low) == D and np.isfinite(r.change_low).all()
    span = x[:2000].max(axis=0) - x[:2000].min(axis=0)
    np.testing.assert_allclose(r.high, x[:2000].max(axis=0) + 0.25 * span)
    path = tmp_path / "ranged.npz"
    digest = gate.save(str(path))
    loaded = load_gate(path)
    assert loaded.version_hash == digest and loaded.feature_range.to_dict() == r.to_dict()
    probe = x[2000:2010].copy()
    probe[3, 4] = r.high[4] + 1.0  # out of range
    jump = changes[2000:2010].copy()
    jump[6, 1] = r.change_low[1] - 0.5  # a change beyond its limit
    _, flags = loaded.scorer().score(probe, jump)
    assert np.flatnonzero(flags.out_of_range).tolist() == [3, 6] and flags.immediate[[3, 6]].all()
    _, without_changes = loaded.scorer().score(probe)
    assert np.flatnonzero(without_changes.out_of_range).tolist() == [3]
    # a file written before the range guard has no such entry and keeps its hash
    old = ood.fit_gate(
        ood.FeatureRows(x[:2000]),
        ood.FeatureRows(x[2000:]),
        ood.FeatureSchema(tuple(NAMES), "input_features"),
        "synthetic",
        ood.GateFitSettings(alpha=0.01),
    )
    old_path = tmp_path / "old.npz"
    old_digest = old.save(str(old_path))
    with np.load(old_path, allow_pickle=False) as npz:
        assert "feature_range" not in json.loads(str(npz["metadata"][()]))
    plain = load_gate(old_path)
    assert plain.feature_range is None and plain.version_hash == old_digest


def test_freeze_settings_round_trip_and_are_hashed(fitted, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    gate, _ = fitted
    plain = tmp_path / "plain.npz"
    gate.save(str(plain))
    with np.load(plain, allow_pickle=False) as npz:
        assert "freeze" not in json.loads(str(npz["metadata"][()]))  # absent, not null, without settings
    assert load_gate(plain).freeze is None
    settings = ood.FreezeSettings(speed_feature=NAMES[2], rest_speed=0.25)
    with_rest = dataclasses.replace(gate, freeze=settings)
    path = tmp_path / "rest.npz"
    digest = with_rest.save(str(path))
    loaded = load_gate(path)
    assert loaded.freeze == settings and loaded.version_hash == digest != gate.version_hash
    assert loaded.freeze.rest(NAMES) == (2, 0.25)
    with pytest.raises(ValueError, match="reads the feature 'speed'"):
        ood.FreezeSettings("speed").rest(NAMES)


def test_edited_feature_range_is_refused(tmp_path: Path) -> None:
    rng = np.random.default_rng(6)
    x = rng.normal(size=(3000, D)) + 3.0
    gate = ood.fit_gate(
        ood.FeatureRows(x[:2000]),
        ood.FeatureRows(x[2000:]),
        ood.FeatureSchema(tuple(NAMES), "input_features"),
        "synthetic",
        ood.GateFitSettings(alpha=0.01, range=ood.RangeSettings(margin=0.25)),
    )
    path = tmp_path / "g.npz"
    gate.save(str(path))

    def widen(entries) -> None:  # type: ignore[no-untyped-def]
        meta = json.loads(str(entries["metadata"][()]))
        meta["feature_range"]["high"][0] = 1e9  # someone loosens a limit by hand
        entries["metadata"] = np.array(json.dumps(meta))

    _rewrite(path, tmp_path / "edited.npz", widen)
    with pytest.raises(ValueError, match="content hash mismatch"):
        load_gate(tmp_path / "edited.npz")


def test_feature_range_checks_few_rows_as_many() -> None:
    """A tick of a few sessions checks the range in Python, a replay in numpy: the same verdicts."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(3000, D)) + 3.0
    changes, plans = rng.normal(scale=0.1, size=(3000, D)), rng.normal(size=(3000, 2))
    gate = ood.fit_gate(
        ood.FeatureRows(x[:2000], changes[:2000], plans[:2000]),
        ood.FeatureRows(x[2000:], changes[2000:], plans[2000:]),
        ood.FeatureSchema(tuple(NAMES), "input_features"),
        "synthetic",
        ood.GateFitSettings(alpha=0.01, range=ood.RangeSettings(margin=0.1, context_names=("a", "b"))),
    )
    n = 200
    probe, c, p = x[2000 : 2000 + n] * 1.4, changes[2000 : 2000 + n] * 1.6, plans[2000 : 2000 + n] * 1.6
    probe[7, 3] = np.nan
    c[11] = np.nan  # an unknown change
    many = gate.scorer(max_batch=n).score(probe, c, p)[1]
    few = [
        gate.scorer(max_batch=4).score(probe[i : i + k], c[i : i + k], p[i : i + k])[1]
        for i, k in zip(range(0, n, 3), [3] * (n // 3 + 1))
    ]
    for field in ("out_of_range", "immediate", "nonfinite"):
        assert np.concatenate([getattr(f, field) for f in few]).tolist() == getattr(many, field).tolist()
    assert 10 < many.out_of_range.sum() < n
