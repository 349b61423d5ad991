"""Docs that cannot drift: the module inventory of docs/architecture.md is what the docstrings say, and
every file, function and pinning test docs/duplicated-rules.md names exists."""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import re
from functools import cache
from pathlib import Path
from types import ModuleType

from tests.paths import REPO_ROOT

RULES_PAGE = REPO_ROOT / "docs" / "duplicated-rules.md"
CODE = re.compile(r"`([^`]+)`")
TEST_FILE = re.compile(r"^tests/[\w/]+\.py$")
SOURCE_FILE = re.compile(r"^[\w./*-]+\.(py|c|proto|onnx|md|toml)$")
IDENTIFIER = re.compile(r"^[A-Za-z_][\w.]*$")


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_module_inventory_is_what_the_docstrings_say() -> None:
    inventory = _script("module_inventory")
    page = inventory.PAGE.read_text()
    assert page == inventory.replace_section(page, inventory.render()), (
        f"docs/architecture.md's module inventory differs from the docstrings; run: {inventory.REFRESH}"
    )


def test_the_inventory_lists_every_module_of_every_mapped_folder() -> None:
    inventory = _script("module_inventory")
    body = inventory.render()
    for folder in inventory.package_folders().values():
        for module in (REPO_ROOT / folder).rglob("*.py"):
            if module.name != "__init__.py" and "_pb2" not in module.name and "tests" not in module.parts:
                assert f"| `{module.stem}` |" in body, module


# ---- docs/duplicated-rules.md ----


# names the page uses that the project does not define: the libraries' own
EXTERNAL = {"pytest", "ClearField", "ext_modules"}  # pytest, protobuf, setuptools
SOURCES = ("controller", "executor", "planner", "ood", "sim", "models", "proto", "scripts", "setup.py")


@cache
def _definitions() -> tuple[frozenset[str], frozenset[str]]:
    """(names, qualified): every name a project source binds (functions, classes, methods, assignments,
    local variables, `self.x` attributes, C identifiers, proto fields), and `Owner.name` for each member
    of a class, module (by stem and dotted path), proto message, or C file (every pair of its identifiers
    is too many: a C `Kernel.decide` is accepted when both names occur in one C file, see _symbol_exists)."""
    names: set[str] = set(EXTERNAL)
    qualified: set[str] = set()
    for path in _source_files(".py"):
        tree = ast.parse(path.read_text())
        rel = path.relative_to(REPO_ROOT).with_suffix("")
        parts = rel.parts[1:] if rel.parts[0] == "proto" else rel.parts  # proto/dualloop/v2 is dualloop.v2
        if rel.name == "__init__":
            parts = parts[:-1]
        owners = {parts[-1], ".".join(parts), ".".join(parts[-2:])} if parts else set()
        qualified.update(".".join(parts[:i]) for i in range(2, len(parts) + 1))  # ood.compiled, dualloop.ood
        for node in tree.body:
            for name in _bound(node):
                names.add(name)
                qualified.update(f"{owner}.{name}" for owner in owners)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for member in ast.walk(node):
                    for name in _bound(member) if member in node.body else _self_attribute(member):
                        qualified.add(f"{node.name}.{name}")
            for name in _bound(node) + _self_attribute(node):
                names.add(name)
    for path in _source_files(".proto"):
        for message, body in re.findall(r"message (\w+) \{(.*?)\n\}", path.read_text(), re.S):
            fields = re.findall(r"(\w+) = \d+;", body)
            names.update([message, *fields])
            qualified.update(f"{message}.{field}" for field in fields)
    return frozenset(names), frozenset(qualified)


def _source_files(suffix: str) -> list[Path]:
    files = []
    for name in SOURCES:
        where = REPO_ROOT / name
        files += [where] if where.is_file() else sorted(where.rglob(f"*{suffix}"))
    return [f for f in files if f.suffix == suffix]


@cache
def _c_identifiers() -> tuple[frozenset[str], ...]:
    return tuple(frozenset(re.findall(r"[A-Za-z_]\w*", p.read_text())) for p in _source_files(".c"))


def _bound(node: ast.AST) -> list[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [t.id for t in node.targets if isinstance(t, ast.Name)]
    if isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, ast.ImportFrom):
        return [alias.asname or alias.name for alias in node.names]
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
        return [node.id]
    return []


def _self_attribute(node: ast.AST) -> list[str]:
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Store)
        and isinstance(node.value, ast.Name)
        and node.value.id == "self"
    ):
        return [node.attr]
    return []


@cache
def _tests_in(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    return frozenset(
        n.name
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test_")
    )


def _symbol_exists(token: str) -> bool:
    names, qualified = _definitions()
    parts = token.split(".")
    if len(parts) == 1:
        return token in names or any(token in c for c in _c_identifiers())
    if token in qualified or ".".join(parts[-2:]) in qualified:
        return True
    if token.startswith("dualloop.") and any(f.stem == parts[-1] for f in _source_files(".c")):
        return True  # a C extension module
    return any(set(parts[-2:]) <= c for c in _c_identifiers())


def rules_page_problems(page: str) -> list[str]:
    """Every file, function or test the page names that does not exist (a test is looked up in the
    test file named last before it in the same table row, bullet or paragraph)."""
    problems = []
    for block in re.split(r"\n(?=\|)|\n\s*\n|\n(?=- )", page):
        test_file: Path | None = None
        for token in CODE.findall(block):
            token = token.split("(")[0].strip()
            path, _, test = token.partition("::")
            if TEST_FILE.match(path):
                test_file = REPO_ROOT / path
                if not test_file.is_file():
                    problems.append(f"{path}: no such test file")
                elif test and not fnmatch.filter(_tests_in(test_file), test):
                    problems.append(f"{token}: no such test")
            elif token.startswith("test_") and IDENTIFIER.match(token):
                where = [test_file] if test_file else sorted((REPO_ROOT / "tests").rglob("test_*.py"))
                if not any(fnmatch.filter(_tests_in(f), token) for f in where if f.is_file()):
                    problems.append(f"{token}: no such test in {test_file or 'tests/'}")
            elif SOURCE_FILE.match(token):
                if "/" in token:
                    found = list(REPO_ROOT.glob(token)) or list((REPO_ROOT / "docs").glob(token))
                else:  # a bare file name: at the top, or anywhere in the sources
                    found = [REPO_ROOT / token] if (REPO_ROOT / token).is_file() else []
                    found += [f for f in _source_files(Path(token).suffix) if fnmatch.fnmatch(f.name, token)]
                if not found:
                    problems.append(f"{token}: no such file")
            elif IDENTIFIER.match(token) and not token.startswith(("np.", "dualloop ")):
                if not _symbol_exists(token):
                    problems.append(f"{token}: defined nowhere in the project")
    return problems


def test_every_file_function_and_test_the_duplicated_rules_page_names_exists() -> None:
    problems = rules_page_problems(RULES_PAGE.read_text())
    assert not problems, "docs/duplicated-rules.md names what does not exist:\n" + "\n".join(problems)


def test_the_check_finds_a_renamed_test_function_and_file() -> None:
    page = RULES_PAGE.read_text()
    assert "test_the_comparison_fails_on_a_one_ulp_difference" in page
    broken = (
        page.replace("test_the_comparison_fails_on_a_one_ulp_difference", "test_the_comparison_fails_on_one_ulp")
        .replace("`executor/lockstep_batch.py`", "`executor/lockstep.py`")
        .replace("`SafetyMachine.trust_run`", "`SafetyMachine.trust_runs`")
    )
    problems = rules_page_problems(broken)
    assert any("test_the_comparison_fails_on_one_ulp" in p for p in problems), problems
    assert "executor/lockstep.py: no such file" in problems
    assert "SafetyMachine.trust_runs: defined nowhere in the project" in problems


def test_every_section_of_the_page_cites_its_pinning_tests() -> None:
    """Each numbered section (a rule and its copies) names the tests that pin it, or says which pair is
    not pinned; the names themselves are checked above."""
    sections = re.split(r"\n## ", RULES_PAGE.read_text())
    numbered = [s for s in sections if re.match(r"\d+\. ", s)]
    assert len(numbered) >= 8
    for section in numbered:
        assert "::test_" in section or re.search(r"`test_\w+`", section), section.splitlines()[0]


# ---- links between the pages ----


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_to_a_heading_of_a_page_resolves() -> None:
    """A heading renamed (or a section moved to docs/measurements-archive.md) leaves no dead link."""
    pages = [*sorted((REPO_ROOT / "docs").rglob("*.md")), REPO_ROOT / "README.md", REPO_ROOT / "CONTRIBUTING.md"]
    links = 0
    dead = []
    for page in pages:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", page.read_text()):
            links += 1
            linked = (page.parent / target) if target else page
            lines = linked.read_text().splitlines() if linked.is_file() else []
            if anchor not in {_slug(line.lstrip("#")) for line in lines if line.startswith("#")}:
                dead.append(f"{page.relative_to(REPO_ROOT)}: {target}#{anchor}")
    assert links > 40 and not dead, dead


def test_the_current_figures_give_each_area_its_command() -> None:
    page = (REPO_ROOT / "docs" / "measurements.md").read_text()
    areas = re.split(r"\n## ", page)[1:]
    assert len(areas) >= 8
    for area in areas:
        if "|---|" in area:
            assert re.search(r"^Commands?: `", area, re.M), area.splitlines()[0]
            assert "measurements-archive.md#" in area, area.splitlines()[0]


# ---- code comments ----


def test_no_code_cites_an_issue_number() -> None:
    """A comment says its reason, not where it was asked for: an issue number means nothing to a reader
    without the tracker (CONTRIBUTING.md, Style)."""
    cited = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
    folders = ["controller", "executor", "planner", "ood", "sim", "models", "proto", "scripts", "tests", "clients"]
    files = [f for d in folders for f in sorted((REPO_ROOT / d).rglob("*")) if f.suffix in (".py", ".c", ".proto")]
    files = [f for f in files if "node_modules" not in f.parts]
    assert len(files) > 300
    found = [
        f"{f.relative_to(REPO_ROOT)}:{n}: {line.strip()}"
        for f in files
        for n, line in enumerate(f.read_text().splitlines(), start=1)
        if cited.search(line)
    ]
    assert not found, "say the reason instead:\n" + "\n".join(found)
