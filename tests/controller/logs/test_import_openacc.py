"""The OpenACC importer on cut real files: both layouts, hand-computed rows, pieces, errors."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.cli import main
from dualloop.controller.logs.format import actual_is_command
from dualloop.controller.logs.import_openacc import OpenAccError, import_openacc, read_openacc
from dualloop.controller.logs.logfile import read_log
from dualloop.executor.action_labels import ACTIONS, backward_accel, lookahead_labels
from dualloop.sim.schema import FEATURE_INDEX, FEATURE_NAMES
from tests.paths import FIXTURES

REAL = FIXTURES / "real-drives"
ASTAZERO = REAL / "openacc-astazero-human" / "ASta_040719_platoon3_new.csv"
ZALA26 = REAL / "openacc-zalazone-human" / "handling_part26.csv"
ZALA40 = REAL / "openacc-zalazone-human" / "handling_part40.csv"
FIVE = ["ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed"]


def features(data, name: str) -> np.ndarray:
    return np.array([o.features[FEATURE_INDEX[name]] for o in data.observations], dtype=np.float64)


def jrc_columns(path: Path) -> dict[str, list[float]]:
    """An independent reader (the dataset README's): name -> values, NaN for empty cells."""
    with open(path, newline="") as stream:
        rows = list(csv.reader(stream))[5:]
    header, data = rows[0], rows[1:]
    return {h: [float(r[i]) if r[i] != "" else math.nan for r in data] for i, h in enumerate(header)}


def test_astazero_rows_match_hand_computed_values(tmp_path: Path) -> None:
    reports = import_openacc(ASTAZERO, tmp_path, start_time_unix_ns=1)
    assert [r.session_id for r in reports] == ["ASta_040719_platoon3_new-v2-follows-v1"]
    data = read_log(tmp_path / "ASta_040719_platoon3_new-v2-follows-v1.mcap")
    head = data.header
    assert list(head.measured_features) == FIVE and not head.filled_features
    assert head.observation_period_ns == 100_000_000 and head.tick_period_ns == 5_000_000
    assert "CC BY 4.0" in head.source_details["licence"] and "Keke-Long" in head.source_details["licence"]
    assert not actual_is_command(head)
    # Row 0 (t = 1.0) has no past for ego_accel: the session starts at row 1 (t = 1.1).
    first = data.observations[0]
    assert first.timestamp_ns == 1_100_000_000 and len(data.observations) == 149
    assert first.features[FEATURE_INDEX["ego_speed"]] == pytest.approx(14.29524076, abs=1e-5)
    assert first.features[FEATURE_INDEX["lead_distance"]] == pytest.approx(48.99551072255157, abs=1e-5)
    assert first.features[FEATURE_INDEX["lead_rel_speed"]] == pytest.approx(16.17277662 - 14.29524076, abs=1e-5)
    assert first.features[FEATURE_INDEX["lead_present"]] == 1.0
    # Early rows use the span they have: (v(1.1) - v(1.0)) / 0.1; from t = 1.5 the full 0.5 s window.
    assert first.features[FEATURE_INDEX["ego_accel"]] == pytest.approx((14.29524076 - 14.16481157) / 0.1, abs=1e-4)
    at_15 = data.observations[4]
    assert at_15.timestamp_ns == 1_500_000_000
    assert at_15.features[FEATURE_INDEX["ego_accel"]] == pytest.approx((14.81913036 - 14.16481157) / 0.5, abs=1e-4)
    # The label at 1.1 s: (v(1.6) - v(1.1)) / 0.5 = 1.31 m/s^2 -> accelerate.
    assert first.actual.action_index == ACTIONS.index("accelerate")
    assert first.actual.controls[0] == pytest.approx((14.94909091 - 14.29524076) / 0.5, abs=1e-4)
    assert math.isnan(first.actual.controls[1])
    for name in FEATURE_NAMES:
        if name not in FIVE:
            assert np.isnan(features(data, name)).all(), name


def test_zalazone_pairs_pieces_and_holes(tmp_path: Path) -> None:
    reports = import_openacc(ZALA26, tmp_path, start_time_unix_ns=1)
    ids = [r.session_id for r in reports]
    # A 1.5 s hole in Speed7/IVS7 splits the two pairs that use them; both sides are over 10 s.
    assert ids == [
        "handling_part26-v3-follows-v2",
        "handling_part26-v4-follows-v3",
        "handling_part26-v5-follows-v4",
        "handling_part26-v6-follows-v5",
        "handling_part26-v7-follows-v6-p1",
        "handling_part26-v7-follows-v6-p2",
        "handling_part26-v8-follows-v7-p1",
        "handling_part26-v8-follows-v7-p2",
        "handling_part26-v11-follows-v10",
    ]
    first = read_log(tmp_path / "handling_part26-v8-follows-v7-p1.mcap")
    second = read_log(tmp_path / "handling_part26-v8-follows-v7-p2.mcap")
    assert first.observations[-1].timestamp_ns == 6_842_100_000_000  # the last row before the hole
    assert second.observations[0].timestamp_ns == 6_843_800_000_000  # 6843.7 starts it, without a past
    assert first.observations[-1].features[FEATURE_INDEX["lead_distance"]] == pytest.approx(-0.00739, abs=1e-5)
    assert "AUDI_E_TRON" in first.header.source_details["pair"] and "BMW_I3" in first.header.source_details["pair"]
    # IVS6 has a 0.5 s hole inside piece 2 of v6-follows-v5: its rows are skipped, the piece goes on.
    v6 = read_log(tmp_path / "handling_part26-v6-follows-v5.mcap")
    gaps = np.diff([o.timestamp_ns for o in v6.observations])
    assert gaps.max() == 600_000_000 and np.count_nonzero(gaps != 100_000_000) == 1


def test_zalazone_whole_session_against_an_independent_reader(tmp_path: Path) -> None:
    import_openacc(ZALA40, tmp_path, start_time_unix_ns=1)
    data = read_log(tmp_path / "handling_part40-v3-follows-v2.mcap")
    cols = jrc_columns(ZALA40)
    # Speed3 and IVS2 are empty for rows 0-81: the session starts at row 82 (+1 for the accel's past).
    rows = range(83, 250)
    assert [o.timestamp_ns for o in data.observations] == [round(cols["Time"][r] * 10) * 100_000_000 for r in rows]
    ego = np.array([cols["Speed3"][r] for r in rows])
    np.testing.assert_allclose(features(data, "ego_speed"), ego, rtol=1e-6)
    np.testing.assert_allclose(features(data, "lead_distance"), [cols["IVS2"][r] for r in rows], rtol=1e-6)
    np.testing.assert_allclose(
        features(data, "lead_rel_speed"), [cols["Speed2"][r] - cols["Speed3"][r] for r in rows], atol=1e-5
    )
    assert data.observations[0].features[FEATURE_INDEX["ego_speed"]] == pytest.approx(1.1871199455006078, abs=1e-6)
    assert data.observations[0].features[FEATURE_INDEX["lead_distance"]] == pytest.approx(5.296251859174948, abs=1e-6)
    # Labels and ego_accel are action_labels' on the piece (which includes row 82).
    t = np.array([cols["Time"][r] for r in range(82, 250)])
    v = np.array([cols["Speed3"][r] for r in range(82, 250)])
    labels, accel = lookahead_labels(t, v)
    np.testing.assert_array_equal([o.actual.action_index for o in data.observations], labels[1:])
    np.testing.assert_allclose([o.actual.controls[0] for o in data.observations], accel[1:], atol=1e-5)
    np.testing.assert_allclose(features(data, "ego_accel"), backward_accel(t, v)[1:], atol=1e-5)
    assert labels[-5:].tolist() == [-1] * 5  # the last 0.5 s has no look-ahead
    assert data.header.source_details["vehicle_order"].startswith("SKODA_TARGET,JAGUAR_I_PACE")


def test_one_output_file_name(tmp_path: Path) -> None:
    out = tmp_path / "lap.mcap"
    assert [r.out_path for r in import_openacc(ASTAZERO, out)] == [out]
    several = import_openacc(ZALA40, tmp_path / "z.mcap")
    assert [r.out_path.name for r in several][:2] == ["z-v3-follows-v2.mcap", "z-v4-follows-v3.mcap"]


def test_refuses_acc_runs_and_other_files(tmp_path: Path) -> None:
    acc = tmp_path / "handling_acc.csv"
    acc.write_text(ZALA40.read_text().replace("ACC,0", "ACC,1", 1))
    with pytest.raises(OpenAccError, match=r"handling_acc.csv: line 4, column 2: ACC,1"):
        read_openacc(acc)
    other = tmp_path / "other.csv"
    other.write_text("t,v\n0,1\n")
    with pytest.raises(OpenAccError, match=r"other.csv: line 1, column 1: 't': not an OpenACC file"):
        read_openacc(other)
    broken = tmp_path / "ASta_broken_new.csv"
    lines = ASTAZERO.read_text().splitlines()
    lines[3] = lines[3].replace("14.43025809", "fast")
    broken.write_text("\n".join(lines) + "\n")
    with pytest.raises(OpenAccError, match=r"line 4, column 'Speed2': 'fast' is not a number"):
        read_openacc(broken)


def test_driver_column_keeps_only_human_rows(tmp_path: Path) -> None:
    """A JRC original with Driver{k}: rows where the follower is under ACC are not usable."""
    lines = ZALA40.read_text().splitlines()
    header = lines[5] + ",Driver3"
    rows = [line + (",ACC" if k < 150 else ",Human") for k, line in enumerate(lines[6:])]
    mixed = tmp_path / "handling_mixed.csv"
    mixed.write_text("\n".join(lines[:5] + [header] + rows) + "\n")
    parsed = read_openacc(mixed)
    pair = next(p for p in parsed.pairs if p.session_id.endswith("v3-follows-v2"))
    assert np.isnan(pair.ego_speed[:150]).all() and np.isfinite(pair.ego_speed[150:]).all()


@pytest.mark.parametrize(
    ("name", "campaign"),
    [("JRC-VC_280219_part2.csv", "Vicolungo"), ("JRC-Cher_3008_rec2_part1.csv", "Cherasco"), ("run7.csv", "unknown")],
)
def test_the_campaign_comes_from_jrcs_file_names(tmp_path: Path, name: str, campaign: str) -> None:
    """Each campaign is its own dataset in the per-dataset reports (its site, cars and drivers)."""
    copy = tmp_path / name
    copy.write_text(ZALA40.read_text())
    assert read_openacc(copy).campaign == campaign
    reports = import_openacc(copy, tmp_path / "out")
    detail = read_log(reports[0].out_path).header.source_details["dataset"]
    assert detail.startswith(f"OpenACC {campaign} (JRC)")


@pytest.mark.parametrize(("damage", "cells"), [("cut", 2), ("padded", 14)])
def test_a_row_with_more_or_fewer_cells_than_the_header_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], damage: str, cells: int
) -> None:
    """A cut row was imported with its missing cells as NaN, a padded one with its extra cells ignored:
    a damaged file used silently. Refused as `import csv` and `import ngsim` refuse it, naming the line."""
    lines = ASTAZERO.read_text().splitlines()
    lines[49] = "5.9,16" if damage == "cut" else lines[49] + ",1,2,3,4"
    damaged = tmp_path / "oa.csv"
    damaged.write_text("\n".join(lines) + "\n")
    header = len(lines[0].split(","))
    assert main(["import", "openacc", str(damaged), "-o", str(tmp_path / "out")]) == 2
    printed = "".join(capsys.readouterr())
    assert f"error: {damaged}: line 50: {cells} cells, the header has {header}" in printed, printed
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").iterdir())


def test_an_output_over_the_input_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`-o` naming the file itself (one session: that very name) replaced the drive with its log."""
    src = tmp_path / "lap.mcap"
    src.write_bytes(ASTAZERO.read_bytes())
    assert main(["import", "openacc", str(src), "-o", str(src)]) == 2
    assert f"{src}: the output would overwrite the input {src}" in "".join(capsys.readouterr())
    assert src.read_bytes() == ASTAZERO.read_bytes()
