"""A decision-vector gate learns the model's own nominal driving beside the expert's."""

from __future__ import annotations

import numpy as np

from dualloop.controller.gates.fitting import GateFitConfig, fit_gate_for_model, model_driven_inputs
from dualloop.controller.training.rollouts import run_model_batch

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
