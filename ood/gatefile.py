"""Gate file: one ``.npz`` with numeric arrays plus a single JSON metadata string. No pickle.

Entries: ``metadata`` (0-d unicode array holding JSON) and the float64/int64 arrays of
``GateStats.arrays()``. The version hash is sha256 over the canonical JSON of the metadata
(sorted keys, no whitespace, hash field excluded) followed by each array's name, dtype, shape and
little-endian bytes in name order; it is stored in the metadata and re-checked on load, so a
truncated, edited or bit-flipped file is refused rather than trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from dualloop.ood.actuation import ActuationCheck
from dualloop.ood.calibrate import FeatureRange, NormBand, ThresholdCalibration
from dualloop.ood.filter import filter_settings_from_dict
from dualloop.ood.fit import VARIANTS, GateStats, NormStats
from dualloop.ood.gate import FeatureSchema, Gate
from dualloop.ood.shrinkage import SHRINKAGE_METHODS

FORMAT_NAME = "dualloop.ood.gate"
FORMAT_VERSION = 1
_INT_ARRAYS = ("class_labels",)
_ARRAY_NAMES = (
    "center",
    "covariance",
    "whiten",
    "class_labels",
    "class_means",
    "class_offsets",
    "bg_covariance",
    "bg_whiten",
)
_META_KEYS = (
    "format",
    "format_version",
    "variant",
    "shrinkage",
    "n_train",
    "dim",
    "shrinkage_coef",
    "bg_shrinkage_coef",
    "norm_train",
    "calibration",
    "norm_band",
    "filter",
    "schema",
)


def _canonical_arrays(stats: GateStats) -> dict[str, np.ndarray]:
    out = {}
    for name, arr in stats.arrays().items():
        dtype = "<i8" if name in _INT_ARRAYS else "<f8"
        out[name] = np.ascontiguousarray(arr, dtype=dtype)
    return out


def _metadata(gate: Gate) -> dict[str, Any]:
    s = gate.stats
    meta = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "variant": s.variant,
        "shrinkage": s.shrinkage,
        "n_train": int(s.n_train),
        "dim": s.dim,
        "shrinkage_coef": float(s.shrinkage_coef),
        "bg_shrinkage_coef": float(s.bg_shrinkage_coef),
        "norm_train": s.norm.to_dict(),
        "calibration": gate.calibration.to_dict(),
        "norm_band": gate.norm_band.to_dict(),
        "filter": gate.filter.to_dict(),
        "schema": gate.schema.to_dict(),
    }
    if gate.feature_range is not None:  # absent, not null, without one: older files keep their hash
        meta["feature_range"] = gate.feature_range.to_dict()
    if gate.actuation is not None:  # the same: absent without one
        meta["actuation"] = gate.actuation.to_dict()
    return meta


def _canonical_json(meta: dict[str, Any]) -> str:
    # allow_nan=False: Infinity/NaN are not JSON and would make the file unreadable elsewhere.
    return json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _hash(meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256(_canonical_json(meta).encode("utf-8"))
    for name in sorted(arrays):
        arr = arrays[name]
        h.update(f"\0{name}\0{arr.dtype.str}\0{list(arr.shape)}\0".encode())
        h.update(arr.tobytes(order="C"))
    return h.hexdigest()


def content_hash(gate: Gate) -> str:
    return _hash(_metadata(gate), _canonical_arrays(gate.stats))


def save_gate(gate: Gate, path: str | os.PathLike[str]) -> str:
    """Write atomically (temp file + rename) so a reader never sees half a gate. Returns the hash."""
    path = os.fspath(path)
    meta = _metadata(gate)
    arrays = _canonical_arrays(gate.stats)
    digest = _hash(meta, arrays)
    meta_json = _canonical_json({**meta, "version_hash": digest})
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".gate-", suffix=".npz.tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, metadata=np.array(meta_json), **arrays)  # file handle: no ".npz" appended
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return digest


def describe_schema_mismatch(gate_names: Sequence[str], expected: Sequence[str]) -> str | None:
    """Human-readable difference between two ordered name lists, or None if identical."""
    gate_names, expected = list(gate_names), list(expected)
    if gate_names == expected:
        return None
    parts = []
    if len(gate_names) != len(expected):
        parts.append(f"gate has {len(gate_names)} features, caller expects {len(expected)}")
    missing = [n for n in expected if n not in set(gate_names)]
    extra = [n for n in gate_names if n not in set(expected)]
    if missing:
        parts.append(f"expected but not in gate: {missing[:8]}{' ...' if len(missing) > 8 else ''}")
    if extra:
        parts.append(f"in gate but not expected: {extra[:8]}{' ...' if len(extra) > 8 else ''}")
    if not missing and not extra:
        i = next(i for i, (a, b) in enumerate(zip(gate_names, expected)) if a != b)
        parts.append(
            f"same names in a different order; first difference at position {i}: gate {gate_names[i]!r}, "
            f"caller {expected[i]!r}"
        )
    return "; ".join(parts)


def _read_npz(path: str) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            if not hasattr(npz, "files"):
                raise ValueError("not an .npz archive")
            return {name: npz[name] for name in npz.files}
    except FileNotFoundError:
        raise
    except Exception as exc:  # zipfile/zlib/numpy raise many types for a damaged file
        raise ValueError(
            f"gate file {path}: unreadable or not a pickle-free .npz ({type(exc).__name__}: {exc})"
        ) from exc


def _check_shapes(path: str, arrays: dict[str, np.ndarray], variant: str, dim: int) -> None:
    k = arrays["class_labels"].shape[0] if arrays["class_labels"].ndim == 1 else -1
    bg = (dim, dim) if variant == "relative" else (0, 0)
    want = {
        "center": (dim,),
        "covariance": (dim, dim),
        "whiten": (dim, dim),
        "class_labels": (k,),
        "class_means": (k, dim),
        "class_offsets": (k, dim),
        "bg_covariance": bg,
        "bg_whiten": bg,
    }
    wrong = [f"{n} {arrays[n].shape} (want {want[n]})" for n in _ARRAY_NAMES if arrays[n].shape != want[n]]
    if (variant == "single") != (k == 0):
        wrong.append(f"class_labels has {k} classes for variant {variant!r}")
    if wrong:
        raise ValueError(f"gate file {path}: inconsistent array shapes: {', '.join(wrong)}")


def load_gate(
    path: str | os.PathLike[str],
    expected_feature_names: Sequence[str] | None = None,
    expected_source: str | None = None,
) -> Gate:
    """Load and verify a gate file; refuse (ValueError naming the file) on any mismatch."""
    path = os.fspath(path)
    entries = _read_npz(path)
    if "metadata" not in entries:
        raise ValueError(f"gate file {path}: no 'metadata' entry (not a dualloop gate file)")
    missing_arrays = [n for n in _ARRAY_NAMES if n not in entries]
    if missing_arrays:
        raise ValueError(f"gate file {path}: missing arrays {missing_arrays}")
    raw_meta = entries["metadata"]
    if raw_meta.dtype.kind != "U" or raw_meta.shape != ():
        raise ValueError(f"gate file {path}: 'metadata' must be a JSON string, got {raw_meta.dtype} {raw_meta.shape}")
    try:
        meta = json.loads(str(raw_meta[()]))
    except json.JSONDecodeError as exc:
        raise ValueError(f"gate file {path}: metadata is not valid JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise ValueError(f"gate file {path}: metadata must be a JSON object")
    missing_keys = [k for k in (*_META_KEYS, "version_hash") if k not in meta]
    if missing_keys:
        raise ValueError(f"gate file {path}: metadata lacks fields {missing_keys}")
    if meta["format"] != FORMAT_NAME or meta["format_version"] != FORMAT_VERSION:
        raise ValueError(
            f"gate file {path}: format {meta['format']!r} v{meta['format_version']}, "
            f"this code reads {FORMAT_NAME!r} v{FORMAT_VERSION}"
        )
    if meta["variant"] not in VARIANTS or meta["shrinkage"] not in SHRINKAGE_METHODS:
        raise ValueError(f"gate file {path}: unknown variant {meta['variant']!r} or shrinkage {meta['shrinkage']!r}")

    arrays = {n: entries[n] for n in _ARRAY_NAMES}
    bad_dtype = [f"{n}: {a.dtype}" for n, a in arrays.items() if a.dtype.kind != ("i" if n in _INT_ARRAYS else "f")]
    if bad_dtype:
        raise ValueError(f"gate file {path}: wrong array dtypes {bad_dtype}")
    try:
        dim = int(meta["dim"])
        _check_shapes(path, arrays, meta["variant"], dim)
        stats = GateStats(
            variant=meta["variant"],
            shrinkage=meta["shrinkage"],
            n_train=int(meta["n_train"]),
            shrinkage_coef=float(meta["shrinkage_coef"]),
            bg_shrinkage_coef=float(meta["bg_shrinkage_coef"]),
            norm=NormStats.from_dict(meta["norm_train"]),
            **arrays,
        )
        gate = Gate(
            stats=stats,
            calibration=ThresholdCalibration.from_dict(meta["calibration"]),
            norm_band=NormBand.from_dict(meta["norm_band"]),
            filter=filter_settings_from_dict(meta["filter"]),
            schema=FeatureSchema(tuple(meta["schema"]["feature_names"]), str(meta["schema"]["source"])),
            # optional: gate files written before the range guard have none
            feature_range=None if meta.get("feature_range") is None else FeatureRange.from_dict(meta["feature_range"]),
            # optional too: gate files written before the actuation check have none
            actuation=None if meta.get("actuation") is None else ActuationCheck.from_dict(meta["actuation"]),
        )
        if gate.feature_range is not None and len(gate.feature_range.low) != dim:
            raise ValueError(f"gate file {path}: feature range of {len(gate.feature_range.low)} features for dim {dim}")
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ValueError) and str(exc).startswith(f"gate file {path}"):
            raise
        raise ValueError(f"gate file {path}: bad or missing metadata field ({type(exc).__name__}: {exc})") from exc
    if len(gate.schema.feature_names) != dim:
        raise ValueError(f"gate file {path}: {len(gate.schema.feature_names)} feature names for dim {dim}")
    if gate.actuation is not None:
        wanted = (gate.actuation.settings.accel_feature, gate.actuation.settings.speed_feature)
        if not set(wanted) <= set(gate.schema.feature_names):
            raise ValueError(
                f"gate file {path}: the actuation check reads {list(wanted)}, which this gate's "
                f"{gate.schema.source} features do not include"
            )
    if gate.version_hash != meta["version_hash"]:
        raise ValueError(
            f"gate file {path}: content hash mismatch (stored {str(meta['version_hash'])[:12]}..., "
            f"computed {gate.version_hash[:12]}...): the file is corrupt or was edited"
        )
    if expected_feature_names is not None:
        diff = describe_schema_mismatch(gate.schema.feature_names, expected_feature_names)
        if diff:
            raise ValueError(f"gate file {path}: feature schema mismatch: {diff}")
    if expected_source is not None and gate.schema.source != expected_source:
        raise ValueError(
            f"gate file {path}: feature source mismatch: gate was fitted on {gate.schema.source!r}, "
            f"caller feeds {expected_source!r}"
        )
    return gate
