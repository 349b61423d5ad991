"""input_hash as docs/contract.md#input-hash describes it, recomputed from that recipe alone: the
multipliers from docs/input-hash-multipliers.txt, the words and the finaliser with Python integers,
and the test vector the guide prints. A client in another language works from the same text."""

from __future__ import annotations

import re
import struct

import numpy as np

from dualloop.executor.snapshot import input_hashes
from tests.paths import REPO_ROOT

MASK = 2**64 - 1
DOCS = REPO_ROOT / "docs"


def documented_multipliers() -> list[int]:
    lines = (DOCS / "input-hash-multipliers.txt").read_text().splitlines()
    return [int(line, 16) for line in lines if line and not line.startswith("#")]


def described_hash(features: list[float], plan: list[float]) -> int:
    words = [struct.unpack("<I", struct.pack("<f", v))[0] for v in [*features, *plan]]
    h = sum(w * m for w, m in zip(words, documented_multipliers(), strict=False)) & MASK
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & MASK
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & MASK
    return h ^ (h >> 31)


def test_the_documented_multipliers_are_odd_and_enough() -> None:
    m = documented_multipliers()
    assert len(m) == 256 and all(x % 2 == 1 and 0 < x <= MASK for x in m)


def test_the_described_hash_is_the_code() -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(0, 10, (5, 19)).astype(np.float32)
    x[1, 7:] = np.nan  # missing features hash as the NaN the client sent
    p = rng.normal(0, 1, (5, 6)).astype(np.float32)
    assert input_hashes(x, p).tolist() == [described_hash(list(a), list(b)) for a, b in zip(x, p)]


def test_the_guides_test_vector() -> None:
    guide = (DOCS / "contract.md").read_text()
    printed = int(re.search(r"gives `input_hash = (0x[0-9a-f]{16})`", guide).group(1), 16)
    features = [0.5, 1.0, 1.5, 2.0, 2.5] + [float("nan")] * 14
    plan = [20.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    assert struct.pack("<f", float("nan")) == struct.pack("<I", 0x7FC00000)
    assert described_hash(features, plan) == printed
    x, p = np.array([features], np.float32), np.array([plan], np.float32)
    assert int(input_hashes(x, p)[0]) == printed
