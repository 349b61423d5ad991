"""The shared real-drive data sets and their fixed train / held-out split (docs/importers.md).

The split is by drive (a recorded run), and no leader-follower vehicle pair is ever in both sides:

- OpenACC AstaZero: platoon 10 is held out, every other lap (platoon 3) trains. The `_new` files
  dropped the vehicle-order row, so vehicles cannot be matched across laps; each lap's pair is its own.
- OpenACC ZalaZone: part 40 is held out, the other parts (22, 26, 35) train. The same cars drove
  every part, in two orders, so four car pairs of part 40 (e.g. BMW_I3 behind JAGUAR_I_PACE) also
  occur in training parts: those training sessions are dropped, so the held-out pairs are unseen.
  (Holding out parts 35 and 40 would drop less but leave a third of the training minutes.)
- NGSIM I-80 chains: the held-out chains are those whose six vehicle IDs are all >= NGSIM_HELDOUT_FROM_ID,
  the training chains those whose IDs are all below; a chain that straddles the threshold is dropped.
  No vehicle of a held-out chain is then in a training chain (IDs are assigned in order of entry, so
  this is also a split in time). Chains overlap and repeat pairs with identical rows: each pair is
  imported once, from the first file (by name) that has it.
- comma2k19 (one minute, one car): held out.
- OpenACC Vicolungo and Cherasco (Italian motorways, public roads). Both Vicolungo runs have the same
  five cars in the same order, so every pair is in both runs and no split by pair is possible: Vicolungo
  trains whole (without motorway drives the model braked above 30 m/s, where no other data set drives)
  and Cherasco, one pair at another site, is held out whole: the one site the shipped model never saw.
  How each data set transfers when nothing of it trained the model is `dualloop eval-logs --leave-one-out`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from dualloop.controller.logs.import_ngsim import chain_ids_from_name
from dualloop.controller.logs.import_openacc import describe_openacc

TRAIN: Final = "train"
HELDOUT: Final = "heldout"
DROPPED: Final = "dropped"
SPLITS: Final = (TRAIN, HELDOUT)
# Why a pair is left out.
IN_DROPPED_DRIVE: Final = "drive dropped"
PAIR_HELD_OUT: Final = "pair held out"
DUPLICATE: Final = "duplicate"

ASTAZERO: Final = "openacc-astazero"
ZALAZONE: Final = "openacc-zalazone"
NGSIM: Final = "ngsim-i80"
COMMA2K19: Final = "comma2k19"
VICOLUNGO: Final = "openacc-vicolungo"
CHERASCO: Final = "openacc-cherasco"
# Folder under the shared data directory for each data set.
FOLDERS: Final = {
    ASTAZERO: "openacc-astazero-human",
    ZALAZONE: "openacc-zalazone-human",
    NGSIM: "ngsim-i80-emd-chains",
    COMMA2K19: "comma2k19-example1",
    VICOLUNGO: "openacc-vicolungo-human",
    CHERASCO: "openacc-cherasco-human",
}
# Data sets held out whole (no drive of theirs trains the shipped model), and trained on whole.
HELDOUT_WHOLE: Final = frozenset({COMMA2K19, CHERASCO})
TRAIN_WHOLE: Final = frozenset({VICOLUNGO})
ASTAZERO_HELDOUT_LAPS: Final = frozenset({"platoon10"})
ZALAZONE_HELDOUT_PARTS: Final = frozenset({40})
NGSIM_HELDOUT_FROM_ID: Final = 600


@dataclass(frozen=True)
class PairRef:
    """A leader-follower pair of a drive: the session id its importer gives it and the two vehicles,
    as keys unique within the data set's namespace (`ngsim:611`, `zalazone:BMW_I3`)."""

    session_id: str
    leader: str
    follower: str


@dataclass(frozen=True)
class DriveSource:
    dataset: str
    importer: str  # "openacc", "ngsim" or "comma2k19"
    path: Path
    pairs: tuple[PairRef, ...]  # empty for a drive without a lead vehicle pair (comma2k19)


@dataclass
class Drive:
    source: DriveSource
    split: str  # TRAIN, HELDOUT or DROPPED
    why: str  # the rule that decided
    pairs: list[PairRef] = field(default_factory=list)  # the pairs to import
    # pairs left out: (pair, IN_DROPPED_DRIVE / PAIR_HELD_OUT / DUPLICATE, details)
    skipped: list[tuple[PairRef, str, str]] = field(default_factory=list)

    @property
    def dataset(self) -> str:
        return self.source.dataset

    @property
    def path(self) -> Path:
        return self.source.path


def default_data_dir(repo: Path | None = None) -> Path | None:
    """../shared/data next to the repository, when it exists."""
    root = repo if repo is not None else Path(__file__).resolve().parents[2]
    candidate = (root / ".." / "shared" / "data").resolve()
    return candidate if candidate.is_dir() else None


def describe_sources(data_dir: Path) -> list[DriveSource]:
    """Every drive of the shared data sets found under data_dir (missing folders are skipped)."""
    sources: list[DriveSource] = []
    for dataset in (ASTAZERO, ZALAZONE):
        folder = data_dir / FOLDERS[dataset]
        prefix = "astazero" if dataset == ASTAZERO else "zalazone"
        for path in sorted(folder.glob("*.csv")) if folder.is_dir() else []:
            if dataset == ASTAZERO and not path.stem.endswith("_new"):
                continue  # the campaign's notes and vehicle table sit beside the drives
            pairs = []
            for pair in describe_openacc(path):
                # Vehicle_order names the cars (same cars in every ZalaZone part); unnamed ones are per file.
                scope = (
                    prefix
                    if dataset == ZALAZONE and not re.fullmatch(r"v\d+", pair.leader)
                    else f"{prefix}:{path.stem}"
                )
                pairs.append(PairRef(pair.session_id, f"{scope}:{pair.leader}", f"{scope}:{pair.follower}"))
            sources.append(DriveSource(dataset, "openacc", path, tuple(pairs)))
    for dataset in (VICOLUNGO, CHERASCO):
        # JRC files, unchanged or row subsets (raw/), named after their campaign; cars named in Vehicle_order
        folder = data_dir / FOLDERS[dataset] / "raw"
        prefix = dataset.removeprefix("openacc-")
        for path in sorted(folder.glob("JRC-*.csv")) if folder.is_dir() else []:
            pairs = [
                PairRef(pair.session_id, f"{prefix}:{pair.leader}", f"{prefix}:{pair.follower}")
                for pair in describe_openacc(path)
            ]
            sources.append(DriveSource(dataset, "openacc", path, tuple(pairs)))
    folder = data_dir / FOLDERS[NGSIM]
    for path in sorted(folder.glob("*.csv")) if folder.is_dir() else []:
        ids = chain_ids_from_name(path.name)
        if ids is None:
            continue
        chain = tuple(PairRef(f"ngsim-{a}-{b}", f"ngsim:{a}", f"ngsim:{b}") for a, b in zip(ids, ids[1:]))
        sources.append(DriveSource(NGSIM, "ngsim", path, chain))
    folder = data_dir / FOLDERS[COMMA2K19]
    if (folder / "processed_log").is_dir():
        sources.append(DriveSource(COMMA2K19, "comma2k19", folder, ()))
    return sources


def base_split(source: DriveSource) -> tuple[str, str]:
    """(split, why) of a drive by its data set's rule, before pairs are checked."""
    if source.dataset == ASTAZERO:
        lap = next((lap for lap in ASTAZERO_HELDOUT_LAPS if re.search(rf"_{lap}(_|$)", source.path.stem)), None)
        return (
            (HELDOUT, f"AstaZero lap {lap} is held out") if lap else (TRAIN, "AstaZero laps other than platoon10 train")
        )
    if source.dataset == ZALAZONE:
        found = re.search(r"part(\d+)", source.path.stem)
        part = int(found.group(1)) if found else None
        if part in ZALAZONE_HELDOUT_PARTS:
            return HELDOUT, f"ZalaZone part {part} is held out"
        return TRAIN, "ZalaZone parts other than 40 train"
    if source.dataset == NGSIM:
        ids = [int(p.follower.split(":")[1]) for p in source.pairs] + [int(source.pairs[0].leader.split(":")[1])]
        if min(ids) >= NGSIM_HELDOUT_FROM_ID:
            return HELDOUT, f"every vehicle ID >= {NGSIM_HELDOUT_FROM_ID}"
        if max(ids) < NGSIM_HELDOUT_FROM_ID:
            return TRAIN, f"every vehicle ID < {NGSIM_HELDOUT_FROM_ID}"
        return DROPPED, f"vehicle IDs {min(ids)}-{max(ids)} straddle {NGSIM_HELDOUT_FROM_ID}"
    if source.dataset in HELDOUT_WHOLE:
        return HELDOUT, f"{source.dataset} is held out whole"
    if source.dataset in TRAIN_WHOLE:
        return TRAIN, f"{source.dataset} trains whole (its pairs are in every run)"
    return DROPPED, f"no split rule for data set {source.dataset!r}"


def assign_splits(sources: list[DriveSource]) -> list[Drive]:
    """Apply the rules: each drive's split, then the pairs to import (none shared between the splits,
    each pair once)."""
    drives = [Drive(source, *base_split(source)) for source in sources]
    heldout_pairs = {(p.leader, p.follower) for d in drives if d.split == HELDOUT for p in d.source.pairs}
    taken: dict[str, Path] = {}
    for drive in drives:
        if drive.split == DROPPED:
            drive.skipped = [(p, IN_DROPPED_DRIVE, drive.why) for p in drive.source.pairs]
            continue
        for pair in drive.source.pairs:
            if drive.split == TRAIN and (pair.leader, pair.follower) in heldout_pairs:
                drive.skipped.append((pair, PAIR_HELD_OUT, "the same vehicle pair is in a held-out drive"))
            elif pair.session_id in taken:
                drive.skipped.append((pair, DUPLICATE, f"imported from {taken[pair.session_id].name} (same rows)"))
            else:
                taken[pair.session_id] = drive.path
                drive.pairs.append(pair)
    return drives


def list_drives(data_dir: Path) -> list[Drive]:
    """The shared data under data_dir, each drive with its split and the pairs to import."""
    return assign_splits(describe_sources(data_dir))
