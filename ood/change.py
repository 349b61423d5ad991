"""The change of each feature since the previous fresh observation, per session slot.

A noisy sensor still reports plausible values one at a time; what gives it away is how far they jump
from one observation to the next (a 3 m/s speed change in 5 ms). A gate's change limits
(``FeatureRange.change_low/high``) check these changes.

Rules, the same for a live tick (``step``) and a replay (``scan``):
- only a fresh observation makes a new change; a tick that reuses an observation reports the change
  it made (a 100 Hz sensor on 200 Hz ticks is not standing still);
- the change is measured from the last *finite* fresh observation, in float64 of the float32 values;
- it is NaN (unknown: no limit can be broken) for a non-finite observation, whose NaN the gate vetoes
  anyway, and for a slot's first finite observation, which has nothing to compare with.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from functools import partial
from operator import sub as _sub

import numpy as np

from dualloop.ood import compiled


class ChangeTracker:
    """Per slot, as Python floats (a tick has few rows; a numpy call costs more than the arithmetic):
    the last finite fresh observation (None before the first) and the last change."""

    step: Callable[[np.ndarray, Sequence[int], Sequence[bool], Sequence[bool]], list[list[float]]]
    """``step(x, slots, fresh, finite)``: x (rows, dim) float32 raw features of the rows ticking now;
    their changes, one list of floats per row (the scorer takes them as they are; ``np.array`` makes
    the (rows, dim) array). The lists are the tracker's own: read them, do not change them. This
    instance's loop: the compiled one (ood/_tick.c) when built, called directly, else ``_step_python``."""

    def __init__(self, n_slots: int, dim: int) -> None:
        self.dim = dim
        self._unknown = [math.nan] * dim
        self._last: list[list[float] | None] = [None] * n_slots
        self._change: list[list[float]] = [self._unknown] * n_slots
        module = compiled.module()
        self.is_compiled = module is not None
        self.step = (
            self._step_python
            if module is None
            else partial(module.change_step, self._step_python, self._last, self._change, self._unknown)
        )

    def _step_python(
        self, x: np.ndarray, slots: Sequence[int], fresh: Sequence[bool], finite: Sequence[bool]
    ) -> list[list[float]]:
        """``step`` in Python: the reference, and the C loop's path for rows that are not float32."""
        last, change, out = self._last, self._change, []
        for slot, now, is_fresh, ok in zip(slots, x.tolist(), fresh, finite):
            if is_fresh:
                before = last[slot]
                if not ok:
                    change[slot] = self._unknown
                else:
                    change[slot] = self._unknown if before is None else list(map(_sub, now, before))
                    last[slot] = now
            out.append(change[slot])
        return out

    def scan(self, x: np.ndarray, finite: np.ndarray, slot: int) -> np.ndarray:
        """``step`` for consecutive fresh observations of one slot (a replay: each row is fresh once):
        x (n, dim), finite (n,). Returns the change per row (n, dim) float64 and leaves the slot as
        row-by-row steps would."""
        x64 = np.asarray(x, np.float32).astype(np.float64)
        finite = np.asarray(finite, bool)
        n = len(x64)
        if n == 0:
            return np.zeros((0, self.dim))
        idx = np.where(finite, np.arange(n), -1)
        prev_idx = np.concatenate([[-1], np.maximum.accumulate(idx)[:-1]])  # last finite row before each
        before = self._last[slot]
        start = np.full(self.dim, np.nan) if before is None else np.array(before, np.float64)
        prev = np.where((prev_idx >= 0)[:, None], x64[np.maximum(prev_idx, 0)], start[None, :])
        change = np.where(finite[:, None], x64 - prev, np.nan)
        finite_rows = np.flatnonzero(finite)
        if finite_rows.size:
            self._last[slot] = x64[finite_rows[-1]].tolist()
        self._change[slot] = change[-1].tolist()
        return change

    @property
    def state(self) -> tuple[list[list[float] | None], np.ndarray]:
        """(last finite observation or None, last change) per slot (copies, for tests)."""
        return [None if v is None else list(v) for v in self._last], np.array(self._change)

    def reset(self, slot: int) -> None:
        self._last[slot] = None
        self._change[slot] = self._unknown
