"""``fleetsieve-bayes priors list | show | derive``: the model-family prior cards.

* ``priors list`` — the shipped cards.
* ``priors show NAME_OR_PATH [--json] [--fields]`` — the prior median and 90 %
  interval of the knee TP and of per-GPU capacity per TP, from prior-predictive
  draws of the model (``--json``: ``{"knee_tp": {"median", "lo", "hi"}, "tp":
  {"1": {"feasible", "capacity_per_gpu": {"median", "lo", "hi"}}, ...}}``);
  the text form also lists every field of the card.
* ``priors derive (--config CONFIG.json | architecture flags) --gpu GPU --dtype
  {bf16,fp8} [--kv-dtype ...] [--tp 1,2,4,8] [--prompt-tokens P]
  [--output-tokens O] --out CARD.toml`` — a card from the architecture's and
  the GPU's arithmetic (:mod:`fleetsieve_bayes.model.derive`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from fleetsieve_bayes.errors import InputError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("priors", help="list, show or derive model-family prior cards")
    sub = p.add_subparsers(dest="priors_command", metavar="ACTION")
    sub.required = True
    ls = sub.add_parser("list", help="list the shipped prior cards")
    ls.set_defaults(func=run_list)

    show = sub.add_parser(
        "show", help="prior median and 90%% interval of the knee TP and per-GPU capacity per TP"
    )
    show.add_argument("name", help="card name (a shipped card's file stem, `priors list`) or path")
    show.add_argument("--json", action="store_true", help="print the summary as JSON")
    show.add_argument("--tp", default=None, help="TPs to summarise, e.g. 1,2,4,8 (default: the card's)")
    show.add_argument("--draws", type=int, default=4000, help="prior draws (default 4000)")
    show.set_defaults(func=run_show)

    d = sub.add_parser("derive", help="derive a prior card from a model architecture and a GPU")
    d.add_argument("--config", help="Hugging Face config.json of the model, or a shipped architecture name")
    arch = d.add_argument_group("architecture flags (instead of --config)")
    arch.add_argument("--parameters", type=float, help="total parameters (billions, or a count)")
    arch.add_argument("--layers", type=int)
    arch.add_argument("--hidden-size", type=int)
    arch.add_argument("--heads", type=int, help="attention heads")
    arch.add_argument("--kv-heads", type=int, help="KV heads (default: --heads)")
    arch.add_argument("--head-dim", type=int, help="default: hidden size / heads")
    arch.add_argument("--vocab", type=int, help="vocabulary size")
    arch.add_argument("--intermediate-size", type=int, help="MLP width (instead of --parameters)")
    arch.add_argument("--experts", type=int, help="MoE experts (default 1: dense)")
    arch.add_argument("--active-experts", type=int, help="experts per token")
    arch.add_argument("--tied-embeddings", action="store_true")
    arch.add_argument("--name", help="family name of the card (default: architecture-dtype-gpu)")
    d.add_argument("--gpu", required=True, help="GPU type (h100-sxm-80gb, h200-141gb, a100-80gb, l40s-48gb)")
    d.add_argument(
        "--also-gpus",
        default=None,
        help="other GPU types (comma-separated): the card's [gpu_axis] gets their roofline ratios to --gpu",
    )
    d.add_argument("--dtype", required=True, choices=("bf16", "fp8"), help="weight dtype")
    d.add_argument("--kv-dtype", default="bf16", choices=("bf16", "fp16", "fp8"), help="KV cache dtype (default bf16)")
    d.add_argument("--tp", default="1,2,4,8", help="TP degrees of the grid (default 1,2,4,8)")
    d.add_argument("--prompt-tokens", type=float, default=1000.0, help="mean prompt tokens (default 1000)")
    d.add_argument("--output-tokens", type=float, default=250.0, help="mean output tokens (default 250)")
    d.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    d.add_argument("--min-concurrency", type=int, default=8,
                   help="requests the KV cache must hold for a TP to count as feasible (default 8)")
    d.add_argument("--out", required=True, help="where to write the card (TOML)")
    d.set_defaults(func=run_derive)


def run_list(args: argparse.Namespace) -> int:
    from fleetsieve_bayes.model.priors import list_cards, load_card

    for name in list_cards():
        card = load_card(name)
        print(f"{name:<28} {card.card_description}")
    return 0


def _tp_list(text: str, flag: str) -> list[int]:
    try:
        tps = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{flag} must be a comma-separated list of TP degrees, got {text!r}") from None
    if not tps or min(tps) < 1:
        raise InputError(f"{flag} must list positive TP degrees, got {text!r}")
    return tps


def run_show(args: argparse.Namespace) -> int:
    from fleetsieve_bayes.model.priors import card_fields, load_card

    card = load_card(args.name)
    if args.draws < 100:
        raise InputError(f"--draws must be >= 100, got {args.draws}")
    tps = _tp_list(args.tp, "--tp") if args.tp else None

    from fleetsieve_bayes.model.prior_check import summarize_card

    summary = summarize_card(card, tps, n_draws=args.draws)
    if args.json:
        print(json.dumps(summary))
        return 0
    unit = "req/s/GPU" if card.capacity_per_gpu_at_knee is not None else "x median offered/GPU"
    k = summary["knee_tp"]
    print(f"# {card.name}  ({card.path})")
    print(f"{card.card_description}")
    print(f"knee TP            {k['median']:.2f}  [{k['lo']:.2f}, {k['hi']:.2f}]  (prior median, 90% interval)")
    print(f"capacity per GPU ({unit}):")
    for tp, row in summary["tp"].items():
        c = row["capacity_per_gpu"]
        if not row["feasible"]:
            print(f"  TP{tp:<3} infeasible (the card's memory check: skipped at zero GPU-seconds)")
        else:
            print(f"  TP{tp:<3} {c['median']:8.3g}  [{c['lo']:.3g}, {c['hi']:.3g}]")
    print("fields:")
    for key, value in card_fields(card):
        if value is None:
            continue
        print(f"  {key:<34} {value}")
    return 0


def _command_line(args: argparse.Namespace, source: str) -> str:
    """The card's first line: the command that re-derives it."""
    parts = ["fleetsieve-bayes priors derive"]
    if args.config:
        parts.append(f"--config {source}")
    else:
        for flag in ("parameters", "layers", "hidden_size", "heads", "kv_heads", "head_dim", "vocab",
                     "intermediate_size", "experts", "active_experts"):
            v = getattr(args, flag)
            if v is not None:
                parts.append(f"--{flag.replace('_', '-')} {v:g}")
        if args.tied_embeddings:
            parts.append("--tied-embeddings")
    parts += [f"--gpu {args.gpu}"] + ([f"--also-gpus {args.also_gpus}"] if args.also_gpus else [])
    parts += [f"--dtype {args.dtype}", f"--kv-dtype {args.kv_dtype}", f"--tp {args.tp}",
              f"--prompt-tokens {args.prompt_tokens:g}", f"--output-tokens {args.output_tokens:g}"]
    if args.gpu_memory_utilization != 0.9:
        parts.append(f"--gpu-memory-utilization {args.gpu_memory_utilization:g}")
    if args.min_concurrency != 8:
        parts.append(f"--min-concurrency {args.min_concurrency}")
    if args.name:
        parts.append(f"--name {args.name}")
    parts.append(f"--out {args.out}")
    return "# " + " ".join(parts) + "\n"


def _with_gpu_axis(d: Any, args: argparse.Namespace, arch: Any, gpu: Any) -> Any:
    """The derivation with a ``[gpu_axis]`` section for ``--also-gpus`` (model/gpu_axis.py)."""
    from fleetsieve_bayes.model.derive import Workload, gpu_spec
    from fleetsieve_bayes.model.gpu_axis import card_section, gpu_axis

    names = [n.strip() for n in args.also_gpus.split(",") if n.strip()]
    if not names:
        raise InputError(f"--also-gpus: expected GPU names, got {args.also_gpus!r}")
    others = [gpu_spec(n) for n in names]
    if any(o.name == gpu.name for o in others) or len({o.name for o in others}) != len(others):
        raise InputError(f"--also-gpus: {args.also_gpus!r} repeats a GPU (or --gpu {gpu.name})")
    axis = gpu_axis(
        arch,
        [gpu, *others],
        gpu.name,
        dtype=args.dtype,
        kv_dtype=args.kv_dtype,
        workload=Workload(args.prompt_tokens, args.output_tokens),
        tps=_tp_list(args.tp, "--tp"),
        gpu_memory_utilization=args.gpu_memory_utilization,
        min_concurrency=args.min_concurrency,
    )
    capacity = {**d.sections.get("capacity", {}), "tp_departures": "orthogonal"}  # model/joint.py::tp_departure
    sections = {**d.sections, "capacity": capacity, "gpu_axis": card_section(axis)}
    comments = {
        **d.comments,
        "gpu_axis": (
            f"log ratios of each GPU's roofline (per-GPU capacity, p99 TTFT, p99 completion) to {gpu.name}'s, "
            "per TP (-inf/inf: the model does not fit that GPU, or the reference, at that TP)"
        ),
    }
    return d._replace(sections=sections, comments=comments)


def run_derive(args: argparse.Namespace) -> int:
    from fleetsieve_bayes.model.derive import (
        Workload,
        architecture_from_fields,
        derive,
        gpu_spec,
        load_architecture,
        render_card,
    )
    from fleetsieve_bayes.model.priors import load_card

    flags = {
        "parameters": args.parameters,
        "layers": args.layers,
        "hidden": args.hidden_size,
        "heads": args.heads,
        "kv_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "vocab": args.vocab,
        "intermediate": args.intermediate_size,
        "experts": args.experts,
        "active_experts": args.active_experts,
    }
    given = {k: v for k, v in flags.items() if v is not None}
    if args.config and given:
        raise InputError("give either --config or architecture flags (--layers, --hidden-size, ...), not both")
    gpu = gpu_spec(args.gpu)
    if args.config:
        arch = load_architecture(args.config)
        source = str(args.config)
    elif given:
        given["tied"] = args.tied_embeddings
        arch = architecture_from_fields(given, source="architecture flags", name=args.name or "model")
        source = "flags"
    else:
        raise InputError("no architecture: give --config CONFIG.json or the architecture flags "
                         "(--parameters, --layers, --hidden-size, --heads, --kv-heads, --vocab, ...)")
    d = derive(
        arch,
        gpu,
        dtype=args.dtype,
        kv_dtype=args.kv_dtype,
        workload=Workload(args.prompt_tokens, args.output_tokens),
        tps=_tp_list(args.tp, "--tp"),
        gpu_memory_utilization=args.gpu_memory_utilization,
        min_concurrency=args.min_concurrency,
        name=args.name,
        source=source,
    )
    if args.also_gpus:
        d = _with_gpu_axis(d, args, arch, gpu)
    out = Path(args.out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(_command_line(args, source) + render_card(d), encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{out}: cannot write the card: {exc}") from None
    card = load_card(out)  # a derived card must load like any other
    knees = ", ".join(
        f"TP{r.tp} {r.per_gpu_rps:.2f}" if r.feasible else f"TP{r.tp} infeasible" for r in d.rows
    )
    print(f"wrote {out}: knee TP{card.knee_tp:.2f}, {card.capacity_per_gpu_at_knee:g} req/s/GPU at the knee; "
          f"per-GPU roofline capacity {knees}")
    return 0
