"""The gate file's format: canonical content, content hash and atomic writer. No pickle.

A gate file is one ``.npz`` with ``metadata`` (0-d unicode array holding JSON) and the float64/int64
arrays of ``GateStats.arrays()``. The version hash is sha256 over the canonical JSON of the metadata
(sorted keys, no whitespace, hash field excluded) followed by each array's name, dtype, shape and
little-endian bytes in name order; it is stored in the metadata and re-checked on load
(``gatefile.load_gate``), so a truncated, edited or bit-flipped file is refused rather than trusted.

This module knows a gate only by the parts it writes (``GateContent``), not the ``Gate`` class, so
``Gate.version_hash`` and ``Gate.save`` use it and ``gatefile`` (which builds Gates) sits above both.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from typing import IO, Any, Protocol

import numpy as np
import numpy.typing as npt

from dualloop.ood.actuation import ActuationCheck
from dualloop.ood.calibrate import FeatureRange, NormBand, ThresholdCalibration
from dualloop.ood.filter import FilterSettings
from dualloop.ood.fit import GateStats
from dualloop.ood.freeze import FreezeSettings
from dualloop.ood.schema import FeatureSchema, ModelRef
from dualloop.ood.sites import SiteRows

FORMAT_NAME = "dualloop.ood.gate"
# 2: change limits in unit/s (ood.ChangeTracker's rates), not per observation at the fitting rate
FORMAT_VERSION = 2
INT_ARRAYS = ("class_labels",)
CALIBRATION_ROWS = "calibration_rows"  # optional: (k, dim) float32
SITE_ROWS, SITE_INDEX = "site_rows", "site_index"  # optional: (k, dim) float32 and (k,) int64
ARRAY_NAMES = (
    "center",
    "covariance",
    "whiten",
    "class_labels",
    "class_means",
    "class_offsets",
    "bg_covariance",
    "bg_whiten",
)
META_KEYS = (
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


class GateContent(Protocol):
    """What a gate file holds (``Gate`` has these fields); read-only, as a frozen dataclass's are."""

    @property
    def stats(self) -> GateStats: ...
    @property
    def calibration(self) -> ThresholdCalibration: ...
    @property
    def norm_band(self) -> NormBand: ...
    @property
    def filter(self) -> FilterSettings: ...
    @property
    def schema(self) -> FeatureSchema: ...
    @property
    def feature_range(self) -> FeatureRange | None: ...
    @property
    def actuation(self) -> ActuationCheck | None: ...
    @property
    def freeze(self) -> FreezeSettings | None: ...
    @property
    def calibration_rows(self) -> npt.NDArray[Any] | None: ...
    @property
    def model(self) -> ModelRef | None: ...
    @property
    def site_rows(self) -> SiteRows | None: ...


def canonical_arrays(gate: GateContent) -> dict[str, npt.NDArray[Any]]:
    """The arrays as stored and hashed: little-endian int64 labels, float64 statistics, the optional
    calibration and site rows as little-endian float32 (what the sensors send), C order."""
    out = {}
    for name, arr in gate.stats.arrays().items():
        dtype = "<i8" if name in INT_ARRAYS else "<f8"
        out[name] = np.ascontiguousarray(arr, dtype=dtype)
    if gate.calibration_rows is not None:  # absent without: a gate without rows keeps the entries it had
        out[CALIBRATION_ROWS] = np.ascontiguousarray(gate.calibration_rows, dtype="<f4")
    if gate.site_rows is not None:
        out[SITE_ROWS] = np.ascontiguousarray(gate.site_rows.rows, dtype="<f4")
        out[SITE_INDEX] = np.ascontiguousarray(gate.site_rows.site, dtype="<i8")
    return out


def metadata(gate: GateContent) -> dict[str, Any]:
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
    if gate.freeze is not None:
        meta["freeze"] = gate.freeze.to_dict()
    if gate.model is not None:  # absent in files written before gates recorded their model
        meta["model"] = gate.model.to_dict()
    if gate.site_rows is not None:  # absent without: older files keep their hash
        meta["sites"] = list(gate.site_rows.names)
    return meta


def canonical_json(meta: dict[str, Any]) -> str:
    # allow_nan=False: Infinity/NaN are not JSON and would make the file unreadable elsewhere.
    return json.dumps(meta, sort_keys=True, separators=(",", ":"), allow_nan=False)


def digest(meta: dict[str, Any], arrays: dict[str, npt.NDArray[Any]]) -> str:
    """The version hash of canonical metadata and arrays (see the module docstring)."""
    h = hashlib.sha256(canonical_json(meta).encode("utf-8"))
    for name in sorted(arrays):
        arr = arrays[name]
        h.update(f"\0{name}\0{arr.dtype.str}\0{list(arr.shape)}\0".encode())
        h.update(arr.tobytes(order="C"))
    return h.hexdigest()


def content_hash(gate: GateContent) -> str:
    return digest(metadata(gate), canonical_arrays(gate))


def _temp_beside(path: str) -> tuple[IO[bytes], str]:
    """A new temp file in ``path``'s folder (the rename is then atomic), created as a plain open creates
    a file: mode 0o666 less the umask. mkstemp made it 0600, so a gate fitted on the host was unreadable
    to the container's user (uid 10001) it was mounted into, where the shipped gates are 644."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"{path}: no folder {directory} to write the gate in; make it first")
    for _ in range(100):
        tmp = os.path.join(directory, f".gate-{secrets.token_hex(6)}.npz.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:  # another writer's name: draw again
            continue
        return os.fdopen(fd, "wb"), tmp
    raise FileExistsError(f"{path}: no free temp file name in {directory}")


def save_gate(gate: GateContent, path: str | os.PathLike[str]) -> str:
    """Write atomically (temp file + rename) so a reader never sees half a gate. Returns the hash."""
    path = os.fspath(path)
    meta = metadata(gate)
    arrays = canonical_arrays(gate)
    version_hash = digest(meta, arrays)
    # Any: np.savez's stub reads a ** dict as if it might hold its allow_pickle flag
    entries: dict[str, Any] = {"metadata": np.array(canonical_json({**meta, "version_hash": version_hash})), **arrays}
    f, tmp = _temp_beside(path)
    try:
        with f:
            np.savez_compressed(f, **entries)  # file handle: no ".npz" appended
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return version_hash
