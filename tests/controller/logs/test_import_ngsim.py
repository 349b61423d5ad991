"""The NGSIM chain importer on a cut real chain: hand-computed rows, five pairs, no use of a{k}."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.cli import main
from dualloop.controller.logs.import_ngsim import LEADER_LENGTH_M, NgsimError, import_ngsim, read_ngsim_chain
from dualloop.controller.logs.logfile import read_log
from dualloop.executor.action_labels import ACTIONS, backward_accel, lookahead_labels
from dualloop.sim.schema import FEATURE_INDEX, FEATURE_NAMES
from tests.paths import FIXTURES

CHAIN = FIXTURES / "real-drives" / "ngsim-i80-emd-chains" / "1_11_24_44_55_54.csv"


def test_five_pairs_named_by_vehicle_ids(tmp_path: Path) -> None:
    reports = import_ngsim(CHAIN, tmp_path, start_time_unix_ns=1)
    assert [r.session_id for r in reports] == ["ngsim-1-11", "ngsim-11-24", "ngsim-24-44", "ngsim-44-55", "ngsim-55-54"]
    assert all((tmp_path / f"{r.session_id}.mcap").is_file() for r in reports)
    assert all(r.observations == 150 and r.rate_hz == pytest.approx(10) for r in reports)


def test_rows_match_hand_computed_values(tmp_path: Path) -> None:
    import_ngsim(CHAIN, tmp_path, start_time_unix_ns=1)
    data = read_log(tmp_path / "ngsim-1-11.mcap")
    head = data.header
    assert list(head.measured_features) == ["ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed"]
    assert head.observation_period_ns == 100_000_000 and head.tick_period_ns == 5_000_000
    assert "4.8 m" in head.source_details["lead_distance"] and "Apache-2.0" in head.source_details["licence"]
    # t = 0.1: Y1 65.8747, Y2 48.9554, v1 6.2419, v2 5.8667; v2(0) = 5.88
    first = data.observations[0]
    assert first.timestamp_ns == 100_000_000
    assert first.features[FEATURE_INDEX["ego_speed"]] == pytest.approx(5.8667, abs=1e-5)
    assert first.features[FEATURE_INDEX["lead_distance"]] == pytest.approx(
        65.8747 - 48.9554 - LEADER_LENGTH_M, abs=1e-4
    )
    assert first.features[FEATURE_INDEX["lead_rel_speed"]] == pytest.approx(6.2419 - 5.8667, abs=1e-5)
    assert first.features[FEATURE_INDEX["ego_accel"]] == pytest.approx((5.8667 - 5.88) / 0.1, abs=1e-4)
    # not a2 (-0.0573): the reconstruction's accel looks ahead, the feature may not
    assert first.features[FEATURE_INDEX["ego_accel"]] != pytest.approx(-0.0573, abs=1e-3)
    for name in FEATURE_NAMES[5:]:
        assert math.isnan(first.features[FEATURE_INDEX[name]])


def test_labels_and_accel_are_action_labels_of_the_follower_speed(tmp_path: Path) -> None:
    import_ngsim(CHAIN, tmp_path, start_time_unix_ns=1)
    data = read_log(tmp_path / "ngsim-44-55.mcap")
    with open(CHAIN, newline="") as stream:
        rows = list(csv.DictReader(stream))
    t = np.array([float(r["t1"]) for r in rows])
    v = np.array([float(r["v5"]) for r in rows])
    labels, accel = lookahead_labels(t, v)
    np.testing.assert_array_equal([o.actual.action_index for o in data.observations], labels[1:])
    np.testing.assert_allclose([o.actual.controls[0] for o in data.observations], accel[1:], atol=1e-5)
    ego_accel = [o.features[FEATURE_INDEX["ego_accel"]] for o in data.observations]
    np.testing.assert_allclose(ego_accel, backward_accel(t, v)[1:], atol=1e-5)
    assert {ACTIONS[i] for i in labels if i >= 0} >= {"keep"}
    assert all(math.isnan(o.actual.controls[1]) for o in data.observations)


def test_errors_name_file_line_and_column(tmp_path: Path) -> None:
    lines = CHAIN.read_text().splitlines()
    bad = tmp_path / "1_2_3_4_5_6.csv"
    bad.write_text("\n".join([lines[0], lines[1], lines[2].replace(",11,", ",12,", 1), *lines[3:]]) + "\n")
    with pytest.raises(NgsimError, match=r"1_2_3_4_5_6.csv: line 3, column 'ID2': the vehicle changes"):
        read_ngsim_chain(bad)
    bad.write_text("\n".join([lines[0].replace("Y3", "Z3"), *lines[1:]]) + "\n")
    with pytest.raises(NgsimError, match=r"line 1 \(header\): missing column 'Y3'"):
        read_ngsim_chain(bad)
    bad.write_text("\n".join([lines[0], lines[1], lines[2].replace("5.8667", "x", 1), *lines[3:]]) + "\n")
    with pytest.raises(NgsimError, match=r"line 3, column 'v2': 'x' is not a number"):
        read_ngsim_chain(bad)


def test_an_output_over_the_input_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A chain file whose name is one of the sessions' (ngsim-1-11.mcap) in the output folder: its
    first pair was written over it. Refused before any file is written."""
    src = tmp_path / "ngsim-1-11.mcap"
    src.write_bytes(CHAIN.read_bytes())
    assert main(["import", "ngsim", str(src), "-o", str(tmp_path)]) == 2
    printed = "".join(capsys.readouterr())
    assert f"{src}: the output would overwrite the input {src}" in printed, printed
    assert src.read_bytes() == CHAIN.read_bytes() and sorted(tmp_path.iterdir()) == [src]
