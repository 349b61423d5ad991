"""DecisionSnapshot.checks in process: a batch of sessions gives each the checks it would get alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.logs.logfile import read_log
from dualloop.controller.logs.synthetic import synthetic_log
from dualloop.controller.replay.lockstep import _observations
from dualloop.executor.checks import CheckBoard, CheckValues
from dualloop.executor.core import Executor
from dualloop.executor.snapshot import CHECK_DTYPE, Check, CheckStatus, Observation
from dualloop.executor.stuck_lead import LeadDoubt
from dualloop.ood.signal_settings import SignalSettings


@pytest.fixture(scope="module")
def features(tmp_path_factory) -> list[np.ndarray]:
    log = synthetic_log(Path(tmp_path_factory.mktemp("checks")) / "syn.mcap", seconds=3.0, rate_hz=100.0)
    return [o.features for o in _observations(read_log(log))[60:210]]


def _run(base_model, base_gates, features, sessions: list[str], profile: list[str]) -> dict[str, np.ndarray]:
    """REALTIME ticks of these sessions together ("p" measures only `profile`); each session's checks
    per tick, with ego_speed out of range at tick 70."""
    names = base_model.card.feature_names
    absent = [names.index(n) for n in names if n not in profile]
    ex = Executor(base_model, gate=base_gates)
    for sid in sessions:
        ex.open_session(sid, provided_features=profile if sid == "p" else None)
    out: dict[str, list[np.ndarray]] = {sid: [] for sid in sessions}
    for k, f in enumerate(features):
        for sid in sessions:
            x = f.copy()
            if sid == "p":
                x[absent] = np.nan
            if k == 70:
                x[0] = 200.0
            ex.submit(sid, Observation(seq=k + 1, timestamp_ns=k * 5_000_000, features=x, arrival_ns=k * 5_000_000))
        for s in ex.tick(k * 5_000_000 + 1):
            assert s.check_kinds == ex.checks.kinds and s.checks is not None
            out[s.session_id].append(s.checks.copy())
    return {sid: np.array(v) for sid, v in out.items()}


def test_a_mixed_batch_gives_each_session_its_own_checks(base_model, base_gates, features):
    profile = [n for n in base_model.card.feature_names if not n.startswith("right_")]
    mixed = _run(base_model, base_gates, features, ["a", "p"], profile)
    for sid in ("a", "p"):
        alone = _run(base_model, base_gates, features, [sid], profile)[sid]
        for name in ("veto", "status", "threshold"):
            assert (mixed[sid][name] == alone[name]).all(), (sid, name)
        np.testing.assert_allclose(mixed[sid]["score"], alone["score"], rtol=1e-6, atol=1e-9)
    kinds = list(Executor(base_model, gate=base_gates).checks.kinds)
    at = kinds.index(Check.INPUT_RANGE)
    for sid in ("a", "p"):
        assert mixed[sid]["veto"][70, at] and mixed[sid]["veto"][:, at].sum() == 1
        assert (mixed[sid]["status"][1:, kinds.index(Check.INPUT_DENSITY)] == CheckStatus.SCORED).all()
    # the sensor profile's own threshold, not the full gate's
    dens = kinds.index(Check.INPUT_DENSITY)
    assert mixed["p"]["threshold"][0, dens] != mixed["a"]["threshold"][0, dens]


@pytest.mark.parametrize("profiled", [False, True])
def test_python_and_numpy_assembly_give_the_same_bytes(base_model, base_gates, tmp_path, profiled):
    """The live tick's Python pass and the replay's numpy pass over the same values: every fault of the
    synthetic log (NaN, out of distribution, gaps), commands the car falls short of, a sensor profile."""
    from dualloop.controller.replay.lockstep import SessionOptions, run_replay

    log = synthetic_log(tmp_path / "faults.mcap", seconds=5.0, rate_hz=150.0, faults=True)
    obs = _observations(read_log(log))
    for k, o in enumerate(obs):
        accel = float(o.features[1]) if np.isfinite(o.features[1]) else 0.0
        o.actual_controls = None if 300 <= k < 330 else np.array([accel - (1.0 if k < 150 else 0.0), 0.0], np.float32)
    ex = Executor(base_model, gate=base_gates)
    seen: list[CheckValues] = []
    assemble = ex.checks.assemble

    def recording(values: CheckValues, vectorised: bool | None = None) -> np.ndarray:
        seen.append(values)
        return assemble(values, vectorised)

    ex.checks.assemble = recording  # type: ignore[method-assign]
    profile = [n for n in base_model.card.feature_names if not n.startswith("left_")] if profiled else None
    run_replay(ex, "s", obs, SessionOptions(actual_is_command=True, provided_features=profile))
    (values,) = seen
    numpy_pass = assemble(values, vectorised=True)
    python_pass = assemble(values, vectorised=False)
    assert len(numpy_pass) > 700 and numpy_pass.tobytes() == python_pass.tobytes()
    # the replay judged the range checks once per observation: as judged on every tick
    assert values.ranged is not None
    assert assemble(values._replace(ranged=None)).tobytes() == numpy_pass.tobytes()
    statuses = set(numpy_pass["status"].ravel().tolist())
    assert statuses == {CheckStatus.SCORED, CheckStatus.NOT_APPLICABLE, CheckStatus.NOT_SCORED}
    assert numpy_pass["veto"].any(axis=0).sum() >= 4  # several checks veto somewhere in the log


@pytest.mark.parametrize(
    ("vetoes", "doubt"),
    [
        ((), LeadDoubt.NONE),
        ((Check.GAP_REPEAT,), LeadDoubt.ONE_STUCK),
        ((Check.GAP_REPEAT, Check.GAP_RATE), LeadDoubt.ONE_STUCK),
        ((Check.REL_SIGN,), LeadDoubt.REL_AGAINST_TREND),
        ((Check.REL_SIGN, Check.GAP_RATE), LeadDoubt.REL_AGAINST_TREND),
        ((Check.REL_SIGN, Check.GAP_REPEAT), LeadDoubt.REL_AGAINST_TREND),  # the relative speed is read from nothing
        ((Check.GAP_RATE,), LeadDoubt.ALL),
        ((Check.REL_SIGN, Check.GAP_STEP), LeadDoubt.ALL),
        ((Check.GAP_REPEAT, Check.REL_ACCEL), LeadDoubt.REL_DOUBTED),
        ((Check.REL_UNIT,), LeadDoubt.REL_DOUBTED),
        ((Check.REL_UNIT, Check.REL_SIGN), LeadDoubt.REL_AGAINST_TREND),
        ((Check.REL_ACCEL, Check.GAP_RATE), LeadDoubt.REL_DOUBTED),
        ((Check.REL_UNIT, Check.GAP_STEP), LeadDoubt.ALL),
        ((Check.LEAD_FLICKER, Check.REL_SIGN), LeadDoubt.ALL),
        ((Check.SPEED_REPEAT,), LeadDoubt.NONE),  # the ego's readings: the lead's stay trusted
    ],
)
def test_what_the_lead_checks_vetoes_leave_the_threat_assessor(vetoes: tuple[Check, ...], doubt: LeadDoubt) -> None:
    """One of gap and relative speed doubted (a repeat; the relative speed's sign, unit or rate) is
    stood in for; any other lead check among the vetoes doubts the whole lead."""
    board = CheckBoard([], [], 0, None, SignalSettings().thresholds)
    table = np.zeros((1, len(board.kinds)), CHECK_DTYPE)
    for kind in vetoes:
        table["veto"][0, board.kinds.index(kind)] = True
    assert board.lead_doubt(table).tolist() == [doubt]
