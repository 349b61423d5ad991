"""`dualloop import`: a recorded drive (comma2k19 segment, CSV) into a dualloop log (MCAP)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dualloop.controller.console import console, print_error
from dualloop.controller.logs.import_comma2k19 import Comma2k19Error, import_comma2k19
from dualloop.controller.logs.import_csv import CsvImportError, import_csv


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("import", help="turn a recorded drive into a dualloop log (MCAP)")
    p.add_argument("kind", choices=["comma2k19", "csv"])
    p.add_argument("source", type=Path, help="comma2k19 segment folder, or a CSV file")
    p.add_argument("--out", type=Path, help="output .mcap (default: next to the source name)")
    p.set_defaults(fn=_import)


def _import(args: argparse.Namespace) -> int:
    try:
        if args.kind == "comma2k19":
            report = import_comma2k19(args.source, args.out or Path(f"{Path(args.source).name}.mcap"))
        else:
            report = import_csv(args.source, args.out or Path(args.source).with_suffix(".mcap"))
    except (Comma2k19Error, CsvImportError) as err:
        print_error(err)
        return 2
    console.print(report.summary(), highlight=False)
    return 0
