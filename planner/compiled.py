"""Which path the behaviour planner's rollout takes: compiled (``planner._rollout``, built from
planner/_rollout.c when the package is installed on a machine with a C compiler) or numpy.

The numpy path (``BehaviourPlanner._outcome``) is the reference and the fallback: it is always there,
and the compiled one must give the same bits (tests/planner/test_compiled.py compares them).
``DUALLOOP_PLANNER_PURE_PYTHON=1`` in the environment, or ``use_compiled(False)``, makes planners
built afterwards take the numpy path.

What it does: one C call per batch rolls every candidate (column) forward over the 60 steps of the
horizon and reduces on the fly what ``_evaluate`` scores (end speed and gap, the least gap, headway,
time-to-collision and comfort means, the new follower's check, the cut-in risk), with the same
float64 operations in the same order as numpy (reductions over steps add rows in order, as numpy's
axis-0 reductions do), so no (steps x candidates) array is made; the rest of ``_evaluate`` (the
situation, the candidate table, the weighting of the terms) stays in numpy and is shared.

Why: the numpy rollout was most of the planner's CPU, which competes with the executor's ticks;
the compiled one costs about a fifth (``dualloop bench planner --compare-pure``; the numbers are in
docs/measurements.md). The free-road term's ratio**4 is written (r*r)*(r*r) in both paths: numpy's
power is SVML's pow on AVX-512 machines, which no C expression reproduces; plans did not change.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

_module: ModuleType | None
try:
    # by name: the C extension has no stub, and mypy would take `from ... import` for an attribute
    _module = importlib.import_module("dualloop.planner._rollout")
except ImportError:  # not built (no compiler at install time): the numpy path
    _module = None

_wanted = os.environ.get("DUALLOOP_PLANNER_PURE_PYTHON", "") in ("", "0")


def available() -> bool:
    """The compiled module was built and imports."""
    return _module is not None


def module() -> ModuleType | None:
    """The compiled module when planners built now should use it, else None."""
    return _module if _wanted else None


def use_compiled(on: bool) -> bool:
    """Choose the path of planners built from now on (those built before keep theirs); returns the
    previous choice, to restore it."""
    global _wanted
    before, _wanted = _wanted, bool(on)
    return before


def path_name(compiled: bool) -> str:
    return "compiled" if compiled else "numpy"
