"""The shipped models and their gates, installed with the package as data.

``base.onnx`` is the trained decision model that ``dualloop serve``, ``demo`` and ``replay`` use by
default; its two gates come in the order of ``executor.gating.GATE_SOURCES``: one scores its decision
vector, the other the raw input features (with range and change limits). They catch different faults
(a unit mismatch against a dead sensor, a speed far out of range or a noise burst), each in its own
tick. ``test_model.onnx`` has fixed random weights from a seed, so everything runs before any training.
"""

from pathlib import Path

MODELS_DIR = Path(__file__).resolve().parent
BASE_MODEL_PATH = MODELS_DIR / "base.onnx"
DEFAULT_GATES = (MODELS_DIR / "base.gate.npz", MODELS_DIR / "base.inputs.gate.npz")
TEST_MODEL_PATH = MODELS_DIR / "test_model.onnx"


def gates_beside(model: Path) -> tuple[Path, ...]:
    """The gate files a model ships with: the base model's two, else <stem>.gate.npz and
    <stem>.inputs.gate.npz next to it, where they exist."""
    if Path(model).resolve() == BASE_MODEL_PATH.resolve():
        return tuple(g for g in DEFAULT_GATES if g.is_file())
    stem = Path(model).with_suffix("")
    return tuple(p for p in (Path(f"{stem}.gate.npz"), Path(f"{stem}.inputs.gate.npz")) if p.is_file())
