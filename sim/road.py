"""Road geometry in Frenet coordinates, one road per episode of a batch.

s is the distance along the reference line (centre of lane 0, the rightmost lane), d is the
lateral offset, + = left; lane k has its centre at d = k * lane_width. Curvature is piecewise
linear in s on a fixed knot grid (clothoid transitions, so steering never sees a step), which keeps
the lookup a couple of vectorised ops for a whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

KNOT_SPACING_M: float = 100.0
DEFAULT_LENGTH_M: float = 4000.0


@dataclass
class Road:
    n_lanes: int
    lane_width: float
    curvature_knots: FloatArray  # (B, K) curvature at s = k * knot_spacing, 1/m
    lane_end_s: FloatArray  # (B, n_lanes) s where a lane ends (on-ramps), inf if it never does
    knot_spacing: float = KNOT_SPACING_M

    def __post_init__(self) -> None:
        # The road never changes, so hot-path lookups use precomputed flat views.
        self.batch = int(self.curvature_knots.shape[0])
        self.has_lane_ends = bool(np.isfinite(self.lane_end_s).any())
        self._n_knots = self.curvature_knots.shape[1]
        self._flat_knots = np.ascontiguousarray(self.curvature_knots).ravel()
        self._row_base = np.arange(self.batch) * self._n_knots
        self._x_max = self._n_knots - 1 - 1e-9

    def curvature(self, s: FloatArray) -> FloatArray:
        """Curvature at s for each episode; s is (B,) or (B, M)."""
        x = np.minimum(np.maximum(s * (1.0 / self.knot_spacing), 0.0), self._x_max)
        i = x.astype(np.int64)
        frac = x - i
        base = self._row_base if s.ndim == 1 else self._row_base[:, None]
        idx = i + base
        k0 = self._flat_knots[idx]
        return k0 + (self._flat_knots[idx + 1] - k0) * frac

    def lane_centre(self, lane: npt.ArrayLike) -> FloatArray:
        return np.asarray(lane, dtype=np.float64) * self.lane_width

    def lane_of(self, d: FloatArray) -> npt.NDArray[np.int64]:
        """Index of the lane whose centre is nearest to d (clipped to the road)."""
        return np.clip(np.rint(d / self.lane_width), 0, self.n_lanes - 1).astype(np.int64)

    def lane_exists(self, lane: npt.NDArray[np.int64], s: FloatArray) -> npt.NDArray[np.bool_]:
        """Whether lane index `lane` (B,) is a real lane at position s (B,)."""
        inside = (lane >= 0) & (lane < self.n_lanes)
        safe = np.clip(lane, 0, self.n_lanes - 1)
        end = self.lane_end_s[np.arange(self.batch), safe]
        return inside & (s < end)


def random_curvature(
    rng: np.random.Generator, length_m: float = DEFAULT_LENGTH_M, max_curvature: float = 1.0 / 600.0
) -> FloatArray:
    """Alternating straights and gentle curves (radius >= 600 m), as knot values for one road."""
    n_knots = int(length_m / KNOT_SPACING_M) + 2
    knots = np.zeros(n_knots)
    k = 1  # the first knot stays straight so episodes start settled
    while k < n_knots:
        straight = int(rng.integers(2, 6))
        k += straight
        curve = int(rng.integers(2, 6))
        value = rng.uniform(0.3, 1.0) * max_curvature * rng.choice((-1.0, 1.0))
        knots[k : k + curve] = value
        k += curve
    return knots


def make_road(
    curvature_rows: list[FloatArray],
    n_lanes: int = 3,
    lane_width: float = 3.5,
    lane_end_rows: list[FloatArray] | None = None,
) -> Road:
    """Stack per-episode curvature knots (and optional lane ends) into one batched Road."""
    knots = np.stack([np.asarray(r, dtype=np.float64) for r in curvature_rows])
    if lane_end_rows is None:
        ends = np.full((knots.shape[0], n_lanes), np.inf)
    else:
        ends = np.stack([np.asarray(r, dtype=np.float64) for r in lane_end_rows])
    return Road(n_lanes=n_lanes, lane_width=lane_width, curvature_knots=knots, lane_end_s=ends)
