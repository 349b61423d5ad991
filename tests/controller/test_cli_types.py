"""Numbers out of range are refused while the arguments are parsed, naming the flag (found by QA:
`bench tick --sessions 0` hung, `--duration -1` printed a table of NaN, `bench rules --sessions -3`
was a numpy traceback)."""

from __future__ import annotations

import pytest

from dualloop.controller.cli import main


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["bench", "tick", "--sessions", "0"], "argument --sessions: 0: a whole number from 1"),
        (["bench", "rules", "--sessions", "-3"], "argument --sessions: -3: a whole number from 1"),
        (["bench", "tick", "--duration", "-1"], "argument --duration: -1: a finite number > 0"),
        (["bench", "agents", "--duration", "nan"], "argument --duration: nan: a finite number > 0"),
        (["bench", "tick", "--guard-ms", "-0.5"], "argument --guard-ms: -0.5: a finite number >= 0"),
        (
            ["bench", "tick", "--realtime-priority", "120"],
            "argument --realtime-priority: 120: a whole number from 0 to 99",
        ),
        (["bench", "overrun", "--calls", "x"], "argument --calls: 'x' is not a whole number (from 1)"),
        (["bench", "replay", "--logs", "-1"], "argument --logs: -1: a whole number from 0"),
        (["serve", "--model", "m.onnx", "--workers", "0"], "argument --workers: 0: a whole number from 1, or 'auto'"),
        (["qualify", "m.onnx", "--logs", "d", "--workers", "0"], "argument --workers: 0: a whole number from 1"),
        (["eval-logs", "d", "--leave-one-out", "--dagger", "-1"], "argument --dagger: -1: a whole number from 0"),
    ],
)
def test_a_number_out_of_range_is_refused_naming_the_flag(argv: list[str], said: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    assert said in capsys.readouterr().err
