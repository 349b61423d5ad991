"""Site-conformal calibration: a threshold that ordinary driving at a site the gate never saw stays under.

A threshold calibrated on rows of one distribution (simulated driving) holds its false-veto rate on
that distribution only; real drives from a new site score higher (NGSIM's stop-and-go queues score a
median 180 under the shipped input gate, simulated driving's threshold is 460, and 0.9% of NGSIM's
rows exceed it). Calibrating on pooled real rows does not help either: the sites with most rows set
the quantile, and a new site is not another row of them but another site.

So sites are the exchangeable units. Each site's own (1 - alpha) conformal quantile is computed, and
the threshold is their maximum: if the next site is exchangeable with K calibration sites, the
chance that its own quantile lies above all K is at most 1 / (K + 1). Leaving each site out in turn
(``dualloop eval-logs --leave-one-out``) measures what that bound leaves unsaid. A site with fewer rows
than the alpha needs cannot state its quantile and is not counted.

Only feature matrices and site labels are known here; which rows a site measures is the NaN in them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from dualloop.ood.calibrate import calibrate_threshold


@dataclass(frozen=True, eq=False)  # holds numpy arrays
class SiteRows:
    """Rows of ordinary real driving, each labelled with its site; NaN where a site does not measure a
    feature. Stored with a raw-input gate so that each sensor profile's threshold covers them
    (``ood.marginal.profile_gate``)."""

    rows: npt.NDArray[np.float32]  # (k, dim)
    site: npt.NDArray[np.int64]  # (k,) index into names
    names: tuple[str, ...]

    def __post_init__(self) -> None:
        if self.rows.ndim != 2 or self.site.shape != (self.rows.shape[0],):
            raise ValueError(f"site rows: (k, dim) rows and (k,) sites, got {self.rows.shape} and {self.site.shape}")
        if len(self.site) and (self.site.min() < 0 or self.site.max() >= len(self.names)):
            raise ValueError(f"site rows: site indices must be in 0..{len(self.names) - 1}")

    def describe(self) -> str:
        counts = np.bincount(self.site, minlength=len(self.names))
        return ", ".join(f"{name} ({int(n)} rows)" for name, n in zip(self.names, counts))


def sample_site_rows(rows: npt.ArrayLike, sites: npt.ArrayLike, per_site: int) -> SiteRows:
    """At most ``per_site`` rows of each site, evenly spaced through its rows (neighbouring observations
    of a drive say little more than one of them); sites in name order."""
    x = np.asarray(rows, np.float32)
    labels = np.asarray(sites, dtype=str)
    if x.ndim != 2 or labels.shape != (x.shape[0],):
        raise ValueError(f"site rows: (n, dim) rows and (n,) sites, got {x.shape} and {labels.shape}")
    names = tuple(sorted(set(labels.tolist())))
    picked, index = [], []
    for i, name in enumerate(names):
        at = np.flatnonzero(labels == name)
        if len(at) > per_site:
            at = at[np.unique(np.linspace(0, len(at) - 1, per_site).round().astype(np.intp))]
        picked.append(x[at])
        index.append(np.full(len(at), i, np.int64))
    if not names:
        return SiteRows(np.zeros((0, x.shape[1]), np.float32), np.zeros(0, np.int64), ())
    return SiteRows(np.ascontiguousarray(np.concatenate(picked)), np.concatenate(index), names)


def site_quantiles(scores: npt.ArrayLike, site: npt.ArrayLike, names: Sequence[str], alpha: float) -> dict[str, float]:
    """Each site's (1 - alpha) conformal quantile of its rows' scores; a site with too few rows for the
    alpha is left out."""
    s = np.asarray(scores, np.float64)
    at = np.asarray(site)
    out = {}
    for i, name in enumerate(names):
        mine = s[at == i]
        try:
            out[name] = calibrate_threshold(mine, alpha, f"site {name}").threshold
        except ValueError:  # too few rows to state the quantile
            continue
    return out


def site_threshold(scores: npt.ArrayLike, site: npt.ArrayLike, names: Sequence[str], alpha: float) -> float | None:
    """The largest of the sites' quantiles (module docstring); None when no site has enough rows."""
    quantiles = site_quantiles(scores, site, names, alpha)
    return max(quantiles.values()) if quantiles else None
