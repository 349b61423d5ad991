"""A decision-vector gate learns the model's own nominal driving beside the expert's; both gates' thresholds
cover the ordinary driving of real sites they are calibrated on."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dualloop import ood
from dualloop.controller.cli import main
from dualloop.controller.gates.fitting import GateFitConfig, fit_gate_for_model, model_driven_inputs
from dualloop.controller.logs.shared_data import import_shared_data
from dualloop.controller.training.driving_card import build_test_model
from dualloop.controller.training.log_eval import decision_vectors
from dualloop.controller.training.recorded import read_log_rows
from dualloop.controller.training.rollouts import run_model_batch
from dualloop.executor.model_runner import DecisionModel
from dualloop.ood.marginal import profile_gate
from dualloop.sim.schema import FEATURE_NAMES
from tests.paths import FIXTURES

PARAMS = {"duration_s": 1.0}


def test_model_driven_rows_are_the_models_own_drives(base_model) -> None:  # noqa: ANN001
    features, plan, history = model_driven_inputs(base_model, [5, 6], every=4, scenarios=["cut_in"], **PARAMS)
    _, data = run_model_batch(base_model, "cut_in", [5, 6], **PARAMS)
    np.testing.assert_array_equal(features, data.features[:, ::4][data.valid[:, ::4]])
    np.testing.assert_array_equal(plan, data.plan[:, ::4][data.valid[:, ::4]])
    assert history.shape == (len(features), len(base_model.card.history_names))


def test_the_gate_is_calibrated_on_both_drivers(base_model) -> None:  # noqa: ANN001
    """With the model's own drives the calibration holds three decision vectors (as sessions see them)
    per row of either driver: more rows than the expert's alone, and the file says so."""
    # coarse rates: a few hundred held-out rows calibrate them
    config = GateFitConfig(
        fit_seeds=range(1, 3),
        calibration_seeds=range(3, 5),
        every=20,
        alpha=0.01,
        norm_alpha=0.01,
        scenario_params=PARAMS,
    )
    both = fit_gate_for_model(base_model, config)
    expert = fit_gate_for_model(base_model, config.model_copy(update={"model_driven": False}))
    assert both.calibration.n > expert.calibration.n
    assert "expert and model drivers" in both.calibration.data_description
    assert "expert driver," in expert.calibration.data_description
    # the gate records the model it describes (the serving path refuses it in front of another)
    card = base_model.card
    assert both.model is not None and both.model.version == card.version
    assert both.model.schema_hash == card.schema_hash() and both.model.name == card.name


@pytest.fixture(scope="module")
def real_train(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fixture drives of three shared data sets (NGSIM, AstaZero, ZalaZone), imported as the
    shared data are; their training split."""
    out = tmp_path_factory.mktemp("real")
    import_shared_data(FIXTURES / "real-drives", out, start_time_unix_ns=1)
    return out / "train"


def test_both_gates_cover_every_sites_ordinary_driving(base_model, real_train: Path) -> None:  # noqa: ANN001
    """Calibrated on real drives (`gate fit --real-logs`), the raw-input gate keeps each data set's rows
    as a site and the threshold of the sensor profile they measure leaves at most about alpha of each
    site's rows above it; the decision-vector gate's one threshold does the same for the model's decision
    vectors on those drives (computed here through the replay's own path, rows as the executor scores them)."""
    config = GateFitConfig(
        fit_seeds=range(1, 2), calibration_seeds=range(2, 4), every=20, alpha=0.01, norm_alpha=0.01,
        scenario_params=PARAMS, real_logs=(str(real_train),),
    )  # fmt: skip
    inputs = fit_gate_for_model(base_model, config.model_copy(update={"source": "input_features", "actuation": False}))
    rows = read_log_rows([real_train])
    assert inputs.site_rows is not None and inputs.site_rows.names == tuple(sorted(set(rows.datasets)))
    assert len(inputs.site_rows.names) == 3
    sites = inputs.site_rows
    for i, name in enumerate(sites.names):
        mine = sites.rows[sites.site == i]
        present = np.isfinite(mine[0])
        assert np.isfinite(mine[:, present]).all() and not present.all()  # longitudinal sensors only
        judged = profile_gate(inputs, present)
        flags = ood.score_in_chunks(judged.scorer(256), judged.marginal.complete(mine))[1]
        assert flags.exceed.mean() <= 0.01 + 1.0 / len(mine), name
    plain = fit_gate_for_model(base_model, config.model_copy(update={"real_logs": ()}))
    dv = fit_gate_for_model(base_model, config)
    assert dv.threshold >= plain.threshold
    vectors = decision_vectors(base_model, rows, rows.valid)
    scores = ood.score_in_chunks(ood.GateScorer(dv.stats), vectors)[0]
    for name in set(rows.datasets):
        mine = scores[rows.dataset[rows.valid] == name]
        assert (mine > dv.threshold).mean() <= 0.01 + 1.0 / len(mine), name
    if dv.threshold > plain.threshold:
        assert "largest site quantile" in dv.calibration.data_description


def test_the_plan_range_takes_a_target_raised_to_the_speed_as_far_as_the_speed(tmp_path: Path) -> None:
    """A card whose no-plan default raises the target speed to the ego speed: the input gate's plan range
    accepts that target at every speed its input range accepts (a motorway at 40 m/s is no odd plan), and
    the fixed-default card's stays where the simulated plans put it."""
    raised_path, fixed_path = tmp_path / "raised.onnx", tmp_path / "fixed.onnx"
    build_test_model(raised_path, plan_default_at_least={"target_speed": "ego_speed"})
    build_test_model(fixed_path)
    config = GateFitConfig(
        source="input_features", fit_seeds=range(1, 2), calibration_seeds=range(3, 5), every=10,
        alpha=0.01, norm_alpha=0.01, scenario_params=PARAMS, actuation=False,
    )  # fmt: skip
    raised = fit_gate_for_model(DecisionModel(raised_path), config).feature_range
    fixed = fit_gate_for_model(DecisionModel(fixed_path), config).feature_range
    assert raised is not None and fixed is not None
    speed, target = FEATURE_NAMES.index("ego_speed"), raised.context_names.index("target_speed")
    assert raised.context_high[target] == raised.high[speed] > fixed.context_high[target]
    assert np.delete(raised.context_high, target).tolist() == np.delete(fixed.context_high, target).tolist()


@pytest.mark.parametrize("alpha", ["5", "-1", "nan", "0", "1"])
def test_gate_fit_refuses_an_alpha_outside_0_1_before_fitting(
    alpha: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The calibration at the end of minutes of fitting refused it before: now the command does, first."""
    out = tmp_path / "g.gate.npz"
    assert main(["gate", "fit", "--alpha", alpha, "--out", str(out)]) == 2
    text = "".join(capsys.readouterr())
    assert f"error: --alpha must be a rate in (0, 1), got {float(alpha)}" in text
    assert "fitting" not in text and not out.exists()
