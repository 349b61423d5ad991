"""`dualloop import`: recorded drives (comma2k19, CSV, OpenACC, NGSIM, the shared data) into dualloop logs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dualloop.controller.console import console, print_error
from dualloop.controller.logs.datasets import SPLITS, default_data_dir
from dualloop.controller.logs.foxglove import check_layout_out, layout, plot_sessions, recording_files
from dualloop.controller.logs.import_comma2k19 import Comma2k19Error, import_comma2k19
from dualloop.controller.logs.import_csv import EXTRA_COLUMNS_FLAG, CsvImportError, import_csv, parse_units
from dualloop.controller.logs.import_ngsim import NgsimError, import_ngsim
from dualloop.controller.logs.import_openacc import OpenAccError, import_openacc
from dualloop.controller.logs.import_report import ImportReport
from dualloop.controller.logs.import_rosbag2 import Rosbag2ImportError, import_rosbag2
from dualloop.controller.logs.outputs import refuse_overwriting_inputs
from dualloop.controller.logs.recover import recover_log
from dualloop.controller.logs.shared_data import import_shared_data

_ERRORS = (Comma2k19Error, CsvImportError, OpenAccError, NgsimError)
_PAIR_OUT_HELP = (
    "a directory for <session id>.mcap files (default: the current directory), or a .mcap name: used as is "
    "for one session, <name>-<pair>.mcap for several"
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    f = sub.add_parser(
        "foxglove-layout", help="a Foxglove layout for the sessions of recordings: a tab of plots per session"
    )
    f.add_argument("logs", nargs="+", type=Path, help="recordings with plot topics (docs/foxglove.md)")
    f.add_argument(
        "-o",
        "--out",
        type=Path,
        default=Path("foxglove-layout.json"),
        help="the layout file to write (default: foxglove-layout.json in the current directory)",
    )
    f.set_defaults(fn=_foxglove_layout)

    r = sub.add_parser(
        "recover",
        help="rewrite the readable part of a log cut short (killed server, full disk) as a complete MCAP file",
    )
    r.add_argument("source", type=Path, help="the cut log")
    r.add_argument("out", type=Path, help="the new, complete log (must not exist)")
    r.set_defaults(fn=_recover)

    p = sub.add_parser("import", help="turn recorded drives into dualloop logs (MCAP)")
    kinds = p.add_subparsers(dest="kind", required=True, metavar="KIND")

    c = kinds.add_parser("comma2k19", help="a comma2k19 processed-log segment folder")
    c.add_argument("source", type=Path, help="the segment folder")
    c.add_argument("-o", "--out", type=Path, help="output .mcap (default: <folder name>.mcap)")
    c.set_defaults(fn=_import_comma2k19)

    v = kinds.add_parser("csv", help="a CSV drive log: time, ego_speed and any other features (docs/importers.md)")
    v.add_argument("source", type=Path, help="the CSV file")
    v.add_argument("-o", "--out", type=Path, help="output .mcap (default: the CSV's name with .mcap)")
    v.add_argument("--units", default="", help="declared units, e.g. ego_speed=km/h,lead_distance=ft")
    v.add_argument("--rate-hz", type=float, help="the sensor's rate (default: measured from the time column)")
    v.add_argument(EXTRA_COLUMNS_FLAG, action="store_true", help="ignore unknown columns (with a warning)")
    v.add_argument("--session-id", help="session id (default: csv-<file stem>)")
    v.add_argument(
        "--dataset",
        help="the site, fleet or sensor stack the drive comes from: reports are per dataset, and `gate fit "
        "--real-logs` counts each dataset as one site (default: csv)",
    )
    v.set_defaults(fn=_import_csv)

    o = kinds.add_parser("openacc", help="an OpenACC CSV (AstaZero _new or JRC/ZalaZone layout): one session per pair")
    o.add_argument("source", type=Path, help="the CSV file")
    o.add_argument("-o", "--out", type=Path, help=_PAIR_OUT_HELP)
    o.set_defaults(fn=_import_openacc)

    n = kinds.add_parser("ngsim", help="an NGSIM I-80 six-vehicle chain CSV: one session per follower pair")
    n.add_argument("source", type=Path, help="the chain CSV file")
    n.add_argument("-o", "--out", type=Path, help=_PAIR_OUT_HELP)
    n.set_defaults(fn=_import_ngsim)

    r = kinds.add_parser("rosbag2", help="a ROS 2 bag in MCAP, through a mapping file (docs/importers.md)")
    r.add_argument(
        "source", type=Path, help="the bag: its .mcap file, or its folder (metadata.yaml and <name>_0.mcap, ...)"
    )
    r.add_argument("--map", required=True, type=Path, help="YAML: topic, field and unit of each feature")
    r.add_argument(
        "-o", "--out", type=Path, help="output .mcap (default: <bag name>.dualloop.mcap beside the bag or its folder)"
    )
    r.set_defaults(fn=_import_rosbag2)

    default = default_data_dir()
    s = kinds.add_parser("shared-data", help="every shared real drive into <out>/train and <out>/heldout")
    s.add_argument(
        "source",
        type=Path,
        nargs="?",
        default=default,
        help=f"the shared data folder (default: ../shared/data beside the repository: {default or 'absent here'})",
    )
    s.add_argument("-o", "--out", type=Path, default=Path("runs/real"), help="output folder (default: runs/real)")
    s.set_defaults(fn=_import_shared_data)


def _print(reports: list[ImportReport]) -> None:
    for report in reports:
        console.print(report.summary(), highlight=False)
    if not reports:
        console.print("no session long enough to import (pieces < 10 s are dropped)", highlight=False)


def _import_comma2k19(args: argparse.Namespace) -> int:
    try:
        _print([import_comma2k19(args.source, args.out or Path(f"{Path(args.source).name}.mcap"))])
    except Comma2k19Error as err:
        print_error(err)
        return 2
    return 0


def _import_csv(args: argparse.Namespace) -> int:
    try:
        report = import_csv(
            args.source,
            args.out or Path(args.source).with_suffix(".mcap"),
            session_id=args.session_id,
            allow_extra_columns=args.allow_extra_columns,
            units=parse_units(args.units),
            rate_hz=args.rate_hz,
            dataset=args.dataset,
        )
    except CsvImportError as err:
        print_error(err)
        return 2
    _print([report])
    return 0


def _import_openacc(args: argparse.Namespace) -> int:
    try:
        _print(import_openacc(args.source, args.out or Path(".")))
    except OpenAccError as err:
        print_error(err)
        return 2
    return 0


def _import_ngsim(args: argparse.Namespace) -> int:
    try:
        _print(import_ngsim(args.source, args.out or Path(".")))
    except NgsimError as err:
        print_error(err)
        return 2
    return 0


def _import_rosbag2(args: argparse.Namespace) -> int:
    source = Path(args.source)
    if source.is_dir():  # a bag folder (resolved: `.` has no name): <folder name>.dualloop.mcap beside it
        source = source.resolve()
        default = source.parent / f"{source.name}.dualloop.mcap"
    else:
        default = source.with_suffix(".dualloop.mcap")
    out = args.out or default
    try:
        _print([import_rosbag2(args.source, args.map, out)])
    except Rosbag2ImportError as err:
        print_error(err)
        return 2
    return 0


def _import_shared_data(args: argparse.Namespace) -> int:
    if args.source is None:
        print_error("no shared data folder: give one (../shared/data beside the repository does not exist)")
        return 2
    # the command empties <out>/train and <out>/heldout of .mcap files and writes there: never in the data
    try:
        outputs = [Path(args.out) / split for split in SPLITS] + [Path(args.out) / "manifest.json"]
        refuse_overwriting_inputs(outputs, [Path(args.source)], ValueError)
    except ValueError as err:
        print_error(err)
        return 2
    console.print(f"importing {args.source} into {args.out}/train and {args.out}/heldout", highlight=False)
    try:
        result = import_shared_data(
            Path(args.source), Path(args.out), progress=lambda line: console.print(line, highlight=False)
        )
    except (*_ERRORS, FileNotFoundError) as err:
        print_error(err)
        return 2
    console.print(result.summary(), highlight=False)
    return 0


def _recover(args: argparse.Namespace) -> int:
    # before reading the source: a log is never overwritten (it was a bare errno line); the input itself
    # is recover_log's to name
    if args.out.exists() and args.out.resolve() != args.source.resolve():
        print_error(f"{args.out}: already exists; the recovered log must be a new file (another name, or remove it)")
        return 2
    done = recover_log(args.source, args.out)
    state = "was complete" if done.complete else f"was cut ({done.cut})"
    console.print(
        f"{args.out}: {done.messages} messages on {done.channels} channels; {args.source} {state}",
        highlight=False,
        markup=False,
    )
    # the file is whole now, its open sessions are not: said here, and marked in the file for replay
    if done.cut_sessions:
        console.print(
            f"sessions cut (no end recorded): {', '.join(done.cut_sessions)}; replay refuses them "
            "unless --allow-truncated",
            highlight=False,
            markup=False,
        )
    elif not done.complete:
        console.print("no session was cut: every session had ended before the cut", highlight=False, markup=False)
    return 0


def _foxglove_layout(args: argparse.Namespace) -> int:
    try:
        # before reading: `-o` over a recording (or any MCAP file) replaced the log with the JSON
        check_layout_out(args.out, recording_files(args.logs))
        sessions = plot_sessions(args.logs)
    except ValueError as err:
        print_error(str(err))
        return 2
    if not sessions:
        names = ", ".join(str(p) for p in args.logs)
        print_error(
            f"{names}: no plot topics (the server records them unless record_plots = false; "
            "a replay writes them with --foxglove)"
        )
        return 2
    args.out.write_text(json.dumps(layout(sessions), indent=2) + "\n")
    console.print(f"{args.out}: a tab per session ({', '.join(sessions)}); import it in Foxglove (docs/foxglove.md)")
    return 0
