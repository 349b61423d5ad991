"""The `dualloop` command line: each sub-package of controller/ registers its own commands here."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from dualloop.controller.extras import EXTRA_OF_MODULE, MissingExtra
from dualloop.controller.interrupts import Terminated

DESCRIPTION = (
    "dualloop: a real-time streaming controller. A 5 ms ONNX executor, a slow planner and an independent "
    "OOD gate behind one gRPC API, for shadow mode, closed-loop simulation and replay of recorded drives."
)


@dataclass(frozen=True)
class CommandGroup:
    """A sub-package's commands: the module whose register() adds them, the extra they need beyond
    serving, and their names (so `dualloop CMD` imports only CMD's group: importing every group cost a
    command ~1 s of start-up; and so a group whose extra is missing can still list them)."""

    module: str
    extra: str | None
    commands: tuple[str, ...]
    # modules the commands import only when they run (onnx in make-test-model, quantize): checked up
    # front, so a lean or [demo] install names the extra instead of ending in a ModuleNotFoundError
    needs: tuple[str, ...] = ()


# The one table of commands, in the order `dualloop --help` lists them. A new command is one entry
# here and its group's register(); tests/controller/test_cli.py checks the table against them.
COMMAND_GROUPS = (
    CommandGroup("dualloop.controller.demo.cli", "demo", ("demo", "demo-safety", "demo-traffic")),
    CommandGroup("dualloop.controller.serve.cli", None, ("serve", "stream", "info", "admin")),
    CommandGroup("dualloop.controller.logs.cli", None, ("import", "foxglove-layout", "recover")),
    CommandGroup("dualloop.controller.replay.cli", None, ("replay", "diff")),
    CommandGroup("dualloop.controller.training.cli", "train", ("train", "quantize", "make-test-model"), ("onnx",)),
    CommandGroup("dualloop.controller.transfer.cli", "train", ("eval-logs",)),
    CommandGroup("dualloop.controller.gates.cli", "train", ("gate",)),
    CommandGroup("dualloop.controller.cards.cli", "train", ("card",)),
    CommandGroup("dualloop.controller.qualify.cli", "train", ("qualify",)),
    CommandGroup("dualloop.controller.bench.cli", "bench", ("bench",)),
    CommandGroup("dualloop.controller.highway.cli", "highway", ("highway",)),
    CommandGroup("dualloop.controller.alpasim.cli", "alpasim", ("alpasim",)),
)
COMMANDS = {command: group.module for group in COMMAND_GROUPS for command in group.commands}
GROUP_COMMANDS = {group.module: group.commands for group in COMMAND_GROUPS}

if TYPE_CHECKING:
    Register = Callable[[argparse._SubParsersAction[argparse.ArgumentParser]], None]


def _missing_group(module: str, err: ModuleNotFoundError, extra: str | None) -> Register:
    """Stands in for a command group whose optional dependency is not installed (the lean install):
    its commands are listed and, when run, name the extra to install instead of a traceback."""
    missing = (err.name or "?").split(".")[0]
    if missing not in EXTRA_OF_MODULE:
        raise err  # not an optional extra: a broken install, show it
    extra = extra or EXTRA_OF_MODULE[missing]

    def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        for name in GROUP_COMMANDS[module]:
            # no option prefix: every argument, --flags too, is taken as given and the extra is named
            p = sub.add_parser(name, help=f"(needs pip install 'dualloop[{extra}]')", prefix_chars="\0", add_help=False)
            p.add_argument("rest", nargs=argparse.REMAINDER)
            p.set_defaults(fn=_raise(MissingExtra(f"`dualloop {name}`", missing, extra)))

    return register


def _raise(err: Exception) -> Callable[[argparse.Namespace], int]:
    def fn(_args: argparse.Namespace) -> int:
        raise err

    return fn


def _absent(modules: tuple[str, ...]) -> ModuleNotFoundError | None:
    """The first of `modules` not installed, found without importing it (onnx costs ~0.3 s)."""
    for name in modules:
        try:
            if importlib.util.find_spec(name) is None:
                return ModuleNotFoundError(f"No module named {name!r}", name=name)
        except ModuleNotFoundError as err:  # an import hook that refuses the name says so here
            return err
    return None


def _group(module: str, extra: str | None, needs: tuple[str, ...] = ()) -> Register:
    absent = _absent(needs)
    if absent is not None:
        return _missing_group(module, absent, extra)
    try:
        register: Register = importlib.import_module(module).register
        return register
    except ModuleNotFoundError as err:
        return _missing_group(module, err, extra)


def version_text() -> str:
    """The installed distribution, the wire contract and the shipped model (what a bug report needs)."""
    from importlib.metadata import PackageNotFoundError, version

    from dualloop.executor.model_card import ModelFileError
    from dualloop.executor.model_runner import DecisionModel
    from dualloop.models import BASE_MODEL_PATH

    try:
        dist = version("dualloop")
    except PackageNotFoundError:
        dist = "(not installed)"
    try:
        card = DecisionModel(BASE_MODEL_PATH, warmup_batches=()).card
        model = f"{card.name} {card.version}"
    except (ModelFileError, OSError) as err:
        model = f"unreadable ({err})"
    return f"dualloop {dist} (wire contract dualloop.v2; shipped model {model})"


class _VersionAction(argparse.Action):
    # computed only when asked: reading the model card costs an ONNX session
    def __call__(self, parser: argparse.ArgumentParser, *_: object, **__: object) -> None:
        print(version_text())
        parser.exit()


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """Every command group, or, when argv's first word is a command, only that command's group."""
    parser = argparse.ArgumentParser(prog="dualloop", description=DESCRIPTION)
    parser.add_argument("--version", action=_VersionAction, nargs=0, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    wanted = COMMANDS.get(argv[0]) if argv else None
    for group in COMMAND_GROUPS:
        if wanted is None or group.module == wanted:
            _group(group.module, group.extra, group.needs)(sub)
    return parser


def user_errors() -> tuple[type[Exception], ...]:
    """The errors of files and settings a user gives: said in one line (they name the file), not a
    traceback; a server child's failed start too (its line is the child's own error). Imported only
    when a command fails: importing them up front (the executor, onnxruntime, the log reader) cost
    every command ~0.3 s CPU before it could start its work."""
    from dualloop.controller.contract.errors import ConfigError
    from dualloop.controller.logs.logfile import LogFileError
    from dualloop.controller.server_process import ServerStartError
    from dualloop.executor.model_card import ModelFileError
    from dualloop.ood import GateFileError

    return (ConfigError, ModelFileError, GateFileError, LogFileError, OSError, MissingExtra, ServerStartError)


def _on_sigterm(owner: int) -> Callable[[int, object], None]:
    def handler(signum: int, _frame: object) -> None:
        if os.getpid() != owner:  # a fork of this process (a fork-context pool's worker): die as before
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        # a second SIGTERM while the first one's clean-up runs (a pool waiting for its work, say) ends
        # the process at once, as SIGTERM did before
        signal.signal(signum, signal.SIG_DFL)
        raise Terminated()

    return handler


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(argv).parse_args(argv)
    # Commands that handle SIGTERM themselves (serve drains, alpasim stops its server) install their
    # own handler later, which replaces this one; exec'd children start with the default again.
    # Only where SIGTERM was left at its default (not in a caller that chose otherwise, a test's).
    previous = signal.getsignal(signal.SIGTERM)
    catch = previous is signal.SIG_DFL and threading.current_thread() is threading.main_thread()
    if catch:
        signal.signal(signal.SIGTERM, _on_sigterm(os.getpid()))
    try:
        return int(args.fn(args))
    except KeyboardInterrupt as err:  # one line, no traceback; 128 + the signal, as a shell reports it
        from dualloop.controller.console import print_error

        terminated = isinstance(err, Terminated)
        print_error(f"dualloop {args.command}: stopped by {'SIGTERM' if terminated else 'SIGINT (Ctrl-C)'}")
        return 128 + (signal.SIGTERM if terminated else signal.SIGINT)
    except Exception as err:
        if not isinstance(err, user_errors()):
            raise
        from dualloop.controller.console import print_error

        print_error(err)
        return 2
    finally:
        if catch:
            signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
