"""Recorded drives given as a folder: a rotated recording's parts are one log (found by QA: eval-logs
counted a two-session recording in three parts as six sessions, each a third of a drive)."""

from __future__ import annotations

import time
from pathlib import Path

from dualloop.controller.logs.format import rotated_files, rotated_groups
from dualloop.controller.logs.recorder import Recorder
from dualloop.controller.training.recorded import read_log_rows
from tests.controller.logs.test_recording import header, observation


def test_a_rotated_recording_in_a_folder_is_read_as_one_log(tmp_path: Path) -> None:
    stem = tmp_path / "drives" / "rec.mcap"
    stem.parent.mkdir()
    with Recorder(stem, rotate_bytes=40_000, flush_interval_s=0.01) as rec:
        for sid in ("car-1", "car-2"):
            rec.open_session(header(sid))
        for i in range(1, 1501):
            for sid in ("car-1", "car-2"):
                rec.write_observation(sid, observation(i))
            if i % 200 == 0:
                time.sleep(0.002)  # let the writer keep up: this test is about the parts, not drops
    assert rec.stats.total_dropped == 0 and len(rotated_files(stem)) >= 3
    rows = read_log_rows([stem.parent])
    assert sorted(rows.sessions) == ["car-1", "car-2"]
    assert len(rows.session) == 3000  # every observation once, each session whole


def test_only_a_series_with_its_part_0_is_grouped(tmp_path: Path) -> None:
    names = ["rec-0001.mcap", "a.mcap", "rec-0000.mcap", "drive-0001.mcap", "rec-0002.mcap", "drive-0002.mcap"]
    files = [tmp_path / n for n in names]
    groups = [[p.name for p in g] for g in rotated_groups(files)]
    assert groups == [
        ["rec-0000.mcap", "rec-0001.mcap", "rec-0002.mcap"],  # where its first file was, in part order
        ["a.mcap"],
        ["drive-0001.mcap"],  # no part 0: files of their own, named so by their writer
        ["drive-0002.mcap"],
    ]
