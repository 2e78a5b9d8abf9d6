"""``fleetsieve-bayes priors list`` / ``priors show NAME``: the model-family prior cards."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("priors", help="list or show model-family prior cards")
    sub = p.add_subparsers(dest="priors_command", metavar="ACTION")
    sub.required = True
    ls = sub.add_parser("list", help="list the shipped prior cards")
    ls.set_defaults(func=run_list)
    show = sub.add_parser("show", help="print one card's fields and values")
    show.add_argument("name", help="card name (file stem under models/) or path")
    show.set_defaults(func=run_show)


def run_list(args: argparse.Namespace) -> int:
    from fleetsieve_bayes.model.priors import list_cards, load_card

    for name in list_cards():
        card = load_card(name)
        print(f"{name:<28} {card.card_description}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from fleetsieve_bayes.model.priors import card_fields, load_card

    card = load_card(args.name)
    print(f"# {card.name}  ({card.path})")
    for key, value in card_fields(card):
        if value is None:
            continue
        print(f"{key:<34} {value}")
    return 0
