"""The namespace mapping and the optional C extensions; everything else is in pyproject.toml.

One import namespace: the repository keeps its fixed top level (controller/, executor/, planner/,
ood/, sim/, models/, proto/), and the build maps each folder onto ``dualloop.<folder>``. The list of
folders is pyproject.toml's ``[tool.dualloop]``, read here and by everything else that needs it. The
root package is proto/dualloop because the generated stubs must sit beside the .proto files as
``dualloop.v2``. Nothing but ``dualloop`` lands in site-packages.

This mapping is the one mechanism: the wheel is built from it, and the editable install
(``pip install -e``) imports through setuptools' finder generated from it, so ``__file__`` and
tracebacks name the source files (controller/serve/runtime.py). Tools that walk folders instead of
importing (mypy, import-linter, editors) read scripts/namespace_view.py's links, made from the same list.

The optional C extensions: ``dualloop.planner._rollout`` (planner/_rollout.c) rolls out and scores the
behaviour planner's candidates; ``dualloop.ood._signals`` (ood/_signals.c) moves the per-signal checks on by
one observation; ``dualloop.executor._history`` (executor/_history.c) sums the history features' bins of a
tick's sessions. They use the CPython C API only and are ``optional``: a machine without a C compiler
still installs, and ``planner.compiled``, ``ood.signals`` and ``executor.history`` take their Python
paths, the references the compiled ones are tested against (docs/duplicated-rules.md).
"""

import sys
import tomllib
from pathlib import Path

from setuptools import Extension, find_packages, setup

HERE = Path(__file__).resolve().parent
NAMESPACE = tomllib.loads((HERE / "pyproject.toml").read_text())["tool"]["dualloop"]

package_dir = {"dualloop": NAMESPACE["root"]}
packages = ["dualloop"] + [f"dualloop.{sub}" for sub in find_packages(where=NAMESPACE["root"])]
for folder in NAMESPACE["folders"]:
    package_dir[f"dualloop.{folder}"] = folder
    packages += [f"dualloop.{folder}"] + [f"dualloop.{folder}.{sub}" for sub in find_packages(where=folder)]

# -ffp-contract=off: no fused multiply-add, so every float64 operation rounds as Python's does
# (the planner's costs must be the same bits as the numpy path's)
_ARGS = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off", "-fno-fast-math"]

setup(
    package_dir=package_dir,
    packages=packages,
    ext_modules=[
        Extension("dualloop.planner._rollout", ["planner/_rollout.c"], extra_compile_args=_ARGS, optional=True),
        Extension("dualloop.ood._signals", ["ood/_signals.c"], extra_compile_args=_ARGS, optional=True),
        Extension("dualloop.executor._history", ["executor/_history.c"], extra_compile_args=_ARGS, optional=True),
    ],
)
