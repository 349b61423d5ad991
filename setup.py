"""Only the optional C extensions live here; everything else about the package is in pyproject.toml.

``ood._tick`` (ood/_tick.c, CPython C API only) makes one session's gate decisions after numpy's
products; ``planner._rollout`` (planner/_rollout.c, likewise) rolls out and scores the behaviour
planner's candidates. ``optional=True``: a machine without a C compiler still installs, and
``ood.compiled`` / ``planner.compiled`` then take the pure-Python (numpy) path, which is the
reference the compiled one is tested against.
"""

import sys

from setuptools import Extension, setup

# -ffp-contract=off: no fused multiply-add, so every float64 operation rounds as Python's does
# (the scores and the planner's costs must be the same bits as the pure-Python path's)
_ARGS = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off", "-fno-fast-math"]

setup(ext_modules=[
    Extension("ood._tick", ["ood/_tick.c"], extra_compile_args=_ARGS, optional=True),
    Extension("planner._rollout", ["planner/_rollout.c"], extra_compile_args=_ARGS, optional=True),
])
