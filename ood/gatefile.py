"""Load a gate file and verify it: format, shapes, dtypes, schema and the content hash.

The format, the hash and the writer are in ``gateformat`` (which ``Gate`` itself uses); this module
builds ``Gate`` objects from a file, so it sits above ``gate`` and ``gateformat`` and neither imports it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from dualloop.ood.actuation import ActuationCheck
from dualloop.ood.calibrate import FeatureRange, NormBand, ThresholdCalibration
from dualloop.ood.filter import filter_settings_from_dict
from dualloop.ood.fit import VARIANTS, GateStats, NormStats
from dualloop.ood.freeze import FreezeSettings
from dualloop.ood.gate import Gate
from dualloop.ood.gateformat import (
    ARRAY_NAMES,
    CALIBRATION_ROWS,
    FORMAT_NAME,
    FORMAT_VERSION,
    INT_ARRAYS,
    META_KEYS,
    SITE_INDEX,
    SITE_ROWS,
)
from dualloop.ood.schema import FeatureSchema, ModelRef, describe_schema_mismatch
from dualloop.ood.shrinkage import SHRINKAGE_METHODS
from dualloop.ood.sites import SiteRows


class GateFileError(ValueError):
    """A gate file that cannot be used; the message starts with "gate file PATH:" and says why."""


def _not_json(constant: str) -> float:
    # the writer refuses NaN and Infinity (gateformat.canonical_json), so a file holding one was edited
    raise ValueError(f"{constant} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not np.isfinite(value):
        raise ValueError(f"{text} is beyond a float")
    return value


def _read_npz(path: str) -> dict[str, npt.NDArray[Any]]:
    try:
        with np.load(path, allow_pickle=False) as npz:
            if not hasattr(npz, "files"):
                raise ValueError("not an .npz archive")
            return {name: npz[name] for name in npz.files}
    except FileNotFoundError:
        raise
    except Exception as exc:  # zipfile/zlib/numpy raise many types for a damaged file
        raise GateFileError(
            f"gate file {path}: unreadable or not a pickle-free .npz ({type(exc).__name__}: {exc})"
        ) from exc


def _check_shapes(path: str, arrays: dict[str, npt.NDArray[Any]], variant: str, dim: int) -> None:
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
    wrong = [f"{n} {arrays[n].shape} (want {want[n]})" for n in ARRAY_NAMES if arrays[n].shape != want[n]]
    if (variant == "single") != (k == 0):
        wrong.append(f"class_labels has {k} classes for variant {variant!r}")
    if wrong:
        raise GateFileError(f"gate file {path}: inconsistent array shapes: {', '.join(wrong)}")


def load_gate(
    path: str | os.PathLike[str],
    expected_feature_names: Sequence[str] | None = None,
    expected_source: str | None = None,
) -> Gate:
    """Load and verify a gate file; refuse (GateFileError, a ValueError, naming the file) on any mismatch."""
    path = os.fspath(path)
    entries = _read_npz(path)
    meta = _metadata(path, entries)
    gate = _gate(path, meta, entries)
    if gate.version_hash != meta["version_hash"]:
        raise GateFileError(
            f"gate file {path}: content hash mismatch (stored {str(meta['version_hash'])[:12]}..., "
            f"computed {gate.version_hash[:12]}...): the file is corrupt or was edited"
        )
    if expected_feature_names is not None:
        check_feature_names(path, gate, expected_feature_names)
    if expected_source is not None and gate.schema.source != expected_source:
        raise GateFileError(
            f"gate file {path}: feature source mismatch: gate was fitted on {gate.schema.source!r}, "
            f"caller feeds {expected_source!r}"
        )
    return gate


def check_feature_names(path: str | os.PathLike[str], gate: Gate, expected_feature_names: Sequence[str]) -> None:
    """Refuse (GateFileError naming the file) a loaded gate whose features are not these, in this order."""
    diff = describe_schema_mismatch(gate.schema.feature_names, expected_feature_names)
    if diff:
        raise GateFileError(f"gate file {os.fspath(path)}: feature schema mismatch: {diff}")


def _metadata(path: str, entries: dict[str, npt.NDArray[Any]]) -> dict[str, Any]:
    """The file's metadata, once its entries, JSON, fields, format and variant are as this code reads them."""
    if "metadata" not in entries:
        raise GateFileError(f"gate file {path}: no 'metadata' entry (not a dualloop gate file)")
    missing_arrays = [n for n in ARRAY_NAMES if n not in entries]
    if missing_arrays:
        raise GateFileError(f"gate file {path}: missing arrays {missing_arrays}")
    raw_meta = entries["metadata"]
    if raw_meta.dtype.kind != "U" or raw_meta.shape != ():
        raise GateFileError(
            f"gate file {path}: 'metadata' must be a JSON string, got {raw_meta.dtype} {raw_meta.shape}"
        )
    try:
        meta = json.loads(str(raw_meta[()]), parse_constant=_not_json, parse_float=_finite)
    except ValueError as exc:  # JSONDecodeError is one
        raise GateFileError(f"gate file {path}: metadata is not valid JSON ({exc})") from exc
    if not isinstance(meta, dict):
        raise GateFileError(f"gate file {path}: metadata must be a JSON object")
    missing_keys = [k for k in (*META_KEYS, "version_hash") if k not in meta]
    if missing_keys:
        raise GateFileError(f"gate file {path}: metadata lacks fields {missing_keys}")
    if meta["format"] == FORMAT_NAME and meta["format_version"] == 1:
        raise GateFileError(
            f"gate file {path}: format v1, whose change limits are per observation at the rate it was fitted "
            f"on; this code reads v{FORMAT_VERSION}, whose limits are per second at any observation rate. "
            f"Refit the gate (dualloop gate fit) to use it."
        )
    if meta["format"] != FORMAT_NAME or meta["format_version"] != FORMAT_VERSION:
        raise GateFileError(
            f"gate file {path}: format {meta['format']!r} v{meta['format_version']}, "
            f"this code reads {FORMAT_NAME!r} v{FORMAT_VERSION}"
        )
    if meta["variant"] not in VARIANTS or meta["shrinkage"] not in SHRINKAGE_METHODS:
        raise GateFileError(f"gate file {path}: unknown variant {meta['variant']!r} or shrinkage {meta['shrinkage']!r}")
    return meta


def _site_rows(path: str, meta: dict[str, Any], entries: dict[str, npt.NDArray[Any]], dim: int) -> SiteRows | None:
    """The optional real-driving rows of several sites (both arrays and the names, or none of them)."""
    names, rows, index = meta.get("sites"), entries.get(SITE_ROWS), entries.get(SITE_INDEX)
    if names is None and rows is None and index is None:
        return None
    if names is None or rows is None or index is None:
        raise GateFileError(
            f"gate file {path}: site rows need '{SITE_ROWS}', '{SITE_INDEX}' and the metadata's 'sites'"
        )
    if rows.dtype != np.dtype("<f4") or rows.ndim != 2 or rows.shape[1] != dim or index.dtype != np.dtype("<i8"):
        raise GateFileError(
            f"gate file {path}: {SITE_ROWS} must be (k, {dim}) float32 and {SITE_INDEX} (k,) int64, "
            f"got {rows.dtype} {rows.shape} and {index.dtype} {index.shape}"
        )
    return SiteRows(rows, index, tuple(str(n) for n in names))


def _gate(path: str, meta: dict[str, Any], entries: dict[str, npt.NDArray[Any]]) -> Gate:
    """The gate the verified metadata and arrays describe, its parts consistent with each other (the
    content hash not yet checked)."""
    arrays = {n: entries[n] for n in ARRAY_NAMES}
    bad_dtype = [f"{n}: {a.dtype}" for n, a in arrays.items() if a.dtype.kind != ("i" if n in INT_ARRAYS else "f")]
    if bad_dtype:
        raise GateFileError(f"gate file {path}: wrong array dtypes {bad_dtype}")
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
            # optional: a gate without one counts every exact repeat as a freeze
            freeze=None if meta.get("freeze") is None else FreezeSettings.from_dict(meta["freeze"]),
            calibration_rows=entries.get(CALIBRATION_ROWS),
            # optional: files written before gates recorded their model have none
            model=None if meta.get("model") is None else ModelRef.from_dict(meta["model"]),
            site_rows=_site_rows(path, meta, entries, dim),
        )
        rows = gate.calibration_rows
        if rows is not None and (rows.dtype != np.dtype("<f4") or rows.ndim != 2 or rows.shape[1] != dim):
            raise GateFileError(
                f"gate file {path}: {CALIBRATION_ROWS} must be (k, {dim}) float32, got {rows.dtype} {rows.shape}"
            )
        if gate.feature_range is not None and len(gate.feature_range.low) != dim:
            raise GateFileError(
                f"gate file {path}: feature range of {len(gate.feature_range.low)} features for dim {dim}"
            )
    # what a field of the wrong type or size raises on the way (a damaged or hand-edited file)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as exc:
        if isinstance(exc, GateFileError):
            raise
        raise GateFileError(f"gate file {path}: bad or missing metadata field ({type(exc).__name__}: {exc})") from exc
    if len(gate.schema.feature_names) != dim:
        raise GateFileError(f"gate file {path}: {len(gate.schema.feature_names)} feature names for dim {dim}")
    if gate.actuation is not None:
        wanted = (gate.actuation.settings.accel_feature, gate.actuation.settings.speed_feature)
        if not set(wanted) <= set(gate.schema.feature_names):
            raise GateFileError(
                f"gate file {path}: the actuation check reads {list(wanted)}, which this gate's "
                f"{gate.schema.source} features do not include"
            )
    return gate
