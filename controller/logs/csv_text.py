"""The rows of a CSV file for the importers, with every way the bytes can fail said as an error
naming the file and the line (not UTF-8, not splittable as CSV), never a raw decoder exception."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from pathlib import Path


def csv_rows(path: Path, error: type[ValueError]) -> Iterator[tuple[int, list[str]]]:
    """(line number, cells) of each row of `path` (UTF-8, a BOM allowed: spreadsheets write one);
    `error` (the importer's own type) for bytes that are not UTF-8 text or not CSV."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = err.object[: err.start].count(b"\n") + 1
        raise error(
            f"{path}: line {line}: byte 0x{err.object[err.start]:02x} is not UTF-8 text; save the file as "
            f"UTF-8 ('CSV UTF-8' in a spreadsheet)"
        ) from None
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        for row in reader:
            yield reader.line_num, row
    except csv.Error as err:
        raise error(f"{path}: line {reader.line_num + 1}: not CSV ({err})") from None
