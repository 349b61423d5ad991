"""The one namespace mapping (pyproject.toml's `[tool.dualloop]`), seen the same way by everything that uses it:
the installed package, the tools' view (scripts/namespace_view.py), the wheel, and the lint rules."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

from tests.paths import REPO_ROOT

SKIP = ("__pycache__", "tests")


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


namespace_view = _script("namespace_view")
MAPPING: dict[str, Path] = namespace_view.mapping()


def _packages(folder: Path, dotted: str) -> set[str]:
    """Every package under `folder` (a folder with __init__.py), as dotted names under `dotted`."""
    found = set()
    for here, dirs, files in os.walk(folder, followlinks=True):  # the view's entries are links
        dirs[:] = [d for d in dirs if d not in SKIP]
        if "__init__.py" in files:
            found.add(".".join([dotted, *Path(here).relative_to(folder).parts]))
    return found


def test_the_list_is_the_repositorys_top_level_folders() -> None:
    assert MAPPING["dualloop"] == REPO_ROOT / "proto" / "dualloop"
    assert {"dualloop.controller", "dualloop.executor", "dualloop.ood", "dualloop.models"} <= set(MAPPING)
    for name, folder in MAPPING.items():
        assert (folder / "__init__.py").is_file(), f"{name} is mapped onto {folder}, which is not a package"


def test_the_installed_package_imports_the_source_files() -> None:
    """The editable install's finder, made by setup.py from the list: each package's __init__ and __path__
    are the source folder itself, never a view or a copy (tracebacks and `__file__` name real files)."""
    for name, folder in MAPPING.items():
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.origin is not None, name
        assert Path(spec.origin) == folder / "__init__.py", f"{name} is imported from {spec.origin}"
        assert [Path(p) for p in spec.submodule_search_locations or []] == [folder], name
    server = importlib.util.find_spec("dualloop.controller.serve.runtime")
    assert server is not None and server.origin == str(REPO_ROOT / "controller" / "serve" / "runtime.py")


def test_a_traceback_names_the_source_file() -> None:
    code = "from dualloop.controller.extras import require; require('dualloop_no_such_module', 'the test')"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert run.returncode == 1 and "MissingExtra" in run.stderr, run.stderr
    assert f'File "{REPO_ROOT / "controller" / "extras.py"}"' in run.stderr, run.stderr
    assert "build/" not in run.stderr, run.stderr


def test_the_view_links_every_mapped_package_and_nothing_else(tmp_path: Path) -> None:
    view = namespace_view.make_view(tmp_path) / "dualloop"
    (view / "retired").symlink_to(tmp_path)  # a folder dropped from the list since the last run
    namespace_view.make_view(tmp_path)
    links = {entry.name: entry.readlink() for entry in view.iterdir()}
    root = MAPPING["dualloop"]
    wanted = {name.removeprefix("dualloop."): folder for name, folder in MAPPING.items() if name != "dualloop"}
    wanted |= {p.name: p for p in root.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert links == wanted
    assert _packages(view, "dualloop") == set().union(*(_packages(f, n) for n, f in MAPPING.items()))


def test_the_lint_rules_ban_the_same_bare_names() -> None:
    """ruff bans `import controller` for every mapped folder (the only spelling is dualloop.<folder>)."""
    config = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    banned = set(config["tool"]["ruff"]["lint"]["flake8-tidy-imports"]["banned-api"])
    assert banned - {"pickle"} == set(config["tool"]["dualloop"]["folders"])


@pytest.mark.slow
def test_the_wheel_holds_the_mapped_packages_and_their_modules(tmp_path: Path) -> None:
    """`pip wheel` on a copy of the sources (a clean clone's files): the wheel holds exactly the mapped
    packages, every module of them, and nothing outside `dualloop/`."""
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns(
        ".*", "build", "tests", "docs", "clients", "tools", "node_modules", "__pycache__", "*.so", "*.egg-info", "runs"
    )
    shutil.copytree(REPO_ROOT, src, ignore=ignore)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", str(src)]
    run = subprocess.run([*command, "-w", str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    (wheel,) = tmp_path.glob("dualloop-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert all(n.startswith(("dualloop/", "dualloop-")) for n in names), [n for n in names if "/" not in n]
    in_wheel = {n.removesuffix("/__init__.py").replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert in_wheel == set().union(*(_packages(f, n) for n, f in MAPPING.items()))
    modules = {
        "/".join([*name.split("."), *path.relative_to(folder).parts])
        for name, folder in MAPPING.items()
        for path in folder.rglob("*.py")
        if not set(SKIP) & set(path.relative_to(folder).parts)
    }
    assert modules <= set(names), sorted(modules - set(names))[:10]
