"""The opening of a script for a new interpreter in which some top-level modules cannot be imported,
as in an install without the extra that brings them (the lean install, one extra alone)."""

from __future__ import annotations

from collections.abc import Iterable


def blocking(modules: Iterable[str], why: str) -> str:
    """Python source that makes `modules` (top-level names) raise ModuleNotFoundError on import,
    saying `why`; what follows it in the script runs without them."""
    return (
        "import sys\n"
        "class _Blocker:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        f"        if name.split('.')[0] in {set(modules)!r}:\n"
        f"            raise ModuleNotFoundError(f'No module named {{name!r}} ({why})', name=name)\n"
        "        return None\n"
        "sys.meta_path.insert(0, _Blocker())\n"
    )
