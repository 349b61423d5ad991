"""Closed loop: the simulator driven by the controller, in-process and over gRPC, and the demo."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rich.console import Console

from dualloop.controller.demo.closed_loop import drive_in_process, drive_over_grpc, session_id
from dualloop.controller.demo.suite import run_demo
from dualloop.controller.logs.foxglove import layout_paths
from dualloop.controller.logs.plot import plot_topic
from dualloop.executor.core import Executor
from tests.controller.logs.test_foxglove import decoded


def test_grpc_and_in_process_drive_identically(server, test_model):
    local = drive_in_process(Executor(test_model), "dense_traffic", seed=7, duration_s=2.0)
    remote = drive_over_grpc(server.address, "dense_traffic", seed=7, duration_s=2.0)
    assert len(local.t) == len(remote.t) > 10
    np.testing.assert_array_equal(local.applied_index, remote.applied_index)
    np.testing.assert_array_equal(local.applied_accel, remote.applied_accel)
    np.testing.assert_array_equal(local.metrics.series.ego_speed, remote.metrics.series.ego_speed)
    assert remote.plan_ids[0] == "sim-0"  # the simulator's planner conditions the model


def test_closed_loop_is_reproducible(test_model):
    a = drive_in_process(Executor(test_model), "cut_in", seed=3, duration_s=1.0)
    b = drive_in_process(Executor(test_model), "cut_in", seed=3, duration_s=1.0)
    np.testing.assert_array_equal(a.applied_accel, b.applied_accel)
    np.testing.assert_array_equal(a.metrics.series.ego_speed, b.metrics.series.ego_speed)


@pytest.mark.slow
def test_demo_writes_table_logs_plots_and_report(tmp_path, test_model_path):
    out = run_demo(
        test_model_path,
        tmp_path,
        ["nominal_cruise", "sensor_dropout"],
        duration_s=1.0,
        console=Console(width=200, record=True),
    )
    summary = json.loads((out / "summary.json").read_text())
    assert [r["scenario"] for r in summary["rows"]] == ["nominal_cruise", "sensor_dropout"]
    assert summary["rows"][1]["ood"] is True
    # by default the server's planner plans the nominal scenarios, the simulator the OOD ones;
    # the table's plan source says which plans the executor actually used
    assert summary["plan_sources"] == {"nominal_cruise": "behaviour", "sensor_dropout": "simulator"}
    assert [r["plan_source"] for r in summary["rows"]] == ["behaviour", "sim"]
    for row in summary["rows"]:
        assert (out / f"{row['scenario']}.png").stat().st_size > 10_000
    # the servers' recordings, one per plan source, read back as Foxglove reads them (schema from
    # the file), with a plot topic per scenario holding every tick; the layout's paths are in them
    recorded: dict[str, list] = {}
    for name in ("behaviour", "simulator"):
        for topic, messages in decoded(out / "logs" / f"{name}.mcap").items():
            recorded.setdefault(topic, []).extend(messages)
    for row in summary["rows"]:
        plots = recorded[plot_topic(session_id(row["scenario"], summary["seed"]))]
        assert len(plots) == row["ticks"] > 0
        assert all(t > 1_577_836_800 * 10**9 for t, _, _ in plots)  # not at 1970
        assert plots[-1][2].features.ego_speed >= 0.0
    layout = json.loads((out / "foxglove-layout.json").read_text())
    assert {path.split(".", 1)[0] for path in layout_paths(layout)} <= set(recorded)
    assert (out / "tick_work.png").is_file()
    assert "| nominal_cruise |" in (out / "report.md").read_text()


def test_realtime_closed_loop_over_grpc(server):
    """REALTIME: the simulator steps on the wall clock and applies the newest snapshot it has."""
    from dualloop.v2 import controller_pb2 as pb

    # the fixture serves the untrained test model: do not end the episode at its first crash
    run = drive_over_grpc(
        server.address, "nominal_cruise", seed=11, clock=pb.CLOCK_MODE_REALTIME, duration_s=1.0, end_on_collision=False
    )
    assert len(run.t) == 200  # 1 s of 5 ms steps, paced by the wall clock
    decided = run.applied_index >= 0
    assert decided[20:].all()  # after the first few steps every step had a decision to apply
    assert np.isfinite(run.applied_accel).all()
