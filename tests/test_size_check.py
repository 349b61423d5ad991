"""scripts/size_check.py: the limits on modules, functions and parameter lists, and its allowlist."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.paths import REPO_ROOT


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("size_check", REPO_ROOT / "scripts" / "size_check.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["size_check"] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


size_check = _load()


def _function(name: str, body_lines: int, params: str = "") -> str:
    return f"def {name}({params}):\n" + "    x = 1\n" * (body_lines - 1)


def _keys(source: str, tmp_path: Path) -> dict[str, str]:
    path = tmp_path / "m.py"
    return {o.key + " " + o.what.split(" (")[0]: o.what for o in size_check.offences_in(path, source, tmp_path)}


def test_each_limit_is_exceeded_by_one_and_not_reached_at_it(tmp_path: Path) -> None:
    source = "\n".join(
        [
            _function("at_limit", 80),
            _function("over", 81),
            _function("ten", 2, ", ".join(f"a{i}" for i in range(10))),
            _function("eleven", 2, ", ".join(f"a{i}" for i in range(10)) + ", *rest"),
            "class C:",
            "    " + _function("method", 2, "self, " + ", ".join(f"a{i}" for i in range(10))).replace("\n", "\n    "),
        ]
    )
    keys = _keys(source, tmp_path)
    assert set(keys) == {"m.py::over function of 81 lines", "m.py::eleven 11 parameters"}
    assert set(_keys("x = 1\n" * 801, tmp_path)) == {"m.py module of 801 lines"}
    assert not _keys("x = 1\n" * 800, tmp_path)


def test_a_nested_function_is_named_by_its_path(tmp_path: Path) -> None:
    source = "class A:\n    def outer(self):\n        def inner(a, b, c, d, e, f, g, h, i, j, k):\n            pass\n"
    assert set(_keys(source, tmp_path)) == {"m.py::A.outer.inner 11 parameters"}


def test_an_unlisted_offence_and_a_stale_entry_both_fail() -> None:
    offences = [size_check.Offence("a.py::f", "function of 90 lines (limit 80)")]
    assert size_check.problems(offences, {"a.py::f": "why"}) == []
    assert size_check.problems(offences, {}) == ["a.py::f: function of 90 lines (limit 80)"]
    (stale,) = size_check.problems([], {"a.py::f": "why"})
    assert "remove it" in stale


def test_an_entry_without_a_justification_is_refused(tmp_path: Path) -> None:
    listed = tmp_path / "allow.txt"
    listed.write_text("# header\na.py::f  # being split\nb.py::g\n")
    with pytest.raises(SystemExit, match="b.py::g"):
        size_check.read_allowlist(listed)


def test_the_repository_is_within_its_limits_and_its_allowlist() -> None:
    assert len(size_check.python_files()) > 150
    assert size_check.problems(size_check.all_offences(), size_check.read_allowlist()) == []
