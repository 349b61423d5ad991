"""matplotlib for the commands that plot: headless, and imported only when a plot is made.

pyplot takes ~0.25 s to import; every `dualloop` command would pay it at start-up if the plotting
modules imported it at their top.
"""

from __future__ import annotations

import functools
from types import ModuleType


@functools.cache
def pyplot() -> ModuleType:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt
