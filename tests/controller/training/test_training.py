"""Training pipeline: real simulated data (short episodes), recorded drives, real numpy training,
real onnxruntime."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.training.calibration import expected_calibration_error, fit_temperature, nll, probabilities
from dualloop.controller.training.data import DataConfig, Dataset, Normaliser, generate
from dualloop.controller.training.mlp import MLPConfig, forward_weights
from dualloop.controller.training.trainer import LATENCY_KEYS, TrainOptions, TrainResult, train
from dualloop.executor.history import DEFAULT_HISTORY
from dualloop.executor.model_card import Normalisation
from dualloop.executor.model_runner import DecisionModel
from dualloop.sim import schema
from tests.controller.training.human_logs import human_drive

# Short episodes, few of them: enough signal to beat the majority class, seconds to generate.
TINY_DATA = DataConfig(
    train_episodes=6, val_episodes=3, test_episodes=3, every=10, duration_s=10.0, realistic_episodes=(6, 3, 3)
)
TINY_MLP = MLPConfig(hidden=(24, 16), max_epochs=10, patience=10, batch_size=128)
SEED = 3


@pytest.fixture(scope="module")
def tiny_data() -> Dataset:
    return generate(TINY_DATA, SEED)


@pytest.fixture(scope="module")
def human_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("drives")
    for i in range(3):
        human_drive(folder / f"d{i}.mcap", f"drive-{i}", seed=i)
    return folder


@pytest.fixture(scope="module")
def trained(tiny_data: Dataset, human_logs: Path, tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    out = tmp_path_factory.mktemp("train") / "tiny.onnx"
    return train("small", SEED, out, data=tiny_data, config=TINY_MLP, options=TrainOptions(logs=[human_logs]))


def _inputs(result: TrainResult, data: Dataset) -> tuple[np.ndarray, np.ndarray]:
    return result.normaliser.apply(data.test.features, data.test.plan, data.test.present)


def test_splits_are_disjoint_by_episode_seed(tiny_data: Dataset) -> None:
    s = {k: set(v) for k, v in tiny_data.seeds.items()}
    assert not (s["train"] & s["val"]) and not (s["train"] & s["test"]) and not (s["val"] & s["test"])
    assert len(tiny_data.train) > len(tiny_data.val) > 0 and len(tiny_data.test) > 0


def test_training_twice_gives_identical_files(tiny_data: Dataset, tmp_path: Path) -> None:
    a = train(
        "small",
        SEED,
        tmp_path / "a.onnx",
        data=tiny_data,
        config=TINY_MLP,
        options=TrainOptions(measure_latency_in_card=False),
    )
    b = train(
        "small",
        SEED,
        tmp_path / "b.onnx",
        data=tiny_data,
        config=TINY_MLP,
        options=TrainOptions(measure_latency_in_card=False),
    )
    c = train(
        "small",
        SEED + 1,
        tmp_path / "c.onnx",
        data=tiny_data,
        config=TINY_MLP,
        options=TrainOptions(measure_latency_in_card=False),
    )
    digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()  # noqa: E731
    assert digest(a.path) == digest(b.path)
    assert a.card.version == b.card.version
    assert digest(a.path) != digest(c.path), "the seed must matter"


def test_simulated_data_has_both_kinds_of_drive_and_missing_features(tiny_data: Dataset) -> None:
    assert {s.split("/")[0] for s in tiny_data.sources} == {"sim", "realistic"}
    for split in ("train", "val", "test"):
        sp = tiny_data.split(split)
        sim = tiny_data.source_rows(split, "sim/")
        assert sp.present[sim].all() and not sp.present[~sim].all()
        assert np.array_equal(np.isnan(sp.features), ~sp.present)
        no_plan = (sp.plan[:, 2:] == 0).all(axis=1)  # no behaviour: the expert's plans always have one
        assert no_plan[~sim].any() and not no_plan[sim].any()
        # ... and the target raised to the measured speed (schema.NO_PLAN_AT_LEAST)
        target = sp.plan[no_plan, schema.PLAN_INDEX["target_speed"]]
        speed = sp.features[no_plan, schema.FEATURE_INDEX["ego_speed"]]
        assert np.array_equal(target, np.maximum(speed, schema.NO_PLAN_TARGET_SPEED))
        assert (sp.label >= 0).all() and (sp.weight == 1.0).all()


def test_recorded_drives_join_train_and_val_with_their_share_of_the_weight(
    tiny_data: Dataset, trained: TrainResult
) -> None:
    m = trained.card.training_metrics
    assert m["logs_files"] == "3" and "test-drives" in str(m["logs_labelled_rows"])
    assert m["log_share"] == pytest.approx(0.35)
    assert "val_logs_test-drives_agreement" in m and "val_logs_test-drives_best_baseline" in m
    assert 0.0 <= float(m["val_logs_test-drives_agreement"]) <= 1.0
    assert float(m["n_train"]) > len(tiny_data.train) and float(m["n_val"]) > len(tiny_data.val)
    assert float(m["n_test"]) == len(tiny_data.test), "recorded drives are never in the test split"


def test_card_takes_masks_and_has_no_plan_as_default(trained: TrainResult) -> None:
    model = DecisionModel(trained.path, warmup_batches=())
    assert model.card.mask_input and model.card.plan_default == schema.no_plan().tolist()
    assert model.card.plan_default_at_least == schema.NO_PLAN_AT_LEAST
    inputs = {i.name: i.shape for i in model._session.get_inputs()}
    assert inputs[model.card.io.features][1] == 2 * schema.N_FEATURES


def test_exported_model_matches_numpy_forward(trained: TrainResult, tiny_data: Dataset) -> None:
    f, p = _inputs(trained, tiny_data)
    present = tiny_data.test.present
    out = DecisionModel(trained.path).forward(f, p, present)
    logits, controls, dv = forward_weights(trained.weights, trained.normaliser.inputs(tiny_data.test))
    np.testing.assert_allclose(out.logits, logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.controls, controls, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out.decision_vector, dv, rtol=1e-5, atol=1e-5)


def test_normaliser_matches_the_card_and_executor(trained: TrainResult, tiny_data: Dataset) -> None:
    from dualloop.executor.core import Executor

    card = DecisionModel(trained.path, warmup_batches=()).card
    ex = Executor(DecisionModel(trained.path, warmup_batches=()))
    from_card = Normaliser.from_card(card)
    realistic = tiny_data.source_rows("test", "realistic/")
    x, p, present = (a[realistic][:50] for a in (tiny_data.test.features, tiny_data.test.plan, tiny_data.test.present))
    assert not present.all(), "rows with missing features"
    norm = ex.normalisation
    assert isinstance(norm, Normalisation)
    expected, _, finite = norm.apply(x, p, present=present)  # exactly what the executor feeds the graph
    assert finite.all()
    np.testing.assert_array_equal(from_card.apply(x, p, present)[0], expected)
    np.testing.assert_array_equal(trained.normaliser.apply(x, p, present)[0], expected)


def test_card_is_complete(trained: TrainResult) -> None:
    card = DecisionModel(trained.path, warmup_batches=()).card
    assert card == trained.card
    assert card.temperature != 1.0
    assert [f.name for f in card.features] == list(schema.FEATURE_NAMES)
    assert [f.unit for f in card.features] == list(schema.FEATURE_UNITS)
    assert [p.name for p in card.plan] == list(schema.PLAN_NAMES)
    assert card.actions == list(schema.ACTIONS)
    assert [(c.name, c.min, c.max) for c in card.controls] == [(c.name, c.low, c.high) for c in schema.CONTROLS]
    assert card.size_class == "small" and card.decision_vector_size == TINY_MLP.hidden[-1]
    m = card.training_metrics
    required = [
        "test_accuracy",
        "test_rmse_accel",
        "test_rmse_steer",
        "test_ece_before",
        "test_ece_after",
        "temperature",
        "n_train",
        "n_val",
        "n_test",
        "seed",
        *LATENCY_KEYS,
        *(f"test_recall_{a}" for a in schema.ACTIONS),
    ]
    assert [k for k in required if k not in m] == []
    assert m["temperature"] == card.temperature and m["seed"] == SEED
    assert 0 < m["forward_b1_p50_us"] <= m["forward_b1_p99_us"]


def test_temperature_scaling_fits_and_does_not_hurt_held_out(trained: TrainResult, tiny_data: Dataset) -> None:
    # train() fits the temperature on the validation split. On this tiny data the fitted value is
    # close to 1, so the held-out gain is within noise; the full-size base model's card shows the
    # real effect (test NLL and ECE before/after). Here: the fit must lower the NLL it minimised, and
    # must not make the unseen test split worse beyond noise.
    t = trained.card.temperature
    # 2 %: on 3,600 tiny-data test samples a temperature fitted on another 3,600 moves the NLL by up
    # to ~1 % either way (0.6 % seen); a badly wrong temperature (or sign) costs far more
    for split, slack in (("test", 0.02),):
        sp = tiny_data.split(split)
        logits, _, _ = forward_weights(trained.weights, trained.normaliser.inputs(sp))
        assert nll(logits, sp.label, t) <= nll(logits, sp.label, 1.0) * (1 + slack), split


def test_fit_temperature_recovers_a_known_temperature() -> None:
    rng = np.random.default_rng(0)
    true_logits = rng.normal(0, 2.0, (20000, 4))
    labels = np.array([rng.choice(4, p=row) for row in probabilities(true_logits)])
    # The model is 3x over-confident: its logits are 3x the true ones, so the best T is ~3.
    t = fit_temperature(3.0 * true_logits, labels)
    assert t == pytest.approx(3.0, rel=0.05)


def test_ece_on_a_hand_made_example() -> None:
    probs = np.array([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.3, 0.7]])
    labels = np.array([0, 1, 0, 1])
    # Bins (15 equal widths): 0.9 -> bin 13 holds two samples, conf 0.9, accuracy 0.5;
    # 0.6 -> bin 8, conf 0.6, accuracy 1; 0.7 -> bin 10, conf 0.7, accuracy 1.
    expected = (2 * abs(0.5 - 0.9) + abs(1 - 0.6) + abs(1 - 0.7)) / 4
    assert expected_calibration_error(probs, labels, n_bins=15) == pytest.approx(expected)
    perfect = np.array([[1.0, 0.0], [0.0, 1.0]])
    assert expected_calibration_error(perfect, np.array([0, 1])) == pytest.approx(0.0)


def test_model_beats_majority_baseline(trained: TrainResult, tiny_data: Dataset) -> None:
    majority = tiny_data.test.class_counts().max() / len(tiny_data.test)
    assert trained.metrics["test_majority_baseline"] == pytest.approx(majority, rel=1e-5)
    assert trained.metrics["test_accuracy"] > majority + 0.02


def test_int8_model_loads_with_card_and_reports_per_class(
    trained: TrainResult, tiny_data: Dataset, tmp_path: Path
) -> None:
    from dualloop.controller.training.quantize import quantize

    result = quantize(trained.path, tmp_path / "tiny.int8.onnx", SEED, data=tiny_data, latency_calls=200)
    model = DecisionModel(result.path)
    assert model.card == result.card
    assert model.card.temperature == trained.card.temperature
    assert model.card.version != trained.card.version
    assert model.card.training_metrics["quantized_from"] == trained.card.version
    report = result.report
    assert [r["action"] for r in report["per_class"]] == list(schema.ACTIONS)
    cm = np.array(report["confusion_fp32_rows_int8_cols"])
    assert cm.shape == (schema.N_ACTIONS, schema.N_ACTIONS) and cm.sum() == len(tiny_data.test)
    assert report["agreement"] == pytest.approx(np.trace(cm) / cm.sum())
    assert report["agreement"] > 0.9  # a sane quantisation mostly agrees with FP32
    for r in report["per_class"]:
        assert r["flagged"] == (np.isfinite(r["recall_drop"]) and r["recall_drop"] > report["flag_threshold"])


def test_confusion_report_flags_a_recall_drop() -> None:
    from dualloop.controller.training.quantize import compare

    class Fake:
        def __init__(self, logits: np.ndarray) -> None:
            self.logits = logits

        def forward(self, f: np.ndarray, p: np.ndarray, present: np.ndarray | None = None):  # noqa: ANN201 - duck-typed ModelOutputs
            from dualloop.executor.model_runner import ModelOutputs

            n = len(f)
            return ModelOutputs(self.logits, np.zeros((n, 2), np.float32), np.zeros((n, 3), np.float32))

    labels = np.array([0] * 10 + [2] * 90)
    fp32 = np.eye(4, dtype=np.float32)[labels]
    int8_pred = labels.copy()
    int8_pred[:3] = 1  # three brake_hard samples become brake: total accuracy still 97 %
    report = compare(
        Fake(fp32),
        Fake(np.eye(4, dtype=np.float32)[int8_pred]),  # type: ignore[arg-type]
        np.zeros((100, 19), np.float32),
        np.zeros((100, 6), np.float32),
        labels,
    )
    assert report["int8_accuracy"] == pytest.approx(0.97)
    assert report["flagged"] == ["brake_hard"]
    assert report["per_class"][0]["recall_drop"] == pytest.approx(0.3)
    assert report["confusion_fp32_rows_int8_cols"][0] == [7, 3, 0, 0]


@pytest.fixture(scope="module")
def trained_history(human_logs: Path, tmp_path_factory: pytest.TempPathFactory) -> TrainResult:
    data = generate(replace(TINY_DATA, history=DEFAULT_HISTORY), SEED)
    out = tmp_path_factory.mktemp("train") / "tiny-history.onnx"
    return train("small", SEED, out, data=data, config=TINY_MLP, options=TrainOptions(logs=[human_logs]))


def test_a_history_model_is_fed_in_training_as_the_executor_feeds_it(
    trained_history: TrainResult, human_logs: Path
) -> None:
    """Trained with history features (every kind of row has them, from its drive's own stream), the
    card lists them; on a recorded drive, the proposals `eval-logs` computes from the training
    inputs are the ones a LOCKSTEP replay through the executor makes on every observation."""
    from dualloop.controller.training.log_eval import model_actions
    from dualloop.controller.training.recorded import read_log_rows
    from dualloop.executor.core import Executor
    from dualloop.executor.history import DEFAULT_HISTORY
    from dualloop.executor.lockstep_batch import run_lockstep
    from dualloop.executor.snapshot import Clock, Observation

    model = DecisionModel(trained_history.path, warmup_batches=())
    assert model.card.history_names == list(DEFAULT_HISTORY) and model.card.mask_input
    assert trained_history.normaliser.history == DEFAULT_HISTORY
    assert np.all(np.array([h.std for h in model.card.history_features]) > 0)
    rows = read_log_rows([human_logs / "d0.mcap"])
    assert model.history is not None and np.abs(rows.history(model.history)).max() > 0.1
    expected = model_actions(model, rows)
    names = [n for n, on in zip(schema.FEATURE_NAMES, rows.present[0]) if on]
    ex = Executor(model)
    ex.open_session("d0", clock=Clock.LOCKSTEP, provided_features=names)
    assert rows.t_ns is not None
    obs = [
        Observation(seq=i + 1, timestamp_ns=int(t), features=x)
        for i, (t, x) in enumerate(zip(rows.t_ns, rows.features))
    ]
    table = run_lockstep(ex, "d0", obs)
    fresh = ~table.held
    assert fresh.sum() == len(obs)
    np.testing.assert_array_equal(table.proposed[fresh], expected[table.obs_index[fresh]])


@pytest.mark.slow
def test_dagger_adds_the_first_models_own_states_and_trains_again(tiny_data: Dataset, tmp_path: Path) -> None:
    """One DAgger round: the first model drives two episodes per nominal scenario; their states,
    labelled by the expert, join the training split, and the card says how many."""
    config = replace(tiny_data.config, dagger_episodes=2)
    data = replace(tiny_data, config=config)
    result = train("small", SEED, tmp_path / "dagger.onnx", data=data, config=TINY_MLP, options=TrainOptions(dagger=1))
    m = result.metrics
    assert m["n_train"] == len(tiny_data.train) + m["dagger_rows"]
    # every 10th step of 2 x 6 drives of up to 10 s, ending where a drive crashed
    assert 0 < m["dagger_rows"] <= 12 * 200
    failed, of = str(m["dagger_failed_drives"]).split(" of ")
    assert 0 <= int(failed) <= int(of) == 12
    assert result.card.training_metrics["dagger_rows"] == m["dagger_rows"]
