from __future__ import annotations

import numpy as np
import pytest

from dualloop.controller.bench.drives import nominal_drives


@pytest.fixture(scope="session")
def drive_rows() -> np.ndarray:
    """30 s of simulated nominal driving, every 5 ms observation: what the shipped model and gates
    pass as NOMINAL (a session fed noise would be vetoed throughout)."""
    return nominal_drives(1, 7, 30.0)[0]
