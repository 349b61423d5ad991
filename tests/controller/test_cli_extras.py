"""Each command runs with only its own extra installed, and names its extra when a module it needs is
absent (a `[demo]` install ran make-test-model into a ModuleNotFoundError; `[bench]` lacked onnx)."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib

import pytest

from dualloop.controller.cli import COMMAND_GROUPS
from dualloop.controller.extras import EXTRA_OF_MODULE
from tests.blocked_imports import blocking
from tests.paths import REPO_ROOT

# prints, for each command, whether its real parser was registered or the "needs EXTRA" stand-in
_PROBE = """
import argparse
from dualloop.controller.cli import build_parser
for command in {commands!r}:
    sub = next(a for a in build_parser([command])._actions if isinstance(a, argparse._SubParsersAction))
    print(command, "stand-in" if sub.choices[command].prefix_chars == "\\0" else "real")
"""


def _extra_distributions(extras: dict[str, list[str]], extra: str) -> set[str]:
    """The distributions `dualloop[extra]` installs, its `dualloop[other]` entries followed."""
    names: set[str] = set()
    for requirement in extras[extra]:
        nested = re.fullmatch(r"dualloop\[([\w,]+)\]", requirement)
        if nested:
            for other in nested.group(1).split(","):
                names |= _extra_distributions(extras, other)
        else:
            names.add(re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower())
    return names


def _with_dependencies(names: set[str]) -> set[str]:
    """`names` and what they install in turn (highway-env brings gymnasium), as found installed here."""
    found, todo = set(names), list(names)
    while todo:
        try:
            requires = importlib.metadata.requires(todo.pop()) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for requirement in requires:
            if "extra ==" in requirement:  # the dependency's own optional extras: not installed by it
                continue
            name = re.split(r"[<>=!~;\[ (]", requirement, maxsplit=1)[0].lower().replace("_", "-")
            if name not in found:
                found.add(name)
                todo.append(name)
    return found


@pytest.mark.parametrize("extra", sorted({g.extra for g in COMMAND_GROUPS if g.extra}))
def test_each_extra_brings_what_its_commands_need(extra: str) -> None:
    extras = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    has = _with_dependencies(_extra_distributions(extras, extra))
    dists = importlib.metadata.packages_distributions()
    # every optional module whose distribution the extra does not list is absent
    blocked = {m for m in EXTRA_OF_MODULE if not {d.lower().replace("_", "-") for d in dists.get(m, [m])} & has}
    commands = [c for g in COMMAND_GROUPS if g.extra == extra for c in g.commands]
    code = blocking(blocked, "blocked") + _PROBE.format(commands=commands)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    stand_ins = [line.split()[0] for line in out.stdout.splitlines() if line.endswith("stand-in")]
    assert stand_ins == [], f"dualloop[{extra}] lacks a module {stand_ins} need (absent: {sorted(blocked)})"


@pytest.mark.parametrize("command", [["make-test-model", "--out", "m.onnx"], ["quantize", "m.onnx"]])
def test_onnx_commands_name_the_train_extra_with_only_demo_installed(command: list[str], tmp_path) -> None:
    # [demo] brings rich and matplotlib, not onnx: these commands import it only once they run
    code = blocking({"onnx"}, "blocked") + ("from dualloop.controller.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.run(
        [sys.executable, "-c", code, *command], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert proc.returncode == 2, proc.stderr
    assert "ModuleNotFoundError" not in proc.stderr
    assert f"`dualloop {command[0]}` needs onnx" in proc.stderr and "pip install 'dualloop[train]'" in proc.stderr
