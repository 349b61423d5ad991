# Stub for the optional C extension built from ood/_tick.c (see ood/compiled.py); the signatures of
# its module functions and of Kernel, as ood.one_row, ood.change and ood.freeze call them.
from collections.abc import Callable, Sequence
from types import NotImplementedType
from typing import Any, final

import numpy as np
import numpy.typing as npt

_Decisions = tuple[list[float], list[float], list[bool]]

def widen(src: npt.NDArray[Any], dst: npt.NDArray[np.float64], /) -> bool: ...
def change_step(
    python: Callable[..., list[list[float]]],
    last: list[list[float] | None],
    last_t: list[int],
    change: list[list[float]],
    unknown: list[float],
    x: npt.NDArray[Any],
    slots: Sequence[int],
    fresh: Sequence[bool],
    finite: Sequence[bool],
    times: Sequence[int],
    /,
) -> list[list[float]]: ...
def freeze_step(
    python: Callable[..., list[bool]],
    last: list[list[float]],
    count: list[int],
    keep: list[list[int] | None],
    rest_at: list[int],
    rest_speed: float,
    repeats: int,
    x: npt.NDArray[Any],
    slots: Sequence[int],
    fresh: Sequence[bool],
    /,
) -> list[bool]: ...

@final
class Kernel:
    def __init__(
        self,
        n_linear: int,
        tail: npt.NDArray[np.float64],
        gates: Sequence[tuple[Any, ...]],
        blas: tuple[Any, ...] | None = None,
        /,
    ) -> None: ...
    @property
    def blas(self) -> bool: ...
    def step(
        self, slot: int, features: Sequence[Any], also: Any, changes: Any, context: Any, /
    ) -> _Decisions | None | NotImplementedType: ...
    def products(self, features: Sequence[Any], /) -> bool | None | NotImplementedType: ...
    def decide(
        self, slot: int, features: Sequence[Any], also: Any, changes: Any, context: Any, /
    ) -> _Decisions | None | NotImplementedType: ...
