"""Lay out the dualloop namespace as one folder of symlinks, for tools that walk folders.

setup.py maps the repository's top-level folders onto dualloop.* (controller/ -> dualloop.controller,
...); Python finds them through the editable install's import hook, but mypy and import-linter walk
the file system from a package's folder. This script makes build/namespace/dualloop/ with one link per
package, pointing back into the working tree, so both see the same modules the interpreter imports.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("controller", "executor", "planner", "ood", "sim", "models")


def make_view(out: Path = ROOT / "build" / "namespace") -> Path:
    pkg = out / "dualloop"
    pkg.mkdir(parents=True, exist_ok=True)
    links = {name: ROOT / name for name in FOLDERS}
    links["__init__.py"] = ROOT / "proto" / "dualloop" / "__init__.py"
    links["v1"] = ROOT / "proto" / "dualloop" / "v1"
    for name, target in links.items():
        link = pkg / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    return out


if __name__ == "__main__":
    print(make_view(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "build" / "namespace"))
