"""Corrupted input files: every importer and loader answers with its own error naming the file, never
a raw exception.

Each example takes a valid file (a shipped fixture, the shipped model and gate, or one written here)
and damages it: truncation, bit flips, garbage spans, invalid UTF-8, and for text and structured
files cells, lines, keys and arrays of the wrong kind. The loader must either accept the result or
raise its documented error type with the file's name in the message.
"""

from __future__ import annotations

import io
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dualloop.controller.cli import main
from dualloop.controller.logs.import_comma2k19 import Comma2k19Error, import_comma2k19
from dualloop.controller.logs.import_csv import CsvImportError, import_csv
from dualloop.controller.logs.import_ngsim import NgsimError, import_ngsim
from dualloop.controller.logs.import_openacc import OpenAccError, import_openacc
from dualloop.controller.logs.logfile import LogFileError, read_sessions
from dualloop.controller.logs.synthetic import synthetic_log
from dualloop.executor.model_card import METADATA_KEY, ModelFileError, parse_card
from dualloop.executor.model_runner import DecisionModel
from dualloop.models import BASE_MODEL_PATH
from dualloop.ood.gatefile import GateFileError, load_gate
from tests.fuzz.budget import fuzz_settings
from tests.paths import FIXTURES

# damaged files hold values beyond float32 (the importers keep them as Inf)
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")

REAL = FIXTURES / "real-drives"
BASE_GATE = BASE_MODEL_PATH.with_suffix(".gate.npz")
ODD_CELLS = [
    "",
    " ",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "1e400",
    "-1e400",
    "abc",
    "0x10",
    "1,5",
    '"',
    "Human",
    "-1",
    "९",
    "\x00",
]


# -- corruption ---------------------------------------------------------------------------------


@st.composite
def damaged_bytes(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` damaged the way disks, transfers and editors damage files."""
    how = draw(st.sampled_from(["truncate", "flip", "overwrite", "insert", "delete", "empty", "garbage"]))
    n = len(data)
    if how == "empty":
        return b""
    if how == "garbage":
        return draw(st.binary(min_size=1, max_size=256))
    at = draw(st.integers(0, max(n - 1, 0)))
    if how == "truncate":
        return data[:at]
    if how == "flip":
        out = bytearray(data)
        for _ in range(draw(st.integers(1, 8))):
            k = draw(st.integers(0, n - 1))
            out[k] ^= 1 << draw(st.integers(0, 7))
        return bytes(out)
    span = draw(st.binary(min_size=1, max_size=64))
    if how == "overwrite":
        return data[:at] + span + data[at + len(span) :]
    if how == "insert":
        return data[:at] + span + data[at:]
    return data[:at] + data[at + draw(st.integers(1, 512)) :]


@st.composite
def damaged_csv(draw: st.DrawFn, text: str) -> bytes:
    """A CSV damaged as bytes, or as a table: odd cells, lines lost, repeated or swapped, a column
    dropped or doubled, another delimiter, a BOM or CRLF line ends."""
    if draw(st.integers(0, 3)) == 0:
        return draw(damaged_bytes(text.encode()))
    lines = text.splitlines()
    for _ in range(draw(st.integers(1, 3))):
        how = draw(st.sampled_from(["cell", "cell", "cell", "drop", "repeat", "swap", "column", "twice", "sep"]))
        k = draw(st.integers(0, len(lines) - 1)) if lines else 0
        if not lines:
            break
        if how == "cell":
            cells = lines[k].split(",")
            cells[draw(st.integers(0, len(cells) - 1))] = draw(
                st.one_of(st.sampled_from(ODD_CELLS), st.text(max_size=6))
            )
            lines[k] = ",".join(cells)
        elif how == "drop":
            del lines[k]
        elif how == "repeat":
            lines.insert(k, lines[k])
        elif how == "swap":
            j = draw(st.integers(0, len(lines) - 1))
            lines[k], lines[j] = lines[j], lines[k]
        elif how in ("column", "twice"):
            c = draw(st.integers(0, 30))
            for i, line in enumerate(lines):
                cells = line.split(",")
                if c < len(cells):
                    cells[c:c] = [cells[c]] if how == "twice" else []
                    if how == "column":
                        del cells[c]
                lines[i] = ",".join(cells)
        else:
            lines = [line.replace(",", ";") for line in lines]
    out = "\n".join(lines)
    if draw(st.booleans()):
        out = out.replace("\n", "\r\n")
    return (("\ufeff" if draw(st.integers(0, 5)) == 0 else "") + out).encode()


def assert_clear(error: BaseException, types: type[BaseException] | tuple, path: Path) -> None:
    """The loader's own error type, naming the file, in one paragraph (no repr of an exception chain)."""
    assert isinstance(error, types), f"{type(error).__name__}: {error}"
    assert str(path.name) in str(error), f"the message does not name {path.name}: {error}"
    assert "Traceback" not in str(error)


def accepts_or_refuses_clearly(load: Callable[[Path], object], path: Path, types: type[BaseException] | tuple) -> None:
    try:
        load(path)
    except types as err:
        assert_clear(err, types, path)


# -- the importers ------------------------------------------------------------------------------


def seed_csv() -> str:
    """16 s at 10 Hz with every kind of column the CSV importer reads (docs/importers.md#csv)."""
    rows = ["time,ego_speed[km/h],lead_present,lead_distance[ft],lead_rel_speed,actual_accel,actual_steer"]
    for k in range(160):
        t = 12.0 + k / 10
        v = 72.0 + 5.0 * math.sin(t / 3)
        rows.append(f"{t:.1f},{v:.2f},1,{98.4 - k * 0.1:.2f},{-3.3 + k * 0.01:.2f},{0.2 * math.cos(t):.3f},0.0")
    return "\n".join(rows) + "\n"


IMPORTERS = {
    "csv": (seed_csv, lambda p, out: import_csv(p, out / "x.mcap", start_time_unix_ns=1), CsvImportError),
    "openacc-astazero": (
        lambda: (REAL / "openacc-astazero-human" / "ASta_040719_platoon3_new.csv").read_text(),
        lambda p, out: import_openacc(p, out, start_time_unix_ns=1),
        OpenAccError,
    ),
    "openacc-zalazone": (
        lambda: (REAL / "openacc-zalazone-human" / "handling_part40.csv").read_text(),
        lambda p, out: import_openacc(p, out, start_time_unix_ns=1),
        OpenAccError,
    ),
    "ngsim": (
        lambda: (REAL / "ngsim-i80-emd-chains" / "1_11_24_44_55_54.csv").read_text(),
        lambda p, out: import_ngsim(p, out, start_time_unix_ns=1),
        NgsimError,
    ),
}


@pytest.mark.parametrize("kind", list(IMPORTERS))
def test_csv_importers_refuse_damaged_files_clearly(kind: str) -> None:
    seed, run, error = IMPORTERS[kind]
    name = "1_11_24_44_55_54.csv" if kind == "ngsim" else f"{kind}_new.csv"  # ngsim reads ids from the name

    @fuzz_settings(max_examples=40)
    @given(damaged_csv(seed()))
    def one(data: bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_bytes(data)
            out = Path(tmp) / "out"
            out.mkdir()
            accepts_or_refuses_clearly(lambda p: run(p, out), path, error)

    one()


def save(folder: Path, t: np.ndarray, value: np.ndarray) -> None:
    folder.mkdir(parents=True)
    for name, array in (("t", t), ("value", value)):
        with open(folder / name, "wb") as stream:  # the dataset's files have no .npy suffix
            np.save(stream, array)


def comma2k19_segment(root: Path) -> list[Path]:
    """A small segment in comma2k19's layout (as tests/controller/logs/test_import_comma2k19.py), its files."""
    t = 1000.0 + np.arange(0.0, 3.0, 0.02)
    save(root / "processed_log" / "CAN" / "speed", t, (15.0 + 2.0 * np.sin(t)).reshape(-1, 1))
    save(root / "processed_log" / "CAN" / "steering_angle", t, np.full_like(t, 3.0))
    radar_t = np.arange(1000.0, 1003.0, 0.05)
    save(
        root / "processed_log" / "CAN" / "radar",
        radar_t,
        np.array([[30.0, 0.2, -1.0, np.nan, np.nan, 530, 0]] * len(radar_t)),
    )
    save(root / "processed_log" / "IMU" / "gyro", t, np.zeros((len(t), 3)))
    return sorted(p for p in root.rglob("*") if p.is_file())


@st.composite
def damaged_npy(draw: st.DrawFn, data: bytes) -> bytes:
    """An .npy damaged as bytes, or rewritten with another dtype, shape or a pickled object."""
    how = draw(st.sampled_from(["bytes", "bytes", "dtype", "shape", "object", "empty"]))
    if how == "bytes":
        return draw(damaged_bytes(data))
    array = np.load(io.BytesIO(data))
    if how == "dtype":
        array = array.astype(draw(st.sampled_from(["<U3", "bool", "int8", "complex64", "float16"])))
    elif how == "shape":
        array = array.reshape(-1)[: draw(st.integers(0, 5))] if draw(st.booleans()) else array.reshape(1, -1)
    elif how == "object":
        array = np.array([{"a": 1}, None], dtype=object)
    else:
        array = np.zeros((0,))
    out = io.BytesIO()
    np.save(out, array, allow_pickle=True)
    return out.getvalue()


def test_comma2k19_importer_refuses_damaged_segments_clearly() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        pristine = {p.relative_to(tmp): p.read_bytes() for p in comma2k19_segment(Path(tmp) / "segment")}
    names = sorted(pristine, key=str)

    @fuzz_settings(max_examples=40)
    @given(st.sampled_from(names).flatmap(lambda n: st.tuples(st.just(n), damaged_npy(pristine[n]))))
    def one(damage: tuple[Path, bytes]) -> None:
        which, data = damage
        with tempfile.TemporaryDirectory() as tmp:
            for rel, content in pristine.items():
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                (Path(tmp) / rel).write_bytes(data if rel == which else content)
            segment = Path(tmp) / "segment"
            try:
                import_comma2k19(segment, Path(tmp) / "x.mcap", start_time_unix_ns=1)
            except Comma2k19Error as err:
                assert "segment" in str(err), err  # names the folder (and the file when one is at fault)

    one()


# -- gate files, model cards, MCAP logs --------------------------------------------------------


def _odd_json_value() -> st.SearchStrategy:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.sampled_from([0, -1, 10**30, 1.5, math.nan, math.inf, "", "x", [], {}, [1, "a"], {"a": None}]),
    )


def _keys(node: object) -> list:
    """The keys of a JSON object, the indices of a list, nothing for a scalar."""
    if isinstance(node, dict):
        return list(node)
    return list(range(len(node))) if isinstance(node, list) else []


@st.composite
def damaged_json(draw: st.DrawFn, doc: object) -> object:
    """`doc` with one to three values replaced by a wrong type, keys dropped, or lists cut."""
    doc = json.loads(json.dumps(doc))
    for _ in range(draw(st.integers(1, 3))):
        parent, key = doc, None
        for _depth in range(draw(st.integers(0, 4))):  # walk down to a random place
            keys = _keys(parent)
            if not keys:
                break
            key = draw(st.sampled_from(keys))
            if isinstance(parent[key], (dict, list)) and parent[key] and draw(st.booleans()):
                parent = parent[key]
                key = None
            else:
                break
        if key is None:
            keys = _keys(parent)
            if not keys:
                continue
            key = draw(st.sampled_from(keys))
        how = draw(st.sampled_from(["replace", "replace", "drop", "cut"]))
        if how == "drop" and isinstance(parent, dict):
            del parent[key]
        elif how == "cut" and isinstance(parent[key], list):
            parent[key] = parent[key][: draw(st.integers(0, max(len(parent[key]) - 1, 0)))]
        else:
            parent[key] = draw(_odd_json_value())
    return doc


def test_model_cards_refuse_damaged_metadata_clearly(base_model: DecisionModel) -> None:
    card = json.loads(base_model.card.model_dump_json())

    @fuzz_settings(max_examples=150)
    @given(
        st.one_of(
            damaged_json(card).map(json.dumps),
            damaged_bytes(json.dumps(card).encode()).map(lambda b: b.decode("utf-8", "replace")),
        )
    )
    def one(raw: str) -> None:
        try:
            parse_card(raw, "damaged.onnx")
        except ModelFileError as err:
            assert "damaged.onnx" in str(err) and METADATA_KEY in str(err), err

    one()


def test_model_files_refuse_damaged_onnx_clearly() -> None:
    pristine = BASE_MODEL_PATH.read_bytes()

    @fuzz_settings(max_examples=25)
    @given(damaged_bytes(pristine))
    def one(data: bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "damaged.onnx"
            path.write_bytes(data)
            accepts_or_refuses_clearly(lambda p: DecisionModel(p, warmup_batches=()), path, ModelFileError)

    one()


@st.composite
def damaged_gate(draw: st.DrawFn, entries: dict[str, np.ndarray]) -> bytes:
    """A gate .npz rewritten with its metadata or arrays damaged, or its bytes damaged."""
    how = draw(st.sampled_from(["bytes", "metadata", "metadata", "array", "drop", "text"]))
    if how == "bytes":
        buffer = io.BytesIO()
        np.savez(buffer, **entries)
        return draw(damaged_bytes(buffer.getvalue()))
    entries = dict(entries)
    if how == "metadata":
        entries["metadata"] = np.array(json.dumps(draw(damaged_json(json.loads(str(entries["metadata"][()]))))))
    elif how == "text":
        entries["metadata"] = np.array(draw(st.sampled_from(["", "{", "[]", "null", '{"format": 1}', "1e999"])))
    elif how == "drop":
        del entries[draw(st.sampled_from(sorted(entries)))]
    else:
        name = draw(st.sampled_from(sorted(n for n in entries if n != "metadata")))
        array = entries[name]
        entries[name] = draw(
            st.sampled_from(
                [
                    array.astype(np.float16) if array.dtype.kind == "f" else array.astype(np.float64),
                    array.reshape(-1)[:3],
                    np.full_like(array, np.nan) if array.dtype.kind == "f" else array,
                    np.zeros((0,), array.dtype),
                    np.array("text"),
                ]
            )
        )
    buffer = io.BytesIO()
    np.savez(buffer, **entries)
    return buffer.getvalue()


def test_gate_files_refuse_damage_clearly() -> None:
    with np.load(BASE_GATE, allow_pickle=False) as npz:
        entries = {name: npz[name] for name in npz.files}

    @fuzz_settings(max_examples=120)
    @given(damaged_gate(entries))
    def one(data: bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "damaged.gate.npz"
            path.write_bytes(data)
            accepts_or_refuses_clearly(load_gate, path, GateFileError)

    one()


def test_mcap_logs_read_what_survives_or_refuse_clearly(tmp_path_factory: pytest.TempPathFactory) -> None:
    pristine = synthetic_log(tmp_path_factory.mktemp("seed") / "seed.mcap", seconds=2.0, rate_hz=50.0).read_bytes()

    @fuzz_settings(max_examples=60)
    @given(damaged_bytes(pristine))
    def one(data: bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "damaged.mcap"
            path.write_bytes(data)
            try:
                sessions = read_sessions(path)
            except LogFileError as err:
                assert_clear(err, LogFileError, path)
                return
            for data_ in sessions.values():  # what was recovered says what was lost, naming the file
                assert not data_.truncated or path.name in data_.truncation

    one()


# -- the command line ---------------------------------------------------------------------------


def cli_cases(root: Path) -> dict[str, tuple[Path, str, list[str]]]:
    """command -> (the file to damage, the name its error must say, the arguments); outputs under root."""
    log = synthetic_log(root / "drive.mcap", seconds=1.0, rate_hz=50.0)
    intact_log = root / "intact.mcap"  # the gate's case damages only the gate
    intact_log.write_bytes(log.read_bytes())
    radar_t = comma2k19_segment(root / "segment")[0]  # processed_log/CAN/radar/t, the first in sorted order
    files = {
        "csv": (root / "drive.csv", seed_csv()),
        "openacc": (root / "ASta_new.csv", IMPORTERS["openacc-astazero"][0]()),
        "ngsim": (root / "1_11_24_44_55_54.csv", IMPORTERS["ngsim"][0]()),
    }
    for path, text in files.values():
        path.write_text(text)
    gate, model, out = root / "base.gate.npz", root / "base.onnx", root / "out"
    gate.write_bytes(BASE_GATE.read_bytes())
    model.write_bytes(BASE_MODEL_PATH.read_bytes())
    return {
        "import csv": (
            files["csv"][0],
            "drive.csv",
            ["import", "csv", str(files["csv"][0]), "-o", str(out / "c.mcap")],
        ),
        "import openacc": (
            files["openacc"][0],
            "ASta_new.csv",
            ["import", "openacc", str(files["openacc"][0]), "-o", str(out)],
        ),
        "import ngsim": (
            files["ngsim"][0],
            "1_11_24_44_55_54.csv",
            ["import", "ngsim", str(files["ngsim"][0]), "-o", str(out)],
        ),
        # a segment's error names the folder, and the file within it when one file is at fault
        "import comma2k19": (
            radar_t,
            "segment",
            ["import", "comma2k19", str(root / "segment"), "-o", str(out / "s.mcap")],
        ),
        "info": (model, "base.onnx", ["info", str(model)]),
        "replay log": (
            log,
            "drive.mcap",
            ["replay", str(log), "--no-gate", "--model", str(BASE_MODEL_PATH), "--out", str(out / "r.mcap")],
        ),
        "replay gate": (
            gate,
            "base.gate.npz",
            ["replay", str(intact_log), "--gate", str(gate), "--out", str(out / "g.mcap")],
        ),
    }


def error_line(output: str, name: str) -> str:
    """The command's error: no traceback, and one line `error: ...` that names the file."""
    assert "Traceback" not in output, output
    lines = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, output
    assert name in lines[0], lines[0]
    return lines[0]


def test_cli_commands_answer_damaged_files_with_one_line(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """`dualloop` in-process on damaged inputs: it finishes (0) or says in one line what is wrong with
    which file (non-zero); never an exception."""
    cases = cli_cases(tmp_path_factory.mktemp("cli"))
    pristine = {name: path.read_bytes() for name, (path, _, _) in cases.items()}

    @fuzz_settings(max_examples=60)
    @given(st.sampled_from(sorted(cases)).flatmap(lambda name: st.tuples(st.just(name), damaged_bytes(pristine[name]))))
    def one(damage: tuple[str, bytes]) -> None:
        name, data = damage
        path, says, argv = cases[name]
        path.write_bytes(data)
        try:
            code = main(argv)
        finally:
            path.write_bytes(pristine[name])
        output = "".join(capsys.readouterr())
        if code != 0:
            error_line(output, says)

    one()


def test_the_dualloop_executable_refuses_corrupt_files_in_one_line(tmp_path: Path) -> None:
    """The installed entry point, as a user runs it, on a file of each kind cut short and garbled."""
    # three of the commands (each process loads the whole CLI; the in-process test above runs them all)
    cases = {k: v for k, v in cli_cases(tmp_path).items() if k in ("import csv", "replay log", "replay gate")}
    for path, _, _ in cases.values():
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 3] + b"\x80\x00 garbage \xff")
    executable = Path(sys.executable).with_name("dualloop")
    runs = {
        name: subprocess.Popen([str(executable), *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, (_, _, argv) in cases.items()
    }
    for name, run in runs.items():
        output, _ = run.communicate(timeout=120)
        assert run.returncode != 0, f"{name}: {output}"
        error_line(output, cases[name][1])
