"""Lay out the dualloop namespace as one folder of symlinks, for tools that walk folders.

setup.py maps the repository's top-level folders onto dualloop.* (controller/ -> dualloop.controller,
...). An editable install finds them through an import hook, but mypy and import-linter walk the file
system from a package's folder. This script makes build/namespace/dualloop/ with one link per
package, pointing back into the working tree. With --pth it also puts that folder on the development
venv's path (a .pth file), so the interpreter, mypy and import-linter all import the same files the
same way; the wheel is unaffected.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("controller", "executor", "planner", "ood", "sim", "models")


def make_view(out: Path = ROOT / "build" / "namespace") -> Path:
    pkg = out / "dualloop"
    pkg.mkdir(parents=True, exist_ok=True)
    links = {name: ROOT / name for name in FOLDERS}
    links["__init__.py"] = ROOT / "proto" / "dualloop" / "__init__.py"
    links["v2"] = ROOT / "proto" / "dualloop" / "v2"
    for name, target in links.items():
        link = pkg / name
        if link.is_symlink() and link.readlink() == target:
            continue  # already right: never removed under a running interpreter
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    return out


def install_pth(view: Path) -> Path:
    """A .pth file in this interpreter's site-packages that puts `view` on sys.path (a folder that is
    missing later is skipped by Python, and the editable install's hook takes over)."""
    pth = Path(sysconfig.get_paths()["purelib"]) / "dualloop-namespace-view.pth"
    pth.write_text(f"{view.resolve()}\n")
    return pth


if __name__ == "__main__":
    view = make_view()
    print(view)
    if "--pth" in sys.argv[1:]:
        print(install_pth(view))
