"""The optional extras: which one a command needs, and the error that says how to install it."""

from __future__ import annotations

import importlib
from types import ModuleType

# modules an extra brings -> the extra to name in the message (pyproject.toml [project.optional-dependencies])
EXTRA_OF_MODULE = {
    "rich": "demo",
    "matplotlib": "demo",
    "onnx": "train",
    "ray": "ray",
    "gymnasium": "gym",
    "mcap_ros2": "rosbag2",
    "highway_env": "highway",
    "carla_driver_interface": "alpasim",
}


class MissingExtra(RuntimeError):
    """A command needs a package the lean install leaves out; the message names the extra to install."""

    def __init__(self, what: str, module: str, extra: str) -> None:
        super().__init__(
            f"{what} needs {module}, which `pip install dualloop` (serving only) leaves out: "
            f"pip install 'dualloop[{extra}]'"
        )
        self.module = module
        self.extra = extra


def require(module: str, what: str, extra: str | None = None) -> ModuleType:
    """Import an optional module, or raise MissingExtra naming the extra that brings it."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        top = (err.name or module).split(".")[0]
        raise MissingExtra(what, top, extra or EXTRA_OF_MODULE.get(top, "dev")) from None
