"""ood/ must stay reviewable on its own: no imports of the rest of the product, numpy only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from tests.paths import REPO_ROOT

OOD_DIR = REPO_ROOT / "ood"
FORBIDDEN = {"executor", "planner", "controller", "sim"}
ALLOWED_THIRD_PARTY = {"numpy", "ood"}  # "ood": its own modules, dualloop.ood.*


def _imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            roots.update(_root(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(_root(node.module))
    return roots


def _root(module: str) -> str:
    """The package an import names: dualloop.<package> for the product's own, else its top level."""
    parts = module.split(".")
    return parts[1] if parts[0] == "dualloop" and len(parts) > 1 else parts[0]


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
    bad.write_text("import numpy as np\nfrom dualloop.executor.model import Runner\nimport dualloop.sim.world\n")
    assert _imported_roots(bad) & FORBIDDEN == {"executor", "sim"}
