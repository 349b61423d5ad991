"""Gate file: exact round trip, schema refusal, integrity checks, no pickle."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

import ood
from ood.gatefile import load_gate

D = 12
NAMES = [f"h{i}" for i in range(D)]


@pytest.fixture(scope="module", params=["single", "tied", "relative"])
def fitted(request) -> tuple[ood.Gate, np.ndarray]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(11)
    y = rng.integers(0, 3, size=3000)
    centres = 2.0 * rng.normal(size=(3, D)) + 4.0 * rng.normal(size=D)
    x = centres[y] + rng.normal(size=(3000, D))
    gate = ood.fit_gate(
        x[:2000], x[2000:], y[:2000] if request.param != "single" else None,
        variant=request.param, alpha=0.01, feature_names=NAMES, source="decision_vector",
        data_description="synthetic 3-class, seed 11", filter=ood.CusumSettings(h=3, down=0.25),
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
    with pytest.raises(ValueError, match=r"g\.npz.*gate has 12 features, caller expects 13.*expected but not in gate: \['extra'\]"):
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

    def flip_whitening(e: dict) -> None:  # type: ignore[type-arg]
        e["whiten"] = e["whiten"].copy()
        e["whiten"][0, 0] += 1e-12

    cases = [
        (tamper_threshold, "content hash mismatch"),
        (drop_field, r"lacks fields \['norm_band'\]"),
        (flip_whitening, "content hash mismatch"),
        (lambda e: e.pop("center"), r"missing arrays \['center'\]"),
        (lambda e: e.pop("metadata"), "no 'metadata' entry"),
        (lambda e: e.update(center=e["center"][:-1]), "inconsistent array shapes: center"),
    ]
    for i, (edit, message) in enumerate(cases):
        bad = tmp_path / f"bad{i}.npz"
        _rewrite(good, bad, edit)
        with pytest.raises(ValueError, match=rf"bad{i}\.npz.*{message}"):
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
