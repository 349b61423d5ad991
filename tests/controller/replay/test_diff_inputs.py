"""`dualloop diff` refuses what it cannot compare (exit 2, one line naming the file and what to do):
a cut log, and a log with no decision snapshots (QA: both said "identical", exit 0)."""

from __future__ import annotations

from pathlib import Path

import pytest

from dualloop.controller.cli import main
from dualloop.controller.logs.synthetic import slice_log
from dualloop.controller.replay.lockstep import replay_log
from dualloop.models import TEST_MODEL_PATH


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(observations only, as an import writes them; its replay)."""
    d = tmp_path_factory.mktemp("diff_inputs")
    source = slice_log(d / "ng.mcap", 1000, 200, "car-3")
    return source, replay_log(source, TEST_MODEL_PATH, out_path=d / "rec.mcap").out_path


def test_a_cut_log_is_refused_naming_it(logs: tuple[Path, Path], tmp_path: Path, capsys) -> None:
    """A copy cut short (`head -c`) diffed as "identical within tolerance", exit 0: its sessions are
    not whole drives, so it is refused as the docs say, naming the file, that it is cut, and what to do."""
    _, rec = logs
    data = rec.read_bytes()
    for size in (len(data) - 40, len(data) // 2):  # only the footer lost; half of the snapshots too
        cut = tmp_path / f"cut{size}.mcap"
        cut.write_bytes(data[:size])
        for pair in ((cut, rec), (rec, cut)):
            assert main(["diff", str(pair[0]), str(pair[1])]) == 2
            out = capsys.readouterr()
            assert f"error: {cut}: " in out.err and "a cut log" in out.err and "dualloop recover" in out.err, out
            assert "identical" not in out.out and "observations in" not in out.err
            assert len(out.err.strip().splitlines()) == 1


def test_a_log_without_decisions_is_refused(logs: tuple[Path, Path], capsys) -> None:
    """An imported log (observations, no decisions) diffed as "0 ticks ... identical", exit 0: a CI gate
    passed with nothing compared."""
    ng, rec = logs
    for a, b, named in ((ng, ng, ng), (ng, rec, ng), (rec, ng, ng)):
        assert main(["diff", str(a), str(b)]) == 2
        out = capsys.readouterr()
        assert f"error: no decision snapshots in {named}: diff compares decisions; replay it first" in out.err, out
        assert "identical" not in out.out
    assert main(["diff", str(rec), str(rec)]) == 0
