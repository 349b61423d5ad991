"""The layering rules that import-linter cannot see: no project import hidden inside a function."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from tests.paths import REPO_ROOT

PACKAGES = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["dualloop"]["folders"]
# Imported when they are needed, each for a reason that is not a cycle:
ALLOWED_LATE = {
    "dualloop.planner._rollout",  # optional C extension: absent where no compiler was found at install
    "dualloop.controller.training.quantize",  # needs onnx (the [dev] extra); every other command works without it
}
# Files whose project imports wait for the work that needs them, for start-up time: `dualloop CMD
# --help` loads no other command's stack, and a replay fleet's parent starts its pool before numpy,
# onnxruntime and the executor (~0.5 s CPU), importing its summary's modules while the workers
# start. import-linter still sees these imports: its layer and no-cycle contracts cover them.
LATE_FOR_START_UP = {
    "controller/cli.py",
    "controller/replay/cli.py",
    "controller/replay/fleet.py",
    "controller/replay/evaluation.py",
}


def late_project_imports(path: Path) -> list[str]:
    """'line: module' for every import of a dualloop module inside a function or under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    scopes += [
        n for n in tree.body if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"
    ]
    for scope in scopes:
        for node in ast.walk(scope):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("dualloop"):
                modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names if a.name.startswith("dualloop")]
            else:
                continue
            if modules and not set(modules) & ALLOWED_LATE:
                found.append(f"{node.lineno}: {modules[0]}")
    return sorted(found, key=lambda entry: int(entry.split(":")[0]))


def test_no_project_import_is_placed_inside_a_function() -> None:
    files = [f for pkg in PACKAGES for f in sorted((REPO_ROOT / pkg).rglob("*.py"))]
    assert len(files) > 80 and all((REPO_ROOT / f).is_file() for f in LATE_FOR_START_UP)
    offenders = {
        str(f.relative_to(REPO_ROOT)): late
        for f in files
        if str(f.relative_to(REPO_ROOT)) not in LATE_FOR_START_UP and (late := late_project_imports(f))
    }
    assert not offenders, f"import these at the top of the module (a cycle is fixed, not hidden): {offenders}"


def test_the_check_finds_a_late_import_and_a_type_checking_one(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from dualloop.executor.core import Executor\n"
        "def f():\n    from dualloop.ood import gate\n    import json\n"
    )
    assert late_project_imports(bad) == ["3: dualloop.executor.core", "5: dualloop.ood"]
