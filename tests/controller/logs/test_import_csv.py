"""The CSV importer: a good file round-trips; malformed files fail naming file, line and column."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from dualloop.controller.cli import main
from dualloop.controller.logs.import_csv import CsvImportError, import_csv
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.training.recorded import read_log_rows
from dualloop.executor.action_labels import backward_accel, lookahead_labels
from dualloop.sim.schema import ACTION_INDEX, FEATURE_INDEX, FEATURE_NAMES, PLAN_NAMES

HEADER = ["time", *FEATURE_NAMES, "actual_action", "actual_accel", "actual_steer"]


def row(t: str, speed: float = 20.0, action: str = "keep", accel: str = "0.1", steer: str = "0.01") -> list[str]:
    features = [str(speed), "0.2", "1", "40", "-1.5"] + ["0"] * 6 + ["150", "0"] * 4
    return [t, *features, action, accel, steer]


def write_csv(path: Path, rows: list[list[str]], header: list[str] = HEADER) -> Path:
    path.write_text("\n".join(",".join(cells) for cells in [header, *rows]) + "\n")
    return path


def test_good_file_round_trips(tmp_path: Path) -> None:
    rows = [row(f"{i * 0.01:.2f}", speed=20 + i / 100) for i in range(200)]
    rows[5] = row("0.05", action="2")  # an index works as well as a name
    rows[6] = row("0.06", action="", accel="-4.0")  # no action given: derived from the accel
    rows[7] = row("0.07", action="", accel="", steer="")  # nothing known for this row
    src = write_csv(tmp_path / "drive.csv", rows)
    report = import_csv(src, tmp_path / "drive.mcap")
    data = read_log(tmp_path / "drive.mcap")
    assert report.observations == 200 and len(data.observations) == 200 and not data.truncated
    assert [o.timestamp_ns for o in data.observations[:3]] == [0, 10_000_000, 20_000_000]
    assert data.observations[10].features[0] == pytest.approx(20.1)
    assert list(data.observations[10].features[3:5]) == [40.0, -1.5]
    assert data.observations[10].actual.action_index == ACTION_INDEX["keep"]
    assert list(data.observations[10].actual.controls) == [pytest.approx(0.1), pytest.approx(0.01)]
    assert data.observations[5].actual.action_index == 2
    assert data.observations[6].actual.action_index == ACTION_INDEX["brake_hard"]
    assert not data.observations[7].HasField("actual")
    assert data.header.source == f"csv import of {src}" and list(data.header.feature_names) == list(FEATURE_NAMES)
    assert report.label_counts["unknown"] == 1 and report.rate_hz == pytest.approx(100)
    assert "200 observations" in report.summary()


def test_features_only_file_is_enough(tmp_path: Path) -> None:
    src = write_csv(tmp_path / "plain.csv", [row("1.0")[:20], row("1.5")[:20]], header=HEADER[:20])
    data = read_log(import_csv(src, tmp_path / "plain.mcap").out_path)
    assert [o.timestamp_ns for o in data.observations] == [1_000_000_000, 1_500_000_000]
    # No action column: the look-ahead label needs 0.5 s of future, which the last row lacks.
    assert data.observations[0].actual.action_index == ACTION_INDEX["keep"]
    assert not data.observations[1].HasField("actual")


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda h, r: (h[:1] + h[2:], [x[:1] + x[2:] for x in r]), r"line 1 \(header\): missing column 'ego_speed'"),
        (
            lambda h, r: (h, r[:2] + [row("0.02", speed="fast")] + r[3:]),
            r"line 4, column 'ego_speed': 'fast' is not a number",
        ),
        (
            lambda h, r: (h, r[:3] + [row("0.01")] + r[4:]),
            r"line 5, column 'time': 0\.01 s is not after 0\.02 s \(line 4\)",
        ),
        (lambda h, r: (h, r[:3] + [row("0.02")] + r[4:]), r"line 5, column 'time': 0\.02 s is not after 0\.02 s"),
        (
            lambda h, r: (h, r[:1] + [row("0.01", speed="nan")] + r[2:]),
            r"line 3, column 'ego_speed': nan; every row needs ego_speed",
        ),
        (lambda h, r: (h + ["colour"], [x + ["red"] for x in r]), r"line 1 \(header\): unknown column 'colour'"),
        (lambda h, r: (h, r[:1] + [row("0.01", action="swerve")] + r[2:]), r"line 3, column 'actual_action': 'swerve'"),
        (lambda h, r: (h, r[:1] + [row("0.01", accel="")] + r[2:]), r"line 3, column 'actual_accel': empty while"),
        (lambda h, r: (h, r[:1] + [row("0.01")[:-1]] + r[2:]), r"line 3: 22 cells, the header has 23"),
        (lambda h, r: (h[:-2] + h[-1:], [x[:-2] + x[-1:] for x in r]), r"missing column 'actual_accel'"),
    ],
    ids=[
        "missing-column",
        "non-numeric",
        "time-backwards",
        "time-repeated",
        "nan",
        "unknown-column",
        "unknown-action",
        "half-controls",
        "short-row",
        "steer-without-accel",
    ],
)
def test_malformed_files_name_file_line_and_column(tmp_path: Path, mutate, message: str) -> None:
    header, rows = mutate(list(HEADER), [row(f"{i * 0.01:.2f}") for i in range(6)])
    src = write_csv(tmp_path / "bad.csv", rows, header)
    with pytest.raises(CsvImportError, match=message) as caught:
        import_csv(src, tmp_path / "bad.mcap")
    assert str(caught.value).startswith(f"{src}: ")
    assert not (tmp_path / "bad.mcap").exists()  # nothing half-written


def test_an_empty_or_nan_feature_cell_is_a_missing_reading(tmp_path: Path) -> None:
    """Found by QA: a sensor dropout (an empty or NaN cell) could not be imported at all. It is kept
    as a missing reading, as a live client would send it; inf is still refused, and ego_speed (every
    row's labels) must be there."""
    rows = [row(f"{i * 0.01:.2f}") for i in range(40)]
    gap = HEADER.index("lead_distance")
    for i, cell in ((10, ""), (11, "nan"), (12, "NaN"), (30, "NA")):
        rows[i][gap] = cell
    report = import_csv(write_csv(tmp_path / "dropout.csv", rows), tmp_path / "dropout.mcap")
    data = read_log(tmp_path / "dropout.mcap")
    assert len(data.observations) == 40
    gaps = [o.features[FEATURE_INDEX["lead_distance"]] for o in data.observations]
    assert [i for i, g in enumerate(gaps) if math.isnan(g)] == [10, 11, 12, 30]
    assert all(g == 40.0 for i, g in enumerate(gaps) if i not in (10, 11, 12, 30))
    said = " ".join(report.warnings)
    assert "column 'lead_distance': 4 empty or NaN cell(s), from line 12, imported as missing readings" in said
    rows[20][gap] = "inf"
    with pytest.raises(CsvImportError, match=r"line 22, column 'lead_distance': 'inf' is not a finite number"):
        import_csv(write_csv(tmp_path / "inf.csv", rows), tmp_path / "inf.mcap")


def test_bytes_that_are_not_utf8_name_the_line(tmp_path: Path) -> None:
    """A file saved as Latin-1 (found by tests/fuzz: was a UnicodeDecodeError traceback)."""
    src = write_csv(tmp_path / "latin.csv", [row(f"{i * 0.01:.2f}") for i in range(4)])
    lines = src.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b",", b",\xe9", 1)
    src.write_bytes(b"\n".join(lines))
    with pytest.raises(
        CsvImportError, match=r"latin\.csv: line 4: byte 0xe9 is not UTF-8 text; save the file as UTF-8"
    ):
        import_csv(src, tmp_path / "latin.mcap")


def test_unknown_columns_can_be_ignored_with_a_warning(tmp_path: Path) -> None:
    src = write_csv(tmp_path / "extra.csv", [x + ["red"] for x in (row("0"), row("0.01"))], HEADER + ["colour"])
    report = import_csv(src, tmp_path / "extra.mcap", allow_extra_columns=True)
    assert report.observations == 2 and report.warnings == ["ignored unknown column colour"]


def test_empty_and_header_only_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(CsvImportError, match=r"empty.csv: empty file"):
        import_csv(empty, tmp_path / "e.mcap")
    only_header = write_csv(tmp_path / "header.csv", [])
    with pytest.raises(CsvImportError, match=r"header.csv: no data rows"):
        import_csv(only_header, tmp_path / "h.mcap")
    with pytest.raises(CsvImportError, match="no such file"):
        import_csv(tmp_path / "absent.csv", tmp_path / "a.mcap")


def write_table(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    path.write_text("\n".join(",".join(str(c) for c in cells) for cells in [header, *rows]) + "\n")
    return path


def speed_profile(n: int = 40, dt: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    t = 100.0 + dt * np.arange(n)
    return t, 20.0 + 2.0 * np.sin(t)  # m/s, accelerating and braking


def test_five_columns_with_declared_units(tmp_path: Path) -> None:
    t, v = speed_profile()
    rows = [[f"{ti:.1f}", f"{vi * 3.6:.6f}", 1, f"{30 / 0.3048:.6f}", f"{-1 / 0.44704:.6f}"] for ti, vi in zip(t, v)]
    header = ["time", "ego_speed[km/h]", "lead_present", "lead_distance", "lead_rel_speed [mph]"]
    src = write_table(tmp_path / "five.csv", header, rows)
    report = import_csv(src, tmp_path / "five.mcap", units={"lead_distance": "ft"}, start_time_unix_ns=1)
    data = read_log(tmp_path / "five.mcap")
    head = data.header
    measured = ["ego_speed", "ego_accel", "lead_present", "lead_distance", "lead_rel_speed"]
    assert list(head.measured_features) == measured and report.measured_features == measured
    assert not head.filled_features and "backward slope of ego_speed over 0.5 s" in head.source_details["ego_accel"]
    assert head.observation_period_ns == 100_000_000 and head.tick_period_ns == 5_000_000
    assert "lookahead_labels" in head.source_details["actual_action"]
    # the first row has no past for ego_accel: left out, with a warning naming its line
    assert len(data.observations) == 39 and data.observations[0].timestamp_ns == 100_100_000_000
    assert any("line 2" in w for w in report.warnings)
    x = np.array([o.features for o in data.observations], dtype=np.float64)
    np.testing.assert_allclose(x[:, FEATURE_INDEX["ego_speed"]], v[1:], rtol=1e-5)
    np.testing.assert_allclose(x[:, FEATURE_INDEX["lead_distance"]], 30.0, rtol=1e-5)
    np.testing.assert_allclose(x[:, FEATURE_INDEX["lead_rel_speed"]], -1.0, rtol=1e-5)
    np.testing.assert_allclose(x[:, FEATURE_INDEX["ego_accel"]], backward_accel(t, v)[1:], atol=1e-4)
    missing = [FEATURE_INDEX[n] for n in FEATURE_NAMES if n not in measured]
    assert np.isnan(x[:, missing]).all()
    labels, accel = lookahead_labels(t, v)
    stored = [o.actual.action_index if o.HasField("actual") else -1 for o in data.observations]
    assert stored == labels[1:].tolist() and labels[-5:].tolist() == [-1] * 5
    assert data.observations[0].actual.controls[0] == pytest.approx(accel[1], abs=1e-3)
    assert math.isnan(data.observations[0].actual.controls[1])
    assert set(labels[1:-5].tolist()) >= {ACTION_INDEX["brake"], ACTION_INDEX["accelerate"]}


def test_speed_in_kmh_without_a_declaration_is_refused(tmp_path: Path) -> None:
    t, v = speed_profile()
    rows = [[f"{ti:.1f}", f"{vi * 3.6:.3f}"] for ti, vi in zip(t, v)]
    src = write_table(tmp_path / "kmh.csv", ["time", "ego_speed"], rows)
    line = int(np.argmax(v)) + 2
    with pytest.raises(CsvImportError) as caught:
        import_csv(src, tmp_path / "kmh.mcap")
    message = str(caught.value)
    assert message.startswith(f"{src}: line {line}, column 'ego_speed': ")
    assert "looks like km/h; declare --units ego_speed=km/h" in message
    assert import_csv(src, tmp_path / "kmh.mcap", units={"ego_speed": "km/h"}).observations == 39


@pytest.mark.parametrize(
    ("header", "units", "message"),
    [
        (["time", "ego_speed", "colour"], {}, r"line 1 \(header\): unknown column 'colour' .*--allow-extra-columns"),
        (["time", "ego_speed[furlongs]"], {}, r"line 1 \(header\), column 'ego_speed': unit 'furlongs' .*km/h, .*mph"),
        (["time", "ego_speed"], {"ego_speed": "ft"}, r"column 'ego_speed': unit 'ft' is not one"),
        (["time", "ego_speed"], {"lead_distance": "ft"}, r"--units names column 'lead_distance', which is not in"),
        (["time", "ego_speed[km/h]"], {"ego_speed": "mph"}, r"the header says \[km/h\], --units says mph"),
        (["time", "ego_speed", "target_speed"], {}, r"plan columns 'target_lane_offset', .* all together"),
        (["time", "lead_distance"], {}, r"missing column 'ego_speed'"),
    ],
    ids=["unknown-column", "unknown-unit", "wrong-dimension", "units-for-absent", "two-units", "half-plan", "no-speed"],
)
def test_header_errors_name_the_column(tmp_path: Path, header: list[str], units: dict[str, str], message: str) -> None:
    src = write_table(tmp_path / "h.csv", header, [[0.1 * i] + [1.0] * (len(header) - 1) for i in range(5)])
    with pytest.raises(CsvImportError, match=message) as caught:
        import_csv(src, tmp_path / "h.mcap", units=units)
    assert str(caught.value).startswith(f"{src}: ")


def test_declared_rate_and_irregular_rows(tmp_path: Path) -> None:
    t = np.cumsum(np.where(np.arange(60) % 3 == 0, 0.15, 0.05))  # jittery logger
    v = np.full(60, 10.0)
    src = write_table(
        tmp_path / "j.csv", ["time", "ego_speed", "ego_accel"], [[f"{a:.3f}", b, 0] for a, b in zip(t, v)]
    )
    measured = import_csv(src, tmp_path / "m.mcap")
    assert any(w.startswith("irregular rows") for w in measured.warnings)
    assert read_log(tmp_path / "m.mcap").header.observation_period_ns == 50_000_000
    declared = import_csv(src, tmp_path / "d.mcap", rate_hz=12.5)
    assert not any(w.startswith("irregular") for w in declared.warnings)
    head = read_log(tmp_path / "d.mcap").header
    assert head.observation_period_ns == 80_000_000 and head.source_details["rate"] == "12.5 Hz, declared"
    assert list(head.measured_features) == ["ego_speed", "ego_accel"]  # from the file: nothing derived
    assert "ego_accel" not in head.source_details


def test_plan_columns_become_plan_updates(tmp_path: Path) -> None:
    header = ["time", "ego_speed", "ego_accel", *PLAN_NAMES, "actual_accel"]
    plans = [[25, 0, 1, 0, 0, 0]] * 3 + [[25, 3.5, 0, 1, 0, 0]] * 2 + [[25, 0, 1, 0, 0, 0]]
    rows = [[0.1 * i, 20, 0, *p, -1.0] for i, p in enumerate(plans)]
    src = write_table(tmp_path / "p.csv", header, rows)
    data = read_log(import_csv(src, tmp_path / "p.mcap").out_path)
    assert [o.plan.plan_id for o in data.observations] == ["plan-1"] * 3 + ["plan-2"] * 2 + ["plan-3"]
    assert list(data.observations[3].plan.values) == [25, 3.5, 0, 1, 0, 0]
    # each plan is valid over its rows and one interval beyond (a repeated id does not extend it)
    assert [o.plan.valid_for_ns for o in data.observations] == [300_000_000] * 3 + [200_000_000] * 2 + [100_000_000]
    # actual_accel without actual_steer: the band of the accel, steer NaN
    first = data.observations[0].actual
    assert first.action_index == ACTION_INDEX["brake"] and first.controls[0] == -1.0 and math.isnan(first.controls[1])
    assert data.header.source_details["actual_action"] == "the band of actual_accel"


def test_cli_csv_with_units(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t, v = speed_profile()
    src = write_table(
        tmp_path / "c.csv", ["time", "ego_speed"], [[f"{a:.1f}", f"{b / 0.44704:.4f}"] for a, b in zip(t, v)]
    )
    assert (
        main(["import", "csv", str(src), "--units", "ego_speed=mph", "--rate-hz", "10", "-o", str(tmp_path / "c.mcap")])
        == 0
    )
    assert "39 observations" in "".join(capsys.readouterr())
    assert main(["import", "csv", str(src), "--units", "ego_speed"]) == 2
    assert "is not NAME=UNIT" in "".join(capsys.readouterr())


def test_the_dataset_names_the_drives_site(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--dataset is what per-dataset reports and site calibration group by; without it a drive is "csv";
    a name the grouping would cut is refused naming the flag."""
    src = write_csv(tmp_path / "drive.csv", [row(f"{i * 0.1:.1f}") for i in range(30)])
    assert main(["import", "csv", str(src), "-o", str(tmp_path / "a.mcap"), "--dataset", "Fleet North"]) == 0
    import_csv(src, tmp_path / "b.mcap")
    rows = read_log_rows([tmp_path / "a.mcap", tmp_path / "b.mcap"])
    assert rows.datasets == ("fleet-north", "csv")
    assert main(["import", "csv", str(src), "-o", str(tmp_path / "c.mcap"), "--dataset", "north, 2026"]) == 2
    assert "--dataset 'north, 2026'" in "".join(capsys.readouterr())


def test_an_output_over_the_input_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`-o` naming the CSV itself (as given, through another spelling, or a hard link to it) was written
    over with the MCAP log: the user's drive lost. Refused naming both paths; the CSV untouched."""
    src = write_csv(tmp_path / "base.csv", [row(f"{i * 0.1:.1f}") for i in range(30)])
    before = src.read_bytes()
    link = tmp_path / "link.mcap"
    link.hardlink_to(src)
    for out in (src, tmp_path / "sub" / ".." / "base.csv", link):
        assert main(["import", "csv", str(src), "-o", str(out)]) == 2
        printed = "".join(capsys.readouterr())
        assert f"error: {out}: the output would overwrite the input {src}" in printed, printed
        assert src.read_bytes() == before
    assert main(["import", "csv", str(src), "-o", str(tmp_path / "base.mcap")]) == 0


def test_values_out_of_range_are_kept_with_a_warning_naming_the_first_line(tmp_path: Path) -> None:
    """A flag of 7, a negative gap and a reversing speed (found by QA: imported silently)."""
    rows = [row(f"{i * 0.01:.2f}") for i in range(6)]
    rows[2][FEATURE_INDEX["lead_present"] + 1] = "7"
    rows[3][FEATURE_INDEX["lead_distance"] + 1] = "-2"
    rows[4][FEATURE_INDEX["ego_speed"] + 1] = "-3"
    rows[5][FEATURE_INDEX["ego_speed"] + 1] = "-0.2"  # a standstill's noise: no warning
    report = import_csv(write_csv(tmp_path / "odd.csv", rows), tmp_path / "odd.mcap")
    assert report.observations == 6  # kept: a real log's faults are for the checks to judge
    assert report.warnings == [
        "column 'ego_speed': 1 row(s) out of range (first at line 6: -3 m/s); the model knows forward driving only",
        "column 'lead_present': 1 row(s) out of range (first at line 4: 7); a flag is 1 or 0",
        "column 'lead_distance': 1 row(s) out of range (first at line 5: -2 m); a gap is at least 0 m "
        "(150 m when nothing is there)",
    ]
    data = read_log(report.out_path)
    assert data.observations[2].features[FEATURE_INDEX["lead_present"]] == 7.0


def test_a_declared_rate_far_from_the_rows_is_refused(tmp_path: Path) -> None:
    src = write_csv(tmp_path / "ten.csv", [row(f"{i * 0.1:.1f}") for i in range(20)])
    with pytest.raises(CsvImportError, match=r"ten\.csv: --rate-hz 1e\+09 declares a reading every 1e-06 ms, but the "):
        import_csv(src, tmp_path / "x.mcap", rate_hz=1e9)
    assert not (tmp_path / "x.mcap").exists()
    report = import_csv(src, tmp_path / "ok.mcap", rate_hz=12.0)  # within twice: a sensor's own rate
    assert report.rate_hz == pytest.approx(12.0)
