"""What a server pays while warming up (before SERVING) instead of on the tick loop later."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def test_numpys_first_percentile_is_paid_before_serving(test_model_path: Path):
    """np.percentile imports numpy.ma on its first call (8-16 ms here): on the loop at the first
    GetStats that was a missed deadline, so the server pays it while warming up, before SERVING."""
    script = (
        "import sys\n"
        "from dualloop.controller.serve.config import ServerConfig\n"
        "from dualloop.controller.serve.lifecycle import ServerThread\n"
        "before = 'numpy.ma' in sys.modules\n"
        "with ServerThread(ServerConfig(model=sys.argv[1], port=0)):\n"
        "    print(before, 'numpy.ma' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(test_model_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["False", "True"]
