"""The CSV importer: a good file round-trips; malformed files fail naming file, line and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualloop.controller.logs.import_csv import CsvImportError, import_csv
from dualloop.controller.logs.logfile import read_log
from dualloop.sim.schema import ACTION_INDEX, FEATURE_NAMES

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
            r"line 3, column 'ego_speed': 'nan' is not a finite",
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
