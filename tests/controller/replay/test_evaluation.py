"""The replay's evaluation against the human's labels and the trivial baselines.

The constructed log below has eight observations whose features, labels and look-ahead
accelerations are chosen by hand; the baselines' scores depend on the observations only, so they
are checked against values worked out in the comments. The model's scores are checked against a
plain recomputation from the replay's own snapshots (the tick at each observation's timestamp)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dualloop.controller.cli import main
from dualloop.controller.logs.logfile import read_log, write_log
from dualloop.controller.logs.synthetic import REAL_DRIVE, synthetic_log
from dualloop.controller.replay import baselines as bl
from dualloop.controller.replay.evaluation import (
    SCHEMA,
    EvaluationReport,
    LogEvaluation,
    Scores,
    format_evaluation,
    from_replay_reports,
)
from dualloop.controller.replay.lockstep import replay_log
from dualloop.executor.action_labels import ACTIONS, action_of_accel
from dualloop.models import BASE_MODEL_PATH, DEFAULT_GATES, TEST_MODEL_PATH
from dualloop.sim import schema
from dualloop.v2 import controller_pb2 as pb
from dualloop.v2 import log_pb2

BH, BRAKE, KEEP, ACC = (ACTIONS.index(a) for a in ("brake_hard", "brake", "keep", "accelerate"))
PERIOD_NS = 10_000_000  # 100 Hz, on the 5 ms grid: every observation has a tick at its timestamp
NAN = float("nan")

# ego_accel, lead_present, lead_distance, lead_rel_speed, ego_speed, label, look-ahead accel
ROWS = [
    (0.0, 0, 150.0, 0.0, 20.0, KEEP, 0.2),
    (1.0, 0, 150.0, 0.0, 20.0, ACC, 0.8),
    (-1.0, 1, 20.0, -2.0, 20.0, BRAKE, -1.5),
    (-4.0, 1, 10.0, -5.0, 20.0, BH, -5.0),
    (0.3, 1, 40.0, 0.0, 20.0, KEEP, 0.0),
    (0.2, 1, 60.0, 1.0, 20.0, ACC, 0.6),
    (0.0, 0, 150.0, 0.0, 20.0, -1, None),  # no label: not scored
    (0.1, 0, 150.0, 0.0, 20.0, KEEP, None),  # a label without its look-ahead accel: no MAE
]
SCORED = 7
# The time-gap rule at 20 m/s wants 3 + 1.6 * 20 = 35 m:
#   row 2: 0.23 * (20 - 35) + 0.07 * -2 = -3.59 -> brake_hard (label brake)
#   row 3: 0.23 * (10 - 35) + 0.07 * -5 = -6.10 -> brake_hard (right)
#   row 4: 0.23 * (40 - 35)             =  1.15 -> accelerate (label keep)
#   row 5: 0.23 * (60 - 35) + 0.07 * 1  =  5.82 -> clipped to 3.0, accelerate (right)
#   rows 0, 1, 7 have no lead: 0 -> keep (right on 0 and 7)
TIME_GAP_ACCEL = [0.0, 0.0, -3.59, -6.10, 1.15, 3.0]  # rows 0-5, the rows with a look-ahead accel
LOOKAHEAD = [0.2, 0.8, -1.5, -5.0, 0.0, 0.6]
EGO_ACCEL = [0.0, 1.0, -1.0, -4.0, 0.3, 0.2]


def _features(base: np.ndarray, row: tuple) -> list[float]:
    x = base.copy()
    for name, v in zip(("ego_accel", "lead_present", "lead_distance", "lead_rel_speed", "ego_speed"), row[:5]):
        x[schema.FEATURE_INDEX[name]] = v
    return x.tolist()


def make_log(path, rows=ROWS, measured=schema.FEATURE_NAMES, filled=(), session_id="hand"):
    """A real MCAP log of `rows`; the other features are a real drive's first observation."""
    src = read_log(REAL_DRIVE)
    base = np.array(src.observations[0].features, np.float64)
    obs = []
    for i, row in enumerate(rows):
        msg = pb.Observation(seq=i + 1, timestamp_ns=1_000_000_000 + i * PERIOD_NS, features=_features(base, row))
        msg.actual.action_index = row[5]
        if row[6] is not None:
            msg.actual.controls.extend([row[6], 0.0])
        obs.append(msg)
    header = log_pb2.SessionHeader(
        session_id=session_id,
        clock=pb.CLOCK_MODE_LOCKSTEP,
        shadow=True,
        config_json="{}",
        source="constructed for the evaluation tests",
        feature_names=schema.FEATURE_NAMES,
        measured_features=list(measured),
        filled_features=list(filled),
        action_names=ACTIONS,
        control_names=schema.CONTROL_NAMES,
        tick_period_ns=PERIOD_NS,
        observation_period_ns=PERIOD_NS,
    )
    return write_log(path, header, obs)


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    log = make_log(tmp_path_factory.mktemp("eval") / "hand.mcap")
    result = replay_log(log, TEST_MODEL_PATH)
    return log, result, LogEvaluation.from_dict(result.report.evaluation)


# --- Scores on arrays -----------------------------------------------------------------------------


def test_balanced_accuracy_on_an_imbalanced_case():
    labels = [KEEP] * 8 + [BRAKE] * 2
    always_keep = Scores.of(4, labels, [KEEP] * 10, [NAN] * 10, [NAN] * 10, no_action_is_wrong=True)
    assert always_keep.agreement == pytest.approx(0.8)
    assert always_keep.balanced_accuracy == pytest.approx(0.5)  # keep 8/8, brake 0/2; the absent classes left out
    assert np.isnan(always_keep.recall[BH]) and np.isnan(always_keep.recall[ACC])
    one_brake = Scores.of(4, labels, [KEEP] * 7 + [BRAKE] + [BRAKE, KEEP], [NAN] * 10, [NAN] * 10, True)
    assert one_brake.agreement == pytest.approx(0.8)  # the same agreement ...
    assert one_brake.balanced_accuracy == pytest.approx((7 / 8 + 1 / 2) / 2)  # ... and a better balance


def test_a_missing_proposal_counts_as_wrong_and_a_baseline_na_is_left_out():
    labels, predicted = [KEEP, KEEP, BRAKE, -1], [KEEP, -1, -1, ACC]
    accel, pred_accel = [0.1, 0.2, -1.0, 0.0], [0.0, NAN, NAN, 1.0]
    model = Scores.of(4, labels, predicted, accel, pred_accel, no_action_is_wrong=True)
    assert (model.ticks, model.na_ticks, model.agreement) == (3, 0, pytest.approx(1 / 3))
    assert model.balanced_accuracy == pytest.approx((1 / 2 + 0) / 2)
    assert (model.accel_ticks, model.accel_mae) == (1, pytest.approx(0.1))  # the unlabelled tick is not scored
    baseline = Scores.of(4, labels, predicted, accel, pred_accel, no_action_is_wrong=False)
    assert (baseline.ticks, baseline.na_ticks, baseline.agreement, baseline.balanced_accuracy) == (1, 2, 1.0, 1.0)
    nothing = Scores.of(4, [KEEP], [-1], [0.0], [NAN], no_action_is_wrong=False)
    assert nothing.ticks == 0 and np.isnan(nothing.agreement) and np.isnan(nothing.balanced_accuracy)


# --- the constructed log --------------------------------------------------------------------------


def test_baselines_on_the_constructed_log_match_the_hand_computed_values(hand):
    _, _, ev = hand
    assert (ev.observations, ev.ticked, ev.labelled) == (8, 8, SCORED)
    keep, ego, gap = (ev.scores[b] for b in bl.BASELINES)
    # keep: right on the three keep labels; recall 1 for keep, 0 for the three other classes
    assert (keep.ticks, keep.agreement, keep.balanced_accuracy) == (SCORED, pytest.approx(3 / 7), 0.25)
    assert keep.accel_ticks == 6 and keep.accel_mae == pytest.approx(np.mean(np.abs(LOOKAHEAD)), rel=1e-6)
    # ego_accel: wrong only on row 5 (0.2 is keep, the label accelerate): recalls 1, 1/2, 1, 1
    assert (ego.ticks, ego.agreement) == (SCORED, pytest.approx(6 / 7))
    assert ego.balanced_accuracy == pytest.approx((1 + 0.5 + 1 + 1) / 4)
    assert ego.accel_mae == pytest.approx(np.mean(np.abs(np.subtract(EGO_ACCEL, LOOKAHEAD))), rel=1e-6)
    assert ego.accel_mae == pytest.approx(2.6 / 6, rel=1e-6)
    # time_gap: right on rows 0, 3, 5, 7; recalls keep 2/3, accelerate 1/2, brake 0, brake_hard 1
    assert (gap.ticks, gap.agreement) == (SCORED, pytest.approx(4 / 7))
    assert gap.balanced_accuracy == pytest.approx((2 / 3 + 1 / 2 + 0 + 1) / 4)
    assert gap.accel_mae == pytest.approx(7.74 / 6, rel=1e-5)
    assert gap.confusion[BRAKE, BH] == 1 and gap.confusion[KEEP, ACC] == 1 and gap.confusion[ACC, KEEP] == 1
    assert {m: ev.best_baseline(m) for m in ("agreement", "balanced_accuracy", "accel_mae")} == {
        "agreement": "ego_accel",
        "balanced_accuracy": "ego_accel",
        "accel_mae": "ego_accel",
    }


def test_the_time_gap_rule_is_the_documented_law():
    a = bl.time_gap_accel(
        np.array([0.0, 1.0, 1.0, 1.0, 1.0, NAN]),
        np.array([150.0, 20.0, 10.0, 40.0, 60.0, 20.0]),
        np.array([0.0, -2.0, -5.0, 0.0, 1.0, 0.0]),
        np.full(6, 20.0),
        (-8.0, 3.0),
    )
    np.testing.assert_allclose(a[:5], [0.0, *TIME_GAP_ACCEL[2:]], atol=1e-12)
    assert np.isnan(a[5])  # lead_present unknown: n/a, not "no lead"
    np.testing.assert_array_equal(bl.baseline_actions({"g": a})["g"], [KEEP, BH, BH, ACC, ACC, -1])


def _recompute_model(log, snaps, predictor):
    """The model's agreement, per-class recall and accel MAE from the snapshots, plainly."""
    at = {s.scheduled_time_ns: s for s in snaps}
    right, total, err = 0, {}, []
    hits = {}
    for msg in read_log(log).observations:
        y = msg.actual.action_index
        if y < 0:
            continue
        s = at[msg.timestamp_ns]  # the tick at the observation's timestamp
        assert s.observation_seq == msg.seq and not s.observation_held
        p = s.proposed_index if predictor == "proposed" else s.applied.index
        controls = s.proposed_controls if predictor == "proposed" else s.applied.controls
        right += p == y
        total[y] = total.get(y, 0) + 1
        hits[y] = hits.get(y, 0) + (p == y)
        if len(msg.actual.controls) and len(controls):
            err.append(abs(float(controls[0]) - msg.actual.controls[0]))
    return right / sum(total.values()), np.mean([hits[c] / total[c] for c in total]), np.mean(err)


@pytest.mark.parametrize("predictor", ["proposed", "applied"])
def test_model_scores_match_the_snapshots(hand, predictor):
    log, result, ev = hand
    agreement, balanced, mae = _recompute_model(log, result.snapshots, predictor)
    s = ev.scores[predictor]
    assert s.ticks == SCORED and s.no_action.sum() == 0
    assert s.agreement == pytest.approx(agreement)
    assert s.balanced_accuracy == pytest.approx(balanced)
    assert s.accel_mae == pytest.approx(mae, rel=1e-6)
    assert ev.all_ticks == len(result.snapshots) > ev.ticked  # held ticks exist and are not scored


def test_disagreement_ratio_is_against_the_best_baseline_on_its_ticks(hand):
    _, _, ev = hand
    ratio, against = ev.disagreement_ratio()
    assert against == "ego_accel"
    assert ev.proposed_on["ego_accel"].ticks == SCORED  # ego_accel is scored on every labelled tick
    assert ratio == pytest.approx((1 - ev.scores["proposed"].agreement) / (1 - 6 / 7))


def test_state_fractions_count_the_scored_ticks(hand):
    _, result, ev = hand
    from_snaps = [s for s in result.snapshots if not s.observation_held and s.actual_index >= 0]
    assert len(from_snaps) == SCORED
    assert ev.states["nominal"] == sum(s.safety_state.name == "NOMINAL" for s in from_snaps)
    assert ev.fraction("nominal") == ev.states["nominal"] / SCORED
    assert ev.all_states["stale_observation"] == result.report.reasons.get("STALE_OBSERVATION", 0)
    assert ev.all_states["ood_veto"] == result.report.reasons.get("OOD_VETO", 0)
    assert ev.all_states["nominal"] == result.report.safety_states.get("NOMINAL", 0)


# --- features the log does not measure --------------------------------------------------------------


def test_a_nan_feature_makes_the_baseline_na_on_that_tick_only(tmp_path):
    rows = list(ROWS)
    rows[2] = (-1.0, 1, NAN, -2.0, 20.0, BRAKE, -1.5)  # the radar lost the lead's distance
    ev = LogEvaluation.from_dict(replay_log(make_log(tmp_path / "nan.mcap", rows), TEST_MODEL_PATH).report.evaluation)
    gap = ev.scores["time_gap"]
    assert (gap.ticks, gap.na_ticks, gap.no_action[BRAKE]) == (6, 1, 1)
    assert gap.agreement == pytest.approx(4 / 6)  # row 2 was a miss; it is left out, not scored on a guess
    assert gap.accel_ticks == 5 and gap.accel_mae == pytest.approx((7.74 - 2.09) / 5, rel=1e-5)
    assert ev.proposed_on["time_gap"].ticks == 6  # the model compared on the same six ticks
    assert ev.scores["ego_accel"].ticks == SCORED and ev.scores["keep"].ticks == SCORED
    # the model had no input to score on row 2 (NaN in a measured feature): a miss, not a skip
    assert ev.scores["proposed"].ticks == SCORED and ev.scores["proposed"].no_action[BRAKE] == 1


@pytest.mark.parametrize("how", ["unmeasured", "filled"])
def test_a_feature_the_log_does_not_measure_is_never_used(tmp_path, how):
    lead = ("lead_distance", "lead_rel_speed")
    if how == "unmeasured":  # the sensor profile leaves them out; their values are NaN
        rows = [(r[0], r[1], NAN, NAN, *r[4:]) for r in ROWS]
        log = make_log(tmp_path / "u.mcap", rows, measured=[f for f in schema.FEATURE_NAMES if f not in lead])
    else:  # an older import filled them with (here: the hand-made) values: still not measured
        log = make_log(tmp_path / "f.mcap", filled=lead, measured=[f for f in schema.FEATURE_NAMES if f not in lead])
    ev = LogEvaluation.from_dict(replay_log(log, TEST_MODEL_PATH).report.evaluation)
    gap = ev.scores["time_gap"]
    # only the rows without a lead (0, 1, 7) need neither distance nor speed: keep, right on 0 and 7
    assert (gap.ticks, gap.na_ticks, gap.agreement) == (3, 4, pytest.approx(2 / 3))
    assert gap.accel_ticks == 2 and gap.accel_mae == pytest.approx((0.2 + 0.8) / 2, rel=1e-6)
    d = ev.as_dict()["scores"]["time_gap"]
    assert d["na_ticks"] == 4 and d["ticks"] == 3


def test_a_baseline_with_no_measured_input_is_na_and_never_best(tmp_path):
    log = make_log(tmp_path / "noaccel.mcap", measured=[f for f in schema.FEATURE_NAMES if f != "ego_accel"])
    ev = LogEvaluation.from_dict(replay_log(log, TEST_MODEL_PATH).report.evaluation)
    ego = ev.scores["ego_accel"]
    assert ego.ticks == 0 and ego.na_ticks == SCORED and np.isnan(ego.agreement)
    assert ev.best_baseline("agreement") == "time_gap"  # 4/7 beats keep's 3/7
    d = ev.as_dict()
    assert d["scores"]["ego_accel"]["agreement"] is None and d["best_baseline"]["agreement"] == "time_gap"
    assert "n/a on 7" in format_evaluation(EvaluationReport([ev]))


# --- pooling, JSON, the command ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def two(tmp_path_factory, hand):
    folder = tmp_path_factory.mktemp("two")
    short = make_log(folder / "short.mcap", ROWS[:3], session_id="short")  # rows 0-2: ego_accel right on all
    return hand[2], LogEvaluation.from_dict(replay_log(short, TEST_MODEL_PATH).report.evaluation)


def test_pooled_is_over_ticks_and_macro_over_logs(two):
    a, b = two
    report = EvaluationReport([a, b])
    pooled = report.pooled
    assert pooled.labelled == a.labelled + b.labelled == SCORED + 3
    for p in ("proposed", "applied", *bl.BASELINES):
        np.testing.assert_array_equal(pooled.scores[p].confusion, a.scores[p].confusion + b.scores[p].confusion)
        assert pooled.scores[p].ticks == a.scores[p].ticks + b.scores[p].ticks
    assert pooled.scores["ego_accel"].agreement == pytest.approx(9 / 10)  # (6 + 3) of (7 + 3) ticks
    macro = report.macro()
    assert macro["ego_accel"]["agreement"] == pytest.approx((6 / 7 + 1) / 2)  # the mean of the logs' values
    assert macro["proposed"]["accel_mae"] == pytest.approx(
        (a.scores["proposed"].accel_mae + b.scores["proposed"].accel_mae) / 2
    )
    # keep on the short log: recall keep 1, accelerate 0, brake 0; pooled the same classes plus brake_hard
    assert pooled.scores["keep"].balanced_accuracy == pytest.approx(0.25)
    assert pooled.states["nominal"] == a.states["nominal"] + b.states["nominal"]


def test_json_round_trip(two):
    report = EvaluationReport(list(two))
    text = json.dumps(report.as_dict(), allow_nan=False)  # strict JSON: n/a is null, never NaN
    again = EvaluationReport.from_dict(json.loads(text))
    assert again.as_dict() == report.as_dict()
    d = json.loads(text)
    assert d["schema"] == SCHEMA and d["pooled"]["labelled"] == SCORED + 3 and len(d["logs"]) == 2
    assert d["time_gap_rule"]["K_GAP"] == bl.K_GAP and "one tick per observation" in d["ticks"]
    for row in (*d["logs"], d["pooled"]):
        assert set(row["scores"]) == {"proposed", "applied", *bl.BASELINES}
        assert set(row["state_fractions"]) == {"nominal", "ood_veto", "stale_observation"}
        assert len(row["scores"]["proposed"]["confusion"]) == len(ACTIONS)
    with pytest.raises(ValueError, match="schema"):
        EvaluationReport.from_dict({**d, "schema": "something else"})


def test_one_tick_per_observation_off_the_grid(tmp_path):
    """At 150 Hz some observations are replaced before a tick uses them; each used one is scored once."""
    log = synthetic_log(tmp_path / "off.mcap", seconds=1.0, rate_hz=150.0)
    result = replay_log(log, TEST_MODEL_PATH)
    ev = LogEvaluation.from_dict(result.report.evaluation)
    used = {s.observation_seq for s in result.snapshots}
    assert ev.observations == 150 and ev.ticked == len(used) < 150
    assert ev.labelled == sum(s.actual_index >= 0 for s in result.snapshots if not s.observation_held)
    assert ev.scores["keep"].ticks == ev.labelled


def test_the_real_drive(tmp_path, capsys):
    """`dualloop replay` on the comma2k19 fixture: one scored tick per observation, not per 5 ms tick."""
    out_json, out_png = tmp_path / "eval.json", tmp_path / "eval.png"
    code = main(
        [
            "replay",
            str(REAL_DRIVE),
            "--model",
            str(BASE_MODEL_PATH),
            *(a for g in DEFAULT_GATES for a in ("--gate", str(g))),
            "--out",
            str(tmp_path / "r.mcap"),
            "--json",
            str(out_json),
            "--plot",
            str(out_png),
        ]
    )
    assert code == 0 and out_png.stat().st_size > 0
    printed = "".join(capsys.readouterr())
    assert "pooled over ticks (1 log)" in printed and "baseline time_gap" in printed
    report = EvaluationReport.from_dict(json.loads(out_json.read_text()))
    (ev,) = report.logs
    data = read_log(REAL_DRIVE)
    labels = np.array([o.actual.action_index for o in data.observations])
    assert ev.observations == ev.ticked == ev.labelled == len(labels) == 5995 and ev.all_ticks == 11989
    # keep agrees exactly on the keep labels (3,979 of them: tests/fixtures/README.md)
    assert ev.scores["keep"].agreement == pytest.approx(3979 / 5995)
    assert ev.scores["keep"].balanced_accuracy == pytest.approx(1 / 3)  # brake, keep, accelerate present
    ego = action_of_accel([o.features[schema.FEATURE_INDEX["ego_accel"]] for o in data.observations])
    assert ev.scores["ego_accel"].agreement == pytest.approx(np.mean(ego == labels))
    assert ev.scores["proposed"].ticks == 5995 and 0.0 < ev.scores["proposed"].agreement < 1.0
    assert report.pooled.as_dict()["scores"] == ev.as_dict()["scores"]


def test_from_replay_reports_names_the_skipped():
    report, skipped = from_replay_reports([{"source": "x.mcap", "evaluation": {"skipped": "other actions"}}])
    assert report.logs == [] and skipped == {"x.mcap": "other actions"}


def test_many_logs_through_the_command(tmp_path, capsys):
    """Several logs (the process pool): the table and the JSON hold each log, in the order given, and the pool."""
    a = make_log(tmp_path / "a.mcap", session_id="a")
    b = make_log(tmp_path / "b.mcap", ROWS[:3], session_id="b")
    out_json = tmp_path / "many.json"
    argv = ["replay", str(a), str(b), "--model", str(TEST_MODEL_PATH), "--workers", "1", "--out", str(tmp_path)]
    assert main([*argv, "--json", str(out_json)]) == 0
    printed = "".join(capsys.readouterr())
    assert "pooled over ticks (2 logs)" in printed and "macro mean over logs" in printed
    d = json.loads(out_json.read_text())
    assert [row["source"] for row in d["logs"]] == [str(a), str(b)]
    assert d["pooled"]["labelled"] == SCORED + 3 and d["pooled"]["logs"] == 2
    assert d["pooled"]["scores"]["ego_accel"]["agreement"] == pytest.approx(9 / 10)
    assert d["macro"]["ego_accel"]["agreement"] == pytest.approx((6 / 7 + 1) / 2)


def test_a_file_that_is_not_a_log_or_not_a_gate_is_one_line(tmp_path, capsys):
    """`dualloop replay` on a CSV given as the log, and on a log with a damaged gate: exit 2 and one
    `error:` line naming the file (found by tests/fuzz: were tracebacks)."""
    not_a_log = tmp_path / "drive.csv"
    not_a_log.write_text("time,ego_speed\n0,1\n")
    log = make_log(tmp_path / "a.mcap", session_id="a")
    gate = tmp_path / "cut.gate.npz"
    gate.write_bytes(DEFAULT_GATES[0].read_bytes()[:300])
    for argv, name in (
        (["replay", str(not_a_log), "--model", str(TEST_MODEL_PATH), "--no-gate"], "drive.csv: not an MCAP file"),
        (["replay", str(log), "--gate", str(gate)], "cut.gate.npz: unreadable"),
    ):
        assert main([*argv, "--out", str(tmp_path / "r.mcap")]) == 2
        (line,) = [x for x in "".join(capsys.readouterr()).splitlines() if x.strip()]
        assert line.startswith("error: ") and name in line, line
