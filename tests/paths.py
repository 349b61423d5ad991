"""Where the repository and its test fixtures are, for tests in any folder of tests/."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURES = REPO_ROOT / "tests" / "fixtures"
