"""The `dualloop` command line: each sub-package of controller/ registers its own commands here."""

from __future__ import annotations

import argparse
import sys

from dualloop.controller.bench import cli as bench_cli
from dualloop.controller.console import print_error
from dualloop.controller.demo import cli as demo_cli
from dualloop.controller.gates import cli as gates_cli
from dualloop.controller.logs import cli as logs_cli
from dualloop.controller.replay import cli as replay_cli
from dualloop.controller.serve import cli as serve_cli
from dualloop.controller.serve.config import ConfigError
from dualloop.controller.training import cli as training_cli
from dualloop.executor.model_card import ModelFileError

DESCRIPTION = (
    "dualloop: a real-time streaming controller. A 5 ms ONNX executor, a slow planner and an independent "
    "OOD gate behind one gRPC API, for shadow mode, closed-loop simulation and replay of recorded drives."
)
# in the order `dualloop --help` lists them
COMMAND_GROUPS = (demo_cli, serve_cli, logs_cli, replay_cli, training_cli, gates_cli, bench_cli)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dualloop", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)
    for group in COMMAND_GROUPS:
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except (ConfigError, ModelFileError, OSError) as err:
        print_error(err)
        return 2


if __name__ == "__main__":
    sys.exit(main())
