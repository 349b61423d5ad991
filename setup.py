"""Only the optional C extension lives here; everything else about the package is in pyproject.toml.

``ood._tick`` (ood/_tick.c, CPython C API only) makes one session's gate decisions after numpy's
products. ``optional=True``: a machine without a C compiler still installs, and ``ood.compiled``
then takes the pure-Python path, which is the reference the compiled one is tested against.
"""

import sys

from setuptools import Extension, setup

# -ffp-contract=off: no fused multiply-add, so every float64 operation rounds as Python's does
# (the scores must be the same bits as the pure-Python path's)
_ARGS = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off", "-fno-fast-math"]

setup(ext_modules=[Extension("ood._tick", ["ood/_tick.c"], extra_compile_args=_ARGS, optional=True)])
