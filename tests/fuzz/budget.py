"""How much the fuzz tests generate: modest and deterministic by default, more on request.

DUALLOOP_FUZZ_FACTOR=N multiplies every test's example count (a longer fuzz); DUALLOOP_FUZZ_RANDOM=1
draws fresh examples each run instead of the fixed derandomized sequence (reproduce a failure with
the `--hypothesis-seed` pytest prints). CONTRIBUTING.md#fuzzing.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

FACTOR = max(1, int(os.environ.get("DUALLOOP_FUZZ_FACTOR", "1")))
RANDOM = os.environ.get("DUALLOOP_FUZZ_RANDOM", "") not in ("", "0")


def fuzz_settings(max_examples: int) -> settings:
    return settings(
        max_examples=max_examples * FACTOR,
        derandomize=not RANDOM,
        deadline=None,  # a loaded machine: no per-example time limit
        database=None,  # nothing written under .hypothesis/
        # only the speed check: a live server and real files make examples slow by nature
        suppress_health_check=[HealthCheck.too_slow],
        print_blob=True,
    )
