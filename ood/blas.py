"""numpy's own BLAS routines, for the compiled one-row tick to call without numpy around them.

At one session, a tick's three numpy calls (a float32 row's dot with each gate's projection, then the
sums of squares) cost far more in numpy's per-call work than in arithmetic. They end in two BLAS
routines: ``ndarray.dot`` of a (1, d) row with a C-contiguous (d, k) float64 matrix calls
``cblas_dgemv(RowMajor, Trans, d, k, 1, A, k, x, 1, 0, y, 1)``, and ``np.vecdot`` of float64 rows
``cblas_ddot(n, a, 1, b, 1)`` (numpy's ``DOUBLE_dot``). Called from C with the same arguments, the
same library gives the same bits. OpenBLAS sums in its own order, so no other routine would.

``find()`` looks for them only where numpy's wheels put their OpenBLAS (``numpy.libs``, ``.dylibs``),
and only under names whose integer width is known (``scipy_cblas_*64_``: 64-bit); any other build of
numpy (MKL, Accelerate, a system BLAS) gets None, and the tick keeps numpy's calls. The caller also
compares the routines' results with numpy's on random rows before using them (``OneRowTick``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

# (gemv, ddot) symbol names with 64-bit integers, as numpy's scipy-openblas64 builds export them
_SYMBOLS = (("scipy_cblas_dgemv64_", "scipy_cblas_ddot64_"),)


def find() -> tuple[int, int] | None:
    """The addresses of numpy's ``cblas_dgemv`` and ``cblas_ddot`` (64-bit integer interface), or None."""
    root = Path(np.__file__).resolve().parent
    candidates = [
        p
        for folder in (root.parent / "numpy.libs", root / ".dylibs")
        for p in sorted(folder.glob("*openblas*"))
        if p.is_file()
    ]
    for path in candidates:
        try:
            lib = ctypes.CDLL(str(path))  # the library numpy already loaded: the same handle, no second copy
        except OSError:
            continue
        for gemv, ddot in _SYMBOLS:
            try:
                gemv_at = ctypes.cast(getattr(lib, gemv), ctypes.c_void_p).value
                ddot_at = ctypes.cast(getattr(lib, ddot), ctypes.c_void_p).value
            except AttributeError:
                continue
            if gemv_at is not None and ddot_at is not None:  # ctypes gives None for a NULL address
                return gemv_at, ddot_at
    return None
