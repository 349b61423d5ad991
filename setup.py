"""The namespace mapping and the optional C extensions; everything else is in pyproject.toml.

One import namespace: the repository keeps its fixed top level (controller/, executor/, planner/,
ood/, sim/, models/, proto/), and the build maps each folder onto ``dualloop.<folder>``. The root
package is proto/dualloop because the generated stubs must sit beside the .proto files as
``dualloop.v2``. Nothing but ``dualloop`` lands in site-packages.

``dualloop.planner._rollout`` (planner/_rollout.c) rolls out and scores the behaviour planner's
candidates. It uses the CPython C API only and is ``optional``: a machine without a C compiler
still installs, and ``planner.compiled`` takes the numpy path, which is the reference the compiled
one is tested against (docs/duplicated-rules.md).
"""

import sys

from setuptools import Extension, find_packages, setup

FOLDERS = ("controller", "executor", "planner", "ood", "sim", "models")

package_dir = {"dualloop": "proto/dualloop"}
packages = ["dualloop", "dualloop.v2"]
for folder in FOLDERS:
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
    ],
)
