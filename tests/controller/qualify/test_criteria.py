"""The qualification's criteria: defaults < TOML file < --set flags; bad input names the file or flag and the field."""

from __future__ import annotations

import math

import pytest

from dualloop.controller.contract.errors import ConfigError
from dualloop.controller.qualify.checks import at_most, no_worse
from dualloop.controller.qualify.criteria import Criteria, load_criteria


def test_file_then_flags(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[replay]\nagreement_drop = 0.05\nmax_migration = 0.2\n[stress]\nece_rise = 0.1\n")
    c = load_criteria(f, ["replay.agreement_drop=0.03", "replay.max_migration=none"])
    assert c.replay.agreement_drop == 0.03  # the flag wins
    assert c.replay.max_migration is None  # "none" turns an absolute limit off
    assert c.stress.ece_rise == 0.1  # from the file
    assert c.stress.auroc_drop == Criteria().stress.auroc_drop  # the default


@pytest.mark.parametrize(
    "text,settings,words",
    [
        ("[replay]\nagreement_drop = -1\n", [], ["c.toml", "replay.agreement_drop", "greater than or equal"]),
        ("[replay]\nagreemnt_drop = 0.1\n", [], ["c.toml", "replay.agreemnt_drop", "Extra inputs"]),
        ("[stress\n", [], ["c.toml", "cannot parse"]),
        ("", ["stress.ece_rise=lots"], ["--set", "stress.ece_rise"]),
        ("", ["ece_rise=0.1"], ["--set", "SECTION.FIELD=VALUE"]),
    ],
)
def test_bad_input_names_the_file_and_the_field(tmp_path, text, settings, words):
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_criteria(f, settings)
    for w in words:
        assert w in str(err.value)


def test_a_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="nope.toml: configuration file not found"):
        load_criteria(tmp_path / "nope.toml")


def test_no_worse_in_both_directions():
    assert no_worse("s", "acc", 0.90, 0.905, 0.01, True).passed
    assert not no_worse("s", "acc", 0.89, 0.905, 0.01, True).passed
    assert no_worse("s", "ece", 0.06, 0.05, 0.02, False).passed
    assert not no_worse("s", "ece", 0.08, 0.05, 0.02, False).passed
    # a value the baseline has and the candidate lacks fails; one neither has is not judged
    assert not no_worse("s", "acc", math.nan, 0.9, 0.01, True).passed
    assert no_worse("s", "acc", math.nan, math.nan, 0.01, True).passed
    assert not at_most("s", "veto", 0.2, 0.1).passed and at_most("s", "veto", 0.05, 0.1).passed
    line = no_worse("stress", "nominal ECE", 0.21, 0.031, 0.02, False).line()
    assert line.startswith("FAIL stress: nominal ECE 0.21 (baseline 0.031, limit <= 0.051")
