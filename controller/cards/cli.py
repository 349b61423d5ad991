"""`dualloop card init | attach | check`: serve an ONNX model that dualloop did not export."""

from __future__ import annotations

import argparse
from pathlib import Path

from dualloop.controller.cards.cards import attach, check, template_text
from dualloop.controller.console import console, error_console


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("card", help="write, attach and check the model card of an ONNX model")
    card_sub = p.add_subparsers(dest="card_command", required=True)
    g = card_sub.add_parser("init", help="write a card template (TOML) from the graph's inputs and outputs")
    g.add_argument("model", type=Path)
    g.add_argument("--out", type=Path, help="default: MODEL.card.toml next to the model")
    g.add_argument("--force", action="store_true", help="overwrite an existing card file")
    g.set_defaults(fn=_init)
    g = card_sub.add_parser("attach", help="validate a completed card and embed it in the model")
    g.add_argument("model", type=Path)
    g.add_argument("card", type=Path)
    g.add_argument("--out", type=Path, help="default: replace MODEL (written beside it, then renamed over it)")
    g.set_defaults(fn=_attach)
    g = card_sub.add_parser("check", help="check a card (embedded, or CARD.toml) against the graph")
    g.add_argument("model", type=Path)
    g.add_argument("card", type=Path, nargs="?")
    g.set_defaults(fn=_check)


def _init(args: argparse.Namespace) -> int:
    out: Path = args.out or args.model.with_suffix(".card.toml")
    text, card, warnings = template_text(args.model)
    for warning in warnings:  # before anything else: no card makes such a graph run
        error_console.print(f"[yellow]warning:[/] {args.model}: {warning}", highlight=False, soft_wrap=True)
    if out.exists() and not args.force:
        raise FileExistsError(f"{out}: exists; pass --force to overwrite it")
    out.write_text(text, encoding="utf-8")
    if card is not None:
        console.print(
            f"wrote {out} from the card embedded in {args.model} (version {card.version}): edit what changed, "
            f"then `dualloop card attach {args.model} {out}`"
        )
    else:
        console.print(f"wrote {out}: fill in every TODO, then `dualloop card attach {args.model} {out}`")
    return 0


def _attach(args: argparse.Namespace) -> int:
    out: Path = args.out or args.model
    card = attach(args.model, args.card, out)
    console.print(f"wrote {out}: model {card.name} version {card.version}, feature schema {card.schema_hash()}")
    return 0


def _check(args: argparse.Namespace) -> int:
    card = check(args.model, args.card)
    console.print(
        f"{args.model}{' with ' + str(args.card) if args.card else ''}: ok (model {card.name} version "
        f"{card.version}, {len(card.features)} features, {len(card.actions)} actions, decision vector "
        f"{card.decision_vector_size} from {[p.output for p in card.decision_vector_parts]})"
    )
    return 0
