"""The model's own roll-outs (controller.training.rollouts), the states DAgger labels and gates learn:
the same drive as the executor's closed loop, with the expert's action in each state."""

from __future__ import annotations

import numpy as np

from dualloop.controller.demo.closed_loop import drive_in_process
from dualloop.controller.training.rollouts import run_model_batch
from dualloop.executor.core import Executor
from dualloop.sim.env import run_expert_batch
from dualloop.sim.schema import label_from_accel

SEEDS = [950_011, 950_012]
PARAMS = {"duration_s": 3.0}


def test_a_batch_of_roll_outs_drives_as_the_closed_loop_does(base_model) -> None:  # noqa: ANN001
    """Each episode of the batch (REALTIME sessions ticked together) applies bit for bit the commands
    the in-process closed loop (one LOCKSTEP session) applies on the same seed."""
    _, data = run_model_batch(base_model, "cut_in", SEEDS, **PARAMS)
    for b, seed in enumerate(SEEDS):
        run = drive_in_process(Executor(base_model), "cut_in", seed, **PARAMS)
        n = len(run.t)
        assert data.valid[b].sum() == n
        # applied[k] is the command executing when observation k was taken: the closed loop's k-1
        np.testing.assert_array_equal(data.applied[b, 1:n, 0], run.applied_accel[: n - 1].astype(np.float32))
        np.testing.assert_array_equal(data.applied[b, 1:n, 1], run.applied_steer[: n - 1].astype(np.float32))
        assert np.isnan(data.applied[b, 0]).all()


def test_labels_are_the_experts_action_in_the_models_state(base_model) -> None:  # noqa: ANN001
    """At the first step both drivers see the same state: the label there is the expert's own command;
    later the model's states differ from the expert's path and so do the labels, from the same expert."""
    _, ours = run_model_batch(base_model, "lead_brakes_hard", SEEDS, **PARAMS)
    _, expert = run_expert_batch("lead_brakes_hard", SEEDS, target_steps=None, **PARAMS)
    np.testing.assert_array_equal(ours.features[:, 0], expert.features[:, 0])
    np.testing.assert_allclose(ours.controls[:, 0], expert.controls[:, 0], rtol=0, atol=1e-6)
    np.testing.assert_array_equal(ours.label, label_from_accel(ours.controls[..., 0]))
    assert not np.array_equal(ours.features[:, -1], expert.features[:, -1])
