"""Lay out the dualloop namespace as one folder of symlinks, for tools that walk folders.

setup.py maps the folders of pyproject.toml's `[tool.dualloop]` onto dualloop.* (controller/ ->
dualloop.controller, ...); the wheel and the editable install import through that mapping, so the
interpreter's `__file__` and tracebacks name the source files. mypy, import-linter and editors do not
import: they walk the file system from a package's folder. This script makes build/namespace/dualloop/
with one link per mapped package, pointing back into the working tree, for them alone (mypy's
`mypy_path`, import-linter, pyright's `extraPaths`). It is not on the interpreter's path, except for
import-linter's own command: `--pth` writes a path file into the venv that adds the view only when the
running program is `lint-imports`, so the plain command works and every other program imports the
sources. `make` makes both at install; `make clean` removes the view with the rest of build/.
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VIEW = ROOT / "build" / "namespace"


def mapping(root: Path = ROOT) -> dict[str, Path]:
    """dotted package -> its folder: `dualloop` itself and one `dualloop.<folder>` per mapped folder."""
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["dualloop"]
    return {"dualloop": root / config["root"], **{f"dualloop.{f}": root / f for f in config["folders"]}}


def links(root: Path = ROOT) -> dict[str, Path]:
    """name inside build/namespace/dualloop -> what it links to."""
    folders = mapping(root)
    base = folders.pop("dualloop")
    out = {name.removeprefix("dualloop."): target for name, target in folders.items()}
    for entry in sorted(base.iterdir()):  # the root package's own modules and sub-packages (v2)
        if entry.suffix == ".py" or (entry / "__init__.py").is_file():
            out[entry.name] = entry
    return out


def make_view(out: Path = VIEW) -> Path:
    pkg = out / "dualloop"
    pkg.mkdir(parents=True, exist_ok=True)
    wanted = links()
    for stale in pkg.iterdir():
        if stale.name not in wanted:  # a folder dropped from the list leaves no link behind
            # (a real folder here is a byte-code cache from when the view was on the interpreter's path)
            shutil.rmtree(stale) if stale.is_dir() and not stale.is_symlink() else stale.unlink()
    for name, target in wanted.items():
        link = pkg / name
        if link.is_symlink() and link.readlink() == target:
            continue  # already right
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    return out


PTH_NAME = "dualloop-lint-imports-view.pth"


def write_pth(view: Path = VIEW) -> Path:
    """The path file that puts the view on import-linter's path alone (see the module docstring)."""
    import sysconfig

    pth = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    code = f"if sys.argv and sys.argv[0].endswith('lint-imports'): sys.path.append({str(view)!r})"
    pth.write_text(f"import sys; exec({code!r})\n")
    return pth


if __name__ == "__main__":
    if sys.argv[1:] not in ([], ["--pth"]):
        raise SystemExit(f"usage: {sys.argv[0]} [--pth]")
    print(make_view())
    if sys.argv[1:] == ["--pth"]:
        print(write_pth())
