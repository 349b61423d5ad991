"""Import an NGSIM I-80 six-vehicle chain (EMD reconstruction, chains by K. Long et al.) as sessions.

A chain file has `t1` and, for k = 1..6 (1 = the front car), ID{k}, Y{k} (front-bumper position
along the road, m), v{k} (m/s) and a{k}. Each of the five pairs (k, k+1) becomes the session
`ngsim-<leader ID>-<follower ID>` (controller/logs/following.py: features, labels). The vehicle
lengths were not kept, so the gap is the front-to-front headway Y{k} - Y{k+1} minus an assumed
leader length of LEADER_LENGTH_M. a{k} is not used: the EMD reconstruction smooths with the whole
trajectory (past and future), so it is not something a car could have measured at t; ego_accel is
the causal backward slope of v{k+1}, as for every import.

The same pair can appear in several chain files (the chains overlap; the rows are identical), so
`dualloop import shared-data` imports each pair once.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dualloop.controller.logs.csv_text import csv_rows
from dualloop.controller.logs.following import FollowingPair, write_pairs
from dualloop.controller.logs.import_openacc import pair_outputs
from dualloop.controller.logs.import_report import ImportReport
from dualloop.controller.logs.outputs import refuse_overwriting_inputs

CHAIN_LENGTH = 6
OBSERVATION_PERIOD_NS = 100_000_000  # NGSIM's 10 Hz
LEADER_LENGTH_M = 4.8
ATTRIBUTION = (
    "Derived from NGSIM I-80 via the EMD reconstruction of Shi et al.; chains by K. Long et al., "
    "github.com/Keke-Long/PERL_planning, Apache-2.0. NGSIM: US FHWA, public domain."
)


class NgsimError(ValueError):
    pass


@dataclass
class NgsimChain:
    path: Path
    vehicle_ids: list[int]  # front car first
    pairs: list[FollowingPair]


def chain_ids_from_name(name: str) -> list[int] | None:
    """The vehicle IDs a chain file's name lists (`1_11_24_44_55_54.csv`), front car first; None if not such a name."""
    parts = Path(name).stem.split("_")
    if len(parts) != CHAIN_LENGTH or not all(p.isdigit() for p in parts):
        return None
    return [int(p) for p in parts]


def read_ngsim_chain(file: str | Path) -> NgsimChain:
    path = Path(file)
    if not path.is_file():
        raise NgsimError(f"{path}: no such file")
    rows = csv_rows(path, NgsimError)
    header = [c.strip() for c in next(rows, (0, []))[1]]
    data = [row for _, row in rows if any(c.strip() for c in row)]
    expected = ["t1"] + [f"{q}{k}" for k in range(1, CHAIN_LENGTH + 1) for q in ("ID", "Y", "v", "a")]
    missing = [c for c in expected if c not in header]
    if missing:
        raise NgsimError(
            f"{path}: line 1 (header): missing column{'s' if len(missing) > 1 else ''} "
            f"{', '.join(repr(m) for m in missing[:4])}{' ...' if len(missing) > 4 else ''} "
            "(a chain file has t1 and ID{k}, Y{k}, v{k}, a{k} for k = 1..6)"
        )
    if len(data) < 2:
        raise NgsimError(f"{path}: fewer than two data rows")
    index = {name: i for i, name in enumerate(header)}
    values = np.empty((len(data), len(header)))
    for r, row in enumerate(data):
        if len(row) != len(header):
            raise NgsimError(f"{path}: line {r + 2}: {len(row)} cells, the header has {len(header)}")
        for name, i in index.items():
            try:
                values[r, i] = float(row[i])
            except ValueError:
                raise NgsimError(f"{path}: line {r + 2}, column '{name}': {row[i]!r} is not a number") from None
            if not math.isfinite(values[r, i]):
                raise NgsimError(f"{path}: line {r + 2}, column '{name}': {row[i]!r} is not a finite number")
    t = values[:, index["t1"]]
    bad = np.flatnonzero(~(np.diff(t) > 0))
    if len(bad):
        raise NgsimError(f"{path}: line {int(bad[0]) + 3}, column 't1': time must strictly increase")
    ids: list[int] = []
    for k in range(1, CHAIN_LENGTH + 1):
        column = values[:, index[f"ID{k}"]]
        changed = np.flatnonzero(column != column[0])
        if len(changed):
            raise NgsimError(
                f"{path}: line {int(changed[0]) + 2}, column 'ID{k}': the vehicle changes within the chain "
                f"({column[0]:g} -> {column[changed[0]]:g})"
            )
        ids.append(int(column[0]))
    pairs = []
    for k in range(1, CHAIN_LENGTH):
        leader, follower = ids[k - 1], ids[k]
        pairs.append(
            FollowingPair(
                session_id=f"ngsim-{leader}-{follower}",
                t_s=t,
                ego_speed=values[:, index[f"v{k + 1}"]],
                lead_speed=values[:, index[f"v{k}"]],
                gap=values[:, index[f"Y{k}"]] - values[:, index[f"Y{k + 1}"]] - LEADER_LENGTH_M,
                details={
                    "pair": f"NGSIM vehicle {follower} (car {k + 1} of the chain) follows vehicle {leader} (car {k})",
                    "ego_speed": f"v{k + 1}: EMD-reconstructed speed (m/s)",
                    "lead_distance": f"Y{k} - Y{k + 1} - {LEADER_LENGTH_M} m: front-to-front headway minus an "
                    "assumed leader length (the chains do not keep vehicle lengths)",
                },
            )
        )
    return NgsimChain(path, ids, pairs)


def import_ngsim(
    file: str | Path,
    out: str | Path | None = None,
    *,
    only: Collection[str] | None = None,
    start_time_unix_ns: int | None = None,
) -> list[ImportReport]:
    """Import the five pairs of a chain file (or those whose session id is in `only`)."""
    chain = read_ngsim_chain(file)
    out_path = Path(out) if out is not None else None
    refuse_overwriting_inputs(pair_outputs(chain.pairs, out_path, "ngsim", only), [chain.path], NgsimError)
    details = {
        "dataset": "NGSIM I-80 (Emeryville CA, April 2005, 4:00-4:15 pm), EMD reconstruction, 6-vehicle chains",
        "licence": f"{ATTRIBUTION} Changes: converted to dualloop logs, gap = headway - {LEADER_LENGTH_M} m, "
        "ego_accel and look-ahead labels derived from the follower's speed, other features NaN.",
        "file": chain.path.name,
        "time": "t1: seconds since the chain's start (the absolute NGSIM time was not kept)",
    }
    return write_pairs(
        chain.pairs,
        out_path,
        "ngsim",
        only=only,
        source=lambda pair: f"ngsim import of {chain.path} ({pair.session_id})",
        details=details,
        observation_period_ns=OBSERVATION_PERIOD_NS,
        start_time_unix_ns=start_time_unix_ns,
    )
