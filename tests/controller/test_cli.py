"""The command line registers only the group of the command it runs, and knows every group's commands."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys

from dualloop.controller.cli import COMMAND_GROUPS, COMMANDS, build_parser


def _commands(parser: argparse.ArgumentParser) -> set[str]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(sub.choices)


def test_the_command_table_lists_every_registered_command_once() -> None:
    assert _commands(build_parser()) == set(COMMANDS)
    listed = [command for group in COMMAND_GROUPS for command in group.commands]
    assert len(listed) == len(set(listed))
    for group in COMMAND_GROUPS:  # each group registers exactly the commands the table gives it
        assert _commands(build_parser([group.commands[0]])) == set(group.commands), group.module


def test_a_command_registers_only_its_own_group() -> None:
    assert _commands(build_parser(["replay", "--help"])) == {"replay", "diff"}
    assert _commands(build_parser(["info"])) == {"serve", "stream", "info", "admin"}
    # an unknown word or an option first: every group, so argparse names the choices
    assert _commands(build_parser(["nope"])) == set(COMMANDS)
    assert _commands(build_parser(["--version"])) == set(COMMANDS)


def _loaded_after(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of `modules` a new interpreter has imported after running `code`."""
    probe = f"{code}\nimport sys\nprint(sorted(m for m in {modules!r} if m in sys.modules))\n"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    return list(ast.literal_eval(out.strip()))


def test_replay_starts_without_the_server_stack() -> None:
    code = "from dualloop.controller.cli import build_parser\nbuild_parser(['replay'])"
    assert _loaded_after(code, ("grpc", "asyncio", "pydantic_settings", "yaml")) == []


def test_replay_parses_its_arguments_before_importing_numpy_or_the_executor() -> None:
    # a fleet's pool starts right after parsing: the workers' imports then overlap this process's own
    code = (
        "from dualloop.controller.cli import build_parser\n"
        "build_parser(['replay']).parse_args(['replay', 'a.mcap', 'b.mcap', '--workers', '2'])\n"
        "import dualloop.controller.replay.fleet"
    )
    assert _loaded_after(code, ("numpy", "onnxruntime", "pydantic", "rich", "google.protobuf")) == []


def test_a_fleets_parent_pools_and_prints_without_the_executor() -> None:
    # its summary modules are imported while the workers start: the executor is theirs alone
    code = (
        "import importlib\n"
        "from dualloop.controller.replay.cli import _SUMMARY_MODULES\n"
        "[importlib.import_module(m) for m in _SUMMARY_MODULES]"
    )
    assert _loaded_after(code, ("onnxruntime", "pydantic", "google.protobuf", "dualloop.executor.core")) == []
