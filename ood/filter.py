"""Sequential filters over per-tick exceedances, one state per session slot.

A calibrated threshold at alpha = 1e-3 still fires on ~1 in 1000 in-distribution ticks, i.e.
every 5 s at 200 Hz. The filter turns isolated spikes into nothing and a sustained shift into
an alarm after a known, small number of ticks. It sees only booleans (score > threshold), so it
works unchanged for every scoring variant (relative Mahalanobis scores can be negative).

Same-tick bypass: ``update(exceed, immediate=...)`` ORs ``immediate`` (NaN/Inf rows, norm-guard
hits) into the returned alarm without waiting; those rows are also counted as exceedances
(their score is +inf), so a sustained fault keeps alarming through the filter afterwards.

Detection delay (ticks from the first exceeding tick to the alarm, 0 = same tick, starting from a
clean state and a step input that exceeds every tick; multiply by the tick period, 5 ms):

* k-of-n: alarm when at least k of the last n ticks exceeded. Step delay = k - 1.
  An isolated single-tick spike never alarms for k >= 2. After the step ends the alarm clears
  after n - k + 1 clean ticks. Per-tick false-alarm probability for i.i.d. exceedances with rate
  p is exactly P(Binomial(n, p) >= k), e.g. k=3, n=5, p=1e-3: ~1e-8 (~0.007 per hour at 200 Hz).
* CUSUM (Bernoulli, in tick units): S <- clip(S + 1 if exceed else S - down, 0, cap), alarm when
  S >= h. Step delay = ceil(h) - 1. An isolated spike adds 1 < h (h > 1), so never alarms, and
  spikes at least ceil(1/down) + 1 ticks apart never accumulate. With cap = h (default) the alarm
  clears on the first clean tick; a larger cap holds it ceil((cap - h) / down) + 1 ticks longer.

Slots: one state per session slot. ``update(..., slots=idx)`` touches only those slots, so
sessions that did not tick keep their state; ``reset(slot)`` clears a slot for a new session.
Do not repeat a slot within one ``slots`` array.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

# S is a sum of +1 and -down steps; rounding must not delay an alarm at exactly S == h.
_CUSUM_EPS = 1e-9


@dataclass(frozen=True)
class KOfNSettings:
    k: int = 3
    n: int = 5
    kind: str = "k_of_n"

    def __post_init__(self) -> None:
        if not (isinstance(self.k, int) and isinstance(self.n, int)) or not 1 <= self.k <= self.n <= 64:
            raise ValueError(f"k-of-n filter needs integers 1 <= k <= n <= 64, got k={self.k}, n={self.n}")

    def step_delay_ticks(self) -> int:
        return self.k - 1

    def release_ticks(self) -> int:
        return self.n - self.k + 1

    def false_alarm_probability(self, p: float) -> float:
        """Per-tick alarm probability for i.i.d. exceedances with rate p (exact marginal)."""
        return float(sum(math.comb(self.n, j) * p**j * (1 - p) ** (self.n - j) for j in range(self.k, self.n + 1)))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "k": self.k, "n": self.n}


@dataclass(frozen=True)
class CusumSettings:
    h: float = 3.0
    down: float = 0.5
    cap: float | None = None  # None -> h
    kind: str = "cusum"

    def __post_init__(self) -> None:
        if not (self.h >= 1.0 and self.down > 0.0 and math.isfinite(self.h)):
            raise ValueError(f"CUSUM needs h >= 1 and down > 0, got h={self.h}, down={self.down}")
        if self.cap is not None and self.cap < self.h:
            raise ValueError(f"CUSUM cap must be >= h, got cap={self.cap}, h={self.h}")

    @property
    def effective_cap(self) -> float:
        return float(self.h if self.cap is None else self.cap)

    def step_delay_ticks(self) -> int:
        return math.ceil(self.h - _CUSUM_EPS) - 1

    def release_ticks(self) -> int:
        return math.ceil((self.effective_cap - self.h) / self.down - _CUSUM_EPS) + 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "h": float(self.h),
            "down": float(self.down),
            "cap": None if self.cap is None else float(self.cap),
        }


FilterSettings = KOfNSettings | CusumSettings


def filter_settings_from_dict(d: dict[str, Any]) -> FilterSettings:
    kind = d.get("kind")
    if kind == "k_of_n":
        return KOfNSettings(k=int(d["k"]), n=int(d["n"]))
    if kind == "cusum":
        cap = d.get("cap")
        return CusumSettings(h=float(d["h"]), down=float(d["down"]), cap=None if cap is None else float(cap))
    raise ValueError(f"unknown filter kind {kind!r}; expected 'k_of_n' or 'cusum'")


_State = TypeVar("_State", int, float)  # a slot's state: k-of-n bits, or a CUSUM statistic


class _SlotFilter(Generic[_State]):
    """One state per session slot, kept as Python numbers: a tick has few rows (one per session),
    and for few rows one numpy call costs more than the whole update in Python. The rule itself
    is ``advance``; ``update`` applies it to arrays, ``step`` to lists (the executor's gate bank)."""

    _zero: _State

    def __init__(self, n_slots: int) -> None:
        if n_slots < 1:
            raise ValueError(f"n_slots must be >= 1, got {n_slots}")
        self.n_slots = int(n_slots)
        self._state: list[_State] = [self._zero] * self.n_slots

    @cached_property
    def advance(self) -> Callable[[_State, bool, bool], tuple[_State, bool]]:
        """The per-tick rule for one slot: ``advance(state, exceed, immediate) -> (new state, alarm)``."""
        raise NotImplementedError

    def alarmed(self, state: _State) -> bool:
        """A slot in this state alarms on the filter alone (what ``advance`` said without ``immediate``)."""
        raise NotImplementedError

    def update(
        self, exceed: np.ndarray, immediate: np.ndarray | None = None, slots: np.ndarray | list[int] | None = None
    ) -> np.ndarray:
        """Advance the slots in ``slots`` (None: all, in order) by one tick; the alarm per row."""
        e = np.asarray(exceed, dtype=bool)
        rows = range(self.n_slots) if slots is None else np.asarray(slots, dtype=np.intp).tolist()
        if e.shape != (len(rows),):
            raise ValueError(f"filter got {e.size} exceedances for {len(rows)} slots")
        imm = [False] * len(rows) if immediate is None else np.asarray(immediate, dtype=bool).tolist()
        return np.array(self.step(rows, e.tolist(), imm), dtype=bool)

    def step(self, slots: Sequence[int], exceed: Sequence[bool], immediate: Sequence[bool]) -> list[bool]:
        """``update`` on Python sequences: the alarm per row."""
        state, advance, alarm = self._state, self.advance, []
        for slot, e, i in zip(slots, exceed, immediate):
            state[slot], a = advance(state[slot], e, i)
            alarm.append(a)
        return alarm

    @property
    def zero(self) -> _State:
        """A fresh slot's state."""
        return self._zero

    @property
    def slot_states(self) -> list[_State]:
        """The live per-slot state (a gate bank advances it in place with ``advance``); the list
        object itself is never replaced."""
        return self._state

    @property
    def state(self) -> np.ndarray:
        """Every slot's state (a copy, for tests and debugging)."""
        return np.array(self._state)

    def reset(self, slot: int | np.ndarray) -> None:
        for s in np.atleast_1d(np.asarray(slot, dtype=np.intp)).tolist():
            self._state[s] = self._zero


class KOfNFilter(_SlotFilter[int]):
    """Alarm when >= k of a slot's last n updates exceeded.

    Each slot's window is the low n bits of one integer (newest tick in bit 0), so an update is a
    shift, an OR and a popcount, with no ring buffer.
    """

    _zero = 0

    def __init__(self, settings: KOfNSettings, n_slots: int) -> None:
        super().__init__(n_slots)
        if settings.n > 64:
            raise ValueError(f"k-of-n window is limited to 64 ticks, got n={settings.n}")
        self.settings = settings
        self._mask = (1 << settings.n) - 1
        self._k = settings.k

    @cached_property
    def advance(self) -> Callable[[int, bool, bool], tuple[int, bool]]:
        mask, k = self._mask, self._k

        def advance(bits: int, exceed: bool, immediate: bool) -> tuple[int, bool]:
            bits = ((bits << 1) | exceed) & mask
            return bits, bits.bit_count() >= k or immediate

        return advance

    def alarmed(self, bits: int) -> bool:
        """A slot in this state alarms on its window alone (without an immediate hit)."""
        return bits.bit_count() >= self._k

    def scan(self, exceed: np.ndarray, immediate: np.ndarray | None, slot: int) -> np.ndarray:
        """``update`` of one slot over many consecutive ticks (replay), vectorised: the alarm per
        tick, and the slot's window left as tick-by-tick updates would leave it."""
        e = np.asarray(exceed, dtype=bool)
        if e.size == 0:
            return np.zeros(0, dtype=bool)
        n, bits = self.settings.n, int(self._state[slot])
        # the n - 1 ticks before this scan, oldest first (bit 0 is the newest), then the new ones
        seq = np.concatenate([[(bits >> j) & 1 for j in range(n - 2, -1, -1)], e]).astype(np.int64)
        total = np.concatenate([[0], np.cumsum(seq)])
        alarm: npt.NDArray[np.bool_] = (total[n:] - total[:-n]) >= self._k  # windows ending at each new tick
        if immediate is not None:
            alarm |= np.asarray(immediate, dtype=bool)
        last = seq[-n:][::-1]  # newest first
        self._state[slot] = sum(int(b) << j for j, b in enumerate(last))
        return alarm


class CusumFilter(_SlotFilter[float]):
    """Bernoulli CUSUM on exceedances: +1 per exceeding tick, -down per clean tick."""

    _zero = 0.0

    def __init__(self, settings: CusumSettings, n_slots: int) -> None:
        super().__init__(n_slots)
        self.settings = settings
        self._alarm_level = settings.h - _CUSUM_EPS
        self._cap = settings.effective_cap
        self._down = -float(settings.down)

    @cached_property
    def advance(self) -> Callable[[float, bool, bool], tuple[float, bool]]:
        down, cap, level = self._down, self._cap, self._alarm_level

        def advance(stat: float, exceed: bool, immediate: bool) -> tuple[float, bool]:
            stat = min(max(stat + (1.0 if exceed else down), 0.0), cap)
            return stat, stat >= level or immediate

        return advance

    def alarmed(self, stat: float) -> bool:
        """A slot in this state alarms on its statistic alone (without an immediate hit)."""
        return stat >= self._alarm_level

    def scan(self, exceed: np.ndarray, immediate: np.ndarray | None, slot: int) -> np.ndarray:
        """``update`` of one slot over many consecutive ticks (replay): the alarm per tick, and the
        slot's statistic left as tick-by-tick updates would leave it. The recursion clips, so it is
        a plain loop over Python floats (same float64 arithmetic as ``update``)."""
        s, down, cap, level = float(self._state[slot]), self._down, self._cap, self._alarm_level
        out = []
        for e in np.asarray(exceed, dtype=bool).tolist():
            s = min(max(s + (1.0 if e else down), 0.0), cap)
            out.append(s >= level)
        self._state[slot] = s
        alarm = np.array(out, dtype=bool)
        if immediate is not None:
            alarm |= np.asarray(immediate, dtype=bool)
        return alarm

    @property
    def statistic(self) -> np.ndarray:
        """Current CUSUM value per slot (read-only copy, for snapshots and debugging)."""
        return self.state


def make_filter(settings: FilterSettings, n_slots: int) -> KOfNFilter | CusumFilter:
    if isinstance(settings, KOfNSettings):
        return KOfNFilter(settings, n_slots)
    if isinstance(settings, CusumSettings):
        return CusumFilter(settings, n_slots)
    raise TypeError(f"unknown filter settings {settings!r}")
