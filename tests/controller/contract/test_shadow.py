"""Shadow agreement: the vectorised update (replay reports) counts exactly what tick-by-tick updates do."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.controller.contract.shadow import ShadowAgreement


def test_update_many_equals_updates():
    rng = np.random.default_rng(3)
    n, actions = 500, ["brake", "keep", "go"]
    applied = rng.integers(-1, 3, n)
    actual = rng.integers(-1, 3, n)
    applied_controls = rng.normal(size=(n, 2))
    actual_controls = rng.normal(size=(n, 2))
    actual_controls[rng.random(n) < 0.2] = np.nan  # ticks whose actual action had no controls
    states = rng.choice(["NOMINAL", "VETO_HOLD", "RECOVERING"], n).tolist()
    pool = [(), ("OOD_VETO",), ("LOW_MARGIN",), ("OOD_VETO", "FALLBACK")]
    reasons = [pool[k] for k in rng.integers(0, len(pool), n)]
    one, many = ShadowAgreement(actions, 2), ShadowAgreement(actions, 2)
    for k in range(n):
        controls = None if np.isnan(actual_controls[k]).any() else actual_controls[k]
        one.update(int(applied[k]), applied_controls[k], int(actual[k]), controls, states[k], reasons[k])
    many.update_many(applied, applied_controls, actual, actual_controls, states, reasons)
    a, b = one.as_dict(), many.as_dict()
    assert list(a["groups"]) == list(b["groups"]) and len(a["groups"]) == 7  # same groups, same order
    assert a["confusion"] == b["confusion"] and a["ticks_without_actual"] == b["ticks_without_actual"] > 0
    for key, g in a["groups"].items():
        h = b["groups"][key]
        assert (g["ticks"], g["agreement"]) == (h["ticks"], h["agreement"])
        assert g["control_mae"] == pytest.approx(h["control_mae"]) and g["control_rmse"] == pytest.approx(
            h["control_rmse"]
        )


def _update_many_tick_by_tick(
    agreement: ShadowAgreement, applied, applied_controls, actual, actual_controls, states, reasons
) -> None:  # type: ignore[no-untyped-def]
    """`update_many`'s definition, each tick's groups found in Python: the reference for its exact sums."""
    rows = [i for i in range(len(actual)) if actual[i] >= 0]
    agreement.without_actual += len(actual) - len(rows)
    for i in rows:
        if applied[i] >= 0:
            agreement.confusion[actual[i], applied[i]] += 1
    err = np.asarray(applied_controls, np.float64)[rows] - np.asarray(actual_controls, np.float64)[rows]
    with_controls = np.isfinite(err).all(axis=1)
    err[~with_controls] = 0.0
    members: dict[str, list[int]] = {}  # first seen first, as `update` creates them
    for j, i in enumerate(rows):
        for key in ("all", f"state:{states[i]}", *(f"reason:{r}" for r in reasons[i])):
            m = members.setdefault(key, [])
            if not m or m[-1] != j:
                m.append(j)
    agree = np.asarray(applied)[rows] == np.asarray(actual)[rows]
    for key, m in members.items():
        e, w = err[m], with_controls[m]
        agreement._add(
            key,
            len(m),
            int(np.count_nonzero(agree[m])),
            int(np.count_nonzero(w)),
            np.abs(e[w]).sum(axis=0),
            (e[w] * e[w]).sum(axis=0),
        )


@pytest.mark.parametrize("seed", range(4))
def test_update_many_gives_the_exact_sums_of_each_group(seed: int) -> None:
    """Runs of ticks sharing their state and reason objects, equal pairs in distinct objects, a pair
    coming back after others, ticks without the actual action; one tick, none."""
    rng = np.random.default_rng(seed)
    actions = ["brake", "keep", "go"]
    pool = [(), ("OOD_VETO",), ("LOW_MARGIN",), ("OOD_VETO", "FALLBACK")]
    for n in (0, 1, 2, 3000):
        runs = rng.integers(1, 60, n) if n else np.zeros(0, np.int64)
        states, reasons = [], []
        while len(states) < n:
            state = str(rng.choice(["NOMINAL", "VETO_HOLD", "RECOVERING"]))
            tick_reasons = pool[rng.integers(0, len(pool))]
            if rng.random() < 0.3:  # an equal pair in new objects
                state, tick_reasons = "".join(state), tuple(list(tick_reasons))
            k = int(runs[len(states)])
            states += [state] * k
            reasons += [tick_reasons] * k
        states, reasons = states[:n], reasons[:n]
        applied, actual = rng.integers(-1, 3, n), rng.integers(-1, 3, n)
        actual[: n // 10] = -1
        applied_controls, actual_controls = rng.normal(size=(n, 2)), rng.normal(size=(n, 2))
        actual_controls[rng.random(n) < 0.2] = np.nan
        many, ref = ShadowAgreement(actions, 2), ShadowAgreement(actions, 2)
        many.update_many(applied, applied_controls, actual, actual_controls, states, reasons)
        _update_many_tick_by_tick(ref, applied, applied_controls, actual, actual_controls, states, reasons)
        assert many.as_dict() == ref.as_dict() and list(many.groups) == list(ref.groups)
