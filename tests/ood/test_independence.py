"""ood/ must stay reviewable on its own: no imports of the rest of the product, numpy only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from tests.paths import REPO_ROOT

OOD_DIR = REPO_ROOT / "ood"
FORBIDDEN = {"executor", "planner", "controller", "sim"}
ALLOWED_THIRD_PARTY = {"numpy"}


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_ood_imports_nothing_from_the_product() -> None:
    files = sorted(OOD_DIR.rglob("*.py"))
    assert len(files) >= 8
    offenders = {str(f.relative_to(OOD_DIR)): sorted(_imported_roots(f) & FORBIDDEN) for f in files}
    offenders = {k: v for k, v in offenders.items() if v}
    assert not offenders, f"ood/ must not import {sorted(FORBIDDEN)}: {offenders}"


def test_ood_runtime_uses_only_stdlib_and_numpy() -> None:
    extra = {}
    for f in sorted(OOD_DIR.rglob("*.py")):
        roots = _imported_roots(f) - set(sys.stdlib_module_names) - ALLOWED_THIRD_PARTY - {"__future__"}
        if roots:
            extra[str(f.relative_to(OOD_DIR))] = sorted(roots)
    assert not extra, f"ood/ runtime may use only numpy: {extra}"


def test_the_checker_catches_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import numpy as np\nfrom executor.model import Runner\nimport sim.world\n")
    assert _imported_roots(bad) & FORBIDDEN == {"executor", "sim"}
