"""Size limits for hand-written code: modules, functions and parameter lists a newcomer can read.

A module over MAX_MODULE_LINES lines, a function over MAX_FUNCTION_LINES lines (decorators and docstring
included; a nested function counts inside its parent too) or with more than MAX_PARAMETERS parameters
(`self` and `cls` not counted; `*args` and `**kwargs` counted) fails `make check`, unless
scripts/size_allowlist.txt names it with a one-line justification. An entry that no longer exceeds a
limit fails too, so the list only shrinks.

Checked: the Python files of the mapped folders and scripts/, outside tests/ and the generated stubs.

    python scripts/size_check.py          # exit 1 and the offenders, or nothing
    python scripts/size_check.py --list   # every offender, allowed or not, as allowlist lines
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ALLOWLIST = ROOT / "scripts" / "size_allowlist.txt"
MAX_MODULE_LINES = 800
MAX_FUNCTION_LINES = 80
MAX_PARAMETERS = 10
SKIPPED_PARTS = {"tests", ".venv", "build", "node_modules", ".git"}


@dataclass(frozen=True)
class Offence:
    """One limit exceeded: `key` is `path` for a module, `path::Qual.name` for a function."""

    key: str
    what: str

    def line(self) -> str:
        return f"{self.key}  # {self.what}"


def python_files(root: Path = ROOT) -> list[Path]:
    """The hand-written Python files: everything but tests, virtualenvs, builds and generated stubs."""
    return sorted(
        path
        for path in root.rglob("*.py")
        if not SKIPPED_PARTS & set(path.relative_to(root).parts) and "_pb2" not in path.name
    )


def _functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield prefix + node.name, node
            yield from _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from _functions(node, f"{prefix}{node.name}.")
        else:
            yield from _functions(node, prefix)


def parameter_count(func: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = func.args
    named = [a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]]
    if named and named[0] in ("self", "cls"):
        named = named[1:]
    return len(named) + (args.vararg is not None) + (args.kwarg is not None)


def offences_in(path: Path, source: str, root: Path = ROOT) -> list[Offence]:
    """Every limit `source` (the text of `path`) exceeds."""
    rel = path.relative_to(root).as_posix()
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(Offence(rel, f"module of {lines} lines (limit {MAX_MODULE_LINES})"))
    for name, func in _functions(ast.parse(source, filename=rel)):
        first = min([func.lineno, *(d.lineno for d in func.decorator_list)])
        length = (func.end_lineno or func.lineno) - first + 1
        if length > MAX_FUNCTION_LINES:
            found.append(Offence(f"{rel}::{name}", f"function of {length} lines (limit {MAX_FUNCTION_LINES})"))
        count = parameter_count(func)
        if count > MAX_PARAMETERS:
            found.append(Offence(f"{rel}::{name}", f"{count} parameters (limit {MAX_PARAMETERS})"))
    return found


def all_offences(root: Path = ROOT) -> list[Offence]:
    return [o for path in python_files(root) for o in offences_in(path, path.read_text(), root)]


def read_allowlist(path: Path = ALLOWLIST) -> dict[str, str]:
    """key -> justification. Each entry is `key  # why`; an entry without a reason is an error."""
    entries: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        key, _, why = raw.partition("#")
        if not why.strip():
            raise SystemExit(f"{path.name}:{number}: '{key.strip()}' needs a one-line justification after '#'")
        entries[key.strip()] = why.strip()
    return entries


def problems(offences: list[Offence], allowed: dict[str, str]) -> list[str]:
    """What fails the check: offences not allowed, and allowed entries that no longer offend."""
    keys = {o.key for o in offences}
    found = [f"{o.key}: {o.what}" for o in offences if o.key not in allowed]
    found += [f"{key}: within the limits now; remove it from {ALLOWLIST.name}" for key in allowed if key not in keys]
    return found


def main(argv: list[str]) -> int:
    offences = all_offences()
    if "--list" in argv:
        for offence in offences:
            print(offence.line())
        return 0
    failed = problems(offences, read_allowlist())
    for line in failed:
        print(line)
    if failed:
        print(
            f"size check: {len(failed)} problem(s). Split the module or function, pass a parameter object, or (rarely)"
            f" add `key  # why` to scripts/{ALLOWLIST.name}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
