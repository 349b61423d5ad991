"""Shadow agreement: the vectorised update (replay reports) counts exactly what tick-by-tick updates do."""

from __future__ import annotations

import numpy as np
import pytest

from dualloop.controller.serve.shadow import ShadowAgreement


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
