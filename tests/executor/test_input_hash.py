"""input_hash as controller.proto and docs/contract.md describe it, recomputed from that text alone
with Python integers: the description a client in another language works from must be the code."""

from __future__ import annotations

import struct

import numpy as np

from dualloop.executor.snapshot import input_hashes

MASK = 2**64 - 1


def described_hash(features: list[float], plan: list[float]) -> int:
    multipliers = (np.random.default_rng(0x5EED1A9).integers(0, 2**63, size=256, dtype=np.uint64) * 2 + 1).tolist()
    words = [struct.unpack("<I", struct.pack("<f", v))[0] for v in [*features, *plan]]
    h = sum(w * m for w, m in zip(words, multipliers)) & MASK
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & MASK
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & MASK
    return h ^ (h >> 31)


def test_the_described_hash_is_the_code() -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(0, 10, (5, 19)).astype(np.float32)
    x[1, 7:] = np.nan  # missing features hash as the NaN the client sent
    p = rng.normal(0, 1, (5, 6)).astype(np.float32)
    assert input_hashes(x, p).tolist() == [described_hash(list(a), list(b)) for a, b in zip(x, p)]
