"""matplotlib for the commands that plot: headless, and imported only when a plot is made.

pyplot takes ~0.25 s to import; every `dualloop` command would pay it at start-up if the plotting
modules imported it at their top. matplotlib is an optional extra (not needed for serving): missing,
the plot raises MissingExtra naming it.
"""

from __future__ import annotations

import functools
from types import ModuleType

from dualloop.controller.extras import require


@functools.cache
def pyplot() -> ModuleType:
    matplotlib = require("matplotlib", "plotting", "demo")
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt
