"""The train / held-out split of the shared data, and `dualloop import shared-data`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dualloop.controller.cli import main
from dualloop.controller.logs import datasets as ds
from dualloop.controller.logs.logfile import read_log
from dualloop.controller.logs.shared_data import import_shared_data
from tests.paths import FIXTURES

REAL_FIXTURES = FIXTURES / "real-drives"
SHARED = Path("/work/shared/data")
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="the shared data sets are not on this machine")


def ngsim(*ids: int) -> ds.DriveSource:
    name = "_".join(map(str, ids)) + ".csv"
    pairs = tuple(ds.PairRef(f"ngsim-{a}-{b}", f"ngsim:{a}", f"ngsim:{b}") for a, b in zip(ids, ids[1:]))
    return ds.DriveSource(ds.NGSIM, "ngsim", Path(name), pairs)


def zala(part: int, *cars: str) -> ds.DriveSource:
    stem = f"handling_part{part}"
    pairs = tuple(
        ds.PairRef(f"{stem}-v{k + 3}-follows-v{k + 2}", f"zalazone:{a}", f"zalazone:{b}")
        for k, (a, b) in enumerate(zip(cars, cars[1:]))
    )
    return ds.DriveSource(ds.ZALAZONE, "openacc", Path(f"{stem}.csv"), pairs)


def assert_no_leak(drives: list[ds.Drive]) -> None:
    """No vehicle pair in both splits, no NGSIM vehicle in both, no session imported twice."""
    imported = {split: [p for d in drives if d.split == split for p in d.pairs] for split in ds.SPLITS}
    pairs = {split: {(p.leader, p.follower) for p in imported[split]} for split in ds.SPLITS}
    assert not pairs[ds.TRAIN] & pairs[ds.HELDOUT]
    vehicles = {
        split: {
            v
            for d in drives
            if d.split == split and d.dataset == ds.NGSIM
            for p in d.source.pairs
            for v in (p.leader, p.follower)
        }
        for split in ds.SPLITS
    }
    assert not vehicles[ds.TRAIN] & vehicles[ds.HELDOUT]
    sessions = [p.session_id for split in ds.SPLITS for p in imported[split]]
    assert len(sessions) == len(set(sessions))


def test_synthetic_list_splits_by_vehicle_ids_and_pairs() -> None:
    sources = [
        ngsim(1, 11, 24, 44, 55, 54),
        ngsim(11, 24, 44, 55, 54, 59),  # overlaps the first chain: four pairs repeat
        ngsim(590, 598, 601, 611, 621, 625),  # straddles 600
        ngsim(611, 621, 636, 649, 655, 660),
        ngsim(621, 636, 649, 655, 660, 683),
        zala(22, "TESLA_MODELX", "TESLA_MODEL3", "JAGUAR_I_PACE", "BMW_I3"),
        zala(35, "JAGUAR_I_PACE", "BMW_I3", "MERCEDES_GLE450"),
        zala(40, "JAGUAR_I_PACE", "BMW_I3"),
    ]
    drives = ds.assign_splits(sources)
    split = {d.path.name: d.split for d in drives}
    assert split["1_11_24_44_55_54.csv"] == ds.TRAIN and split["611_621_636_649_655_660.csv"] == ds.HELDOUT
    assert split["590_598_601_611_621_625.csv"] == ds.DROPPED
    assert split["handling_part22.csv"] == split["handling_part35.csv"] == ds.TRAIN
    assert split["handling_part40.csv"] == ds.HELDOUT
    by_name = {d.path.name: d for d in drives}
    assert [p.session_id for p in by_name["11_24_44_55_54_59.csv"].pairs] == ["ngsim-54-59"]
    assert {r for _, r, _ in by_name["11_24_44_55_54_59.csv"].skipped} == {ds.DUPLICATE}
    # BMW_I3 behind JAGUAR_I_PACE is held out in part 40: left out of parts 22 and 35
    assert [p.follower for p in by_name["handling_part22.csv"].pairs] == [
        "zalazone:TESLA_MODEL3",
        "zalazone:JAGUAR_I_PACE",
    ]
    assert [(r, p.follower) for p, r, _ in by_name["handling_part35.csv"].skipped] == [
        (ds.PAIR_HELD_OUT, "zalazone:BMW_I3")
    ]
    assert_no_leak(drives)


def test_the_leak_check_can_fail() -> None:
    drives = ds.assign_splits([ngsim(1, 2, 3, 4, 5, 6), ngsim(601, 602, 603, 604, 605, 606)])
    drives[1].pairs.append(drives[0].pairs[0])  # what a broken rule would do
    with pytest.raises(AssertionError):
        assert_no_leak(drives)


def test_fixture_folder_lists_like_the_shared_one() -> None:
    drives = ds.list_drives(REAL_FIXTURES)
    split = {d.path.name: d.split for d in drives}
    assert split == {
        "ASta_040719_platoon10_new.csv": ds.HELDOUT,
        "ASta_040719_platoon3_new.csv": ds.TRAIN,
        "handling_part26.csv": ds.TRAIN,
        "handling_part40.csv": ds.HELDOUT,
        "1_11_24_44_55_54.csv": ds.TRAIN,
        "890_898_905_909_916_920.csv": ds.HELDOUT,
    }
    part26 = next(d for d in drives if d.path.name == "handling_part26.csv")
    # part 40's first pair (BMW_I3 behind JAGUAR_I_PACE) is part 26's v7-follows-v6
    assert [p.session_id for p, _, _ in part26.skipped] == ["handling_part26-v7-follows-v6"]
    assert_no_leak(drives)


@needs_shared
def test_real_file_list_never_shares_a_vehicle_pair() -> None:
    drives = ds.list_drives(SHARED)
    assert_no_leak(drives)
    counts = {(d.dataset, d.split) for d in drives}
    assert (ds.NGSIM, ds.TRAIN) in counts and (ds.NGSIM, ds.HELDOUT) in counts
    assert next(d for d in drives if d.dataset == ds.COMMA2K19).split == ds.HELDOUT
    assert {d.path.name for d in drives if d.dataset == ds.ZALAZONE and d.split == ds.HELDOUT} == {
        "handling_part40.csv"
    }
    # the motorway campaigns: Vicolungo trains whole, Cherasco is held out whole, every pair imported
    for dataset, split, pairs in ((ds.VICOLUNGO, ds.TRAIN, 8), (ds.CHERASCO, ds.HELDOUT, 2)):
        mine = [d for d in drives if d.dataset == dataset]
        assert mine and {d.split for d in mine} == {split}
        assert sum(len(d.pairs) for d in mine) == pairs


def test_shared_data_import_writes_both_splits_and_a_manifest(tmp_path: Path) -> None:
    out = tmp_path / "real"
    (out / "train").mkdir(parents=True)
    (out / "train" / "stale.mcap").write_bytes(b"old")
    lines: list[str] = []
    result = import_shared_data(REAL_FIXTURES, out, progress=lines.append, start_time_unix_ns=1)
    assert not (out / "train" / "stale.mcap").exists()
    train = sorted(p.name for p in (out / "train").glob("*.mcap"))
    heldout = sorted(p.name for p in (out / "heldout").glob("*.mcap"))
    assert "ngsim-1-11.mcap" in train and "ngsim-890-898.mcap" in heldout
    assert "handling_part26-v7-follows-v6-p1.mcap" not in train  # a held-out car pair
    assert "handling_part40-v3-follows-v2.mcap" in heldout and "ASta_040719_platoon3_new-v2-follows-v1.mcap" in train
    assert len(lines) == 6 and lines[0].startswith("[1/6]")
    manifest = json.loads((out / "manifest.json").read_text())
    assert sorted(s["file"] for s in manifest["sessions"]) == sorted(
        [f"train/{n}" for n in train] + [f"heldout/{n}" for n in heldout]
    )
    assert [(x["session"], x["reason"]) for x in manifest["left_out"]] == [
        ("handling_part26-v7-follows-v6", ds.PAIR_HELD_OUT)
    ]
    totals = result.totals[(ds.NGSIM, ds.TRAIN)]
    assert totals.sessions == 5 and totals.observations == 5 * 150
    assert totals.ticks == 5 * (int(round(14.9 / 0.005)) + 1)
    assert sum(totals.labels.values()) == totals.observations
    summary = result.summary()
    assert "ngsim-i80" in summary and "heldout" in summary and "pair held out" in summary
    assert read_log(out / "heldout" / "ngsim-890-898.mcap").header.session_id == "ngsim-890-898"


def test_cli_imports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["import", "shared-data", str(REAL_FIXTURES), "-o", str(tmp_path / "real")]) == 0
    out = "".join(capsys.readouterr())
    assert "[6/6]" in out and "manifest" in out
    chain = REAL_FIXTURES / "ngsim-i80-emd-chains" / "1_11_24_44_55_54.csv"
    assert main(["import", "ngsim", str(chain), "-o", str(tmp_path / "ng")]) == 0
    assert len(list((tmp_path / "ng").glob("ngsim-*.mcap"))) == 5
    lap = REAL_FIXTURES / "openacc-astazero-human" / "ASta_040719_platoon3_new.csv"
    assert main(["import", "openacc", str(lap), "-o", str(tmp_path / "lap.mcap")]) == 0
    assert (tmp_path / "lap.mcap").is_file()
    assert main(["import", "openacc", str(chain)]) == 2
    assert "not an OpenACC file" in "".join(capsys.readouterr())


def test_cli_refuses_an_output_folder_over_the_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The command empties <out>/train and <out>/heldout of .mcap files, then writes there: with the data
    in <out>/train, a log kept beside the drives was deleted; with <out> the data folder, the data set
    was written into. Both refused naming the paths, before anything is deleted or written."""
    out = tmp_path / "real"
    data = out / "train"
    shutil.copytree(REAL_FIXTURES, data)
    kept = data / "my-drive.mcap"
    kept.write_bytes(b"a user's log")
    listing = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["import", "shared-data", str(data), "-o", str(out)]) == 2
    printed = "".join(capsys.readouterr())
    assert f"error: {data}: the output would overwrite the input {data}" in printed, printed
    assert main(["import", "shared-data", str(data), "-o", str(data)]) == 2
    printed = "".join(capsys.readouterr())
    assert f"error: {data / 'train'}: the output would be written inside the input folder {data}" in printed, printed
    assert kept.read_bytes() == b"a user's log"
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == listing
