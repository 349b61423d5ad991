"""Which path the gate's per-tick work takes (a gate bank's one-row tick, the change and freeze
trackers' loops): compiled (``ood._tick``, built from ood/_tick.c when the package is installed on a
machine with a C compiler) or pure Python.

The pure-Python path is the reference and the fallback: it is always there, and the compiled one
must decide the same bits (tests compare them). ``DUALLOOP_GATE_PURE_PYTHON=1`` in the environment,
or ``use_compiled(False)``, makes gate banks and trackers built afterwards take the pure-Python path
(``dualloop bench gate --compare-pure`` runs both in one process).
"""

from __future__ import annotations

import os
from types import ModuleType

# The one import of the optional extension, at import time with a fallback (ood/_tick.pyi types it)
_module: ModuleType | None
try:
    from dualloop.ood import _tick
except ImportError:  # not built (no compiler at install time): the pure-Python path
    _module = None
else:
    _module = _tick

_wanted = os.environ.get("DUALLOOP_GATE_PURE_PYTHON", "") in ("", "0")


def available() -> bool:
    """The compiled module was built and imports."""
    return _module is not None


def module() -> ModuleType | None:
    """The compiled module when gate banks and trackers built now should use it, else None."""
    return _module if _wanted else None


def use_compiled(on: bool) -> bool:
    """Choose the path of gate banks and trackers built from now on (those built before keep theirs);
    returns the previous choice, to restore it."""
    global _wanted
    before, _wanted = _wanted, bool(on)
    return before


def path_name(compiled: bool) -> str:
    return "compiled" if compiled else "pure Python"
