"""``fleetsieve-bayes status DIR [--json]``: where a campaign stands.

Reads only the journal (and ``result.json`` if the campaign finished), so it
works on a campaign that is still running or was killed, and it never imports
JAX: it answers in well under a second.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fleetsieve_bayes.campaign.directory import CampaignView, finite_or_none, load_campaign_dir
from fleetsieve_bayes.campaign.journal import Cell
from fleetsieve_bayes.campaign.makespan import read_in_flight
from fleetsieve_bayes.reporting.progress import CERT_STYLE

__all__ = ["register", "main", "status_json", "render_status"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "status",
        help="show a campaign's measured cells, certificate, allocations and gap",
        description="Summarise a campaign directory (running, interrupted or finished) from its journal.",
    )
    p.add_argument("directory", type=Path, help="campaign directory (run --out)")
    p.add_argument("--json", action="store_true", help="print a JSON object instead of tables")
    p.set_defaults(func=main)


def status_json(view: CampaignView) -> dict[str, Any]:
    """The status as a JSON-able dict (what ``--json`` prints); non-finite numbers are null."""
    last = view.last_round
    h = view.header
    return finite_or_none({
        "directory": str(view.directory),
        "campaign": h.campaign,
        "strategy": h.strategy,
        "seed": h.seed,
        "reused_from": h.reused_from,
        "state": view.state,
        "status": view.status,
        "candidates": view.n_candidates,
        "measured_cells": len(view.measurements),
        "gpu_seconds": view.gpu_seconds,
        "budget": None if not any((view.budget or {}).values()) else {**(view.budget or {}),
                                                                       "gpu_seconds": view.spent_gpu_seconds},
        "rounds": len(view.rounds),
        "measured": [
            {
                **r.cell.to_json(),
                "replicate": r.replicate,
                "phase": r.phase,
                "round": r.round,
                "gpu_seconds": r.gpu_seconds,
                "source": r.source,
                "row": r.row,
            }
            for r in view.measurements
        ],
        "certificate": None
        if last is None
        else {
            "status": last.certificate,
            "reason": last.reason,
            "gap": last.gap,
            "round": last.round,
            # The last certification attempt's joint check (absent: none this round).
            **({"joint": last.joint} if last.joint else {}),
        },
        "conservative": None if last is None else last.conservative.to_json(),
        "optimistic": None if last is None else last.optimistic.to_json(),
        "next": None if last is None or last.chosen is None else last.chosen.to_json(),
        "next_state": None if last is None or last.chosen is None else _chosen_state(view, last.chosen),
        "result": view.result,
        # result.json's ranked alternative fleets (null while running, or when it ranks none).
        "alternatives": (view.result or {}).get("alternatives"),
        "in_flight": read_in_flight(view.directory),
        "unserved": _unserved(view),
    })


def _unserved(view: CampaignView) -> dict[str, Any]:
    """Classes the final allocation gives no replicas: best measured cell and its SLO misses."""
    from fleetsieve_bayes.reporting.misses import unserved

    alloc = (view.result or {}).get("allocation")
    rows = [r.row for r in view.measurements]
    return {w: {"cell": u["cell"], "misses": [m._asdict() | {"text": m.text()} for m in u["misses"]]}
            for w, u in unserved(alloc, view.slos, rows).items()}


def _num(x: Any, digits: int = 3) -> str:
    if x is None:
        return "—"
    try:
        f = float(x)
    except (TypeError, ValueError):
        return str(x)
    if f != f:
        return "—"
    if f in (float("inf"), float("-inf")):
        return "∞"
    return f"{f:.{digits}f}"


def _chosen_state(view: CampaignView, cell: Cell, repeat: bool = False, round_no: int | None = None) -> str:
    """How far the last round's chosen cell got: measured, being measured, or cut off
    (``repeat``: another window of a measured cell, asked for in round ``round_no``)."""
    if repeat:
        if any(r.cell == cell and r.round == round_no for r in view.measurements):
            return "last chosen repeat (measured)"
        return "measuring again now" if view.state == "running" else "repeat chosen next, not measured (interrupted)"
    if any(r.cell == cell for r in view.measurements):
        return "last chosen cell (measured)"
    return "measuring now" if view.state == "running" else "chosen next, not measured (interrupted)"


def _allocations_table(view: CampaignView, last: Any) -> Any:
    """The conservative, optimistic (and final) allocations of the last round, per class."""
    from rich.table import Table
    from rich.text import Text

    at = Table(title="Allocations", title_justify="left")
    at.add_column("class", style="bold")
    labels = ["conservative", "optimistic"] + (["final"] if view.result is not None else [])
    for lab in labels:
        at.add_column(lab)
    allocs = {"conservative": last.conservative.allocation, "optimistic": last.optimistic.allocation}
    if view.result is not None:
        allocs["final"] = view.result.get("allocation")
    for w in view.workloads:
        cells = []
        for lab in labels:
            a = allocs[lab]
            if a is None:
                cells.append(Text("infeasible", style="red"))
                continue
            e = a.get(w) or {}
            reps = int(e.get("replicas") or 0)
            cells.append(f"TP{e['tp']}@{e['load']} ×{reps} ({reps * int(e['tp'])} GPUs)" if reps else "none")
        at.add_row(w, *cells)
    objs = []
    for lab in labels:
        sides = {"conservative": last.conservative.objective, "optimistic": last.optimistic.objective}
        obj = sides[lab] if lab != "final" else (view.result or {}).get("objective")
        if not obj or obj.get("feasible") is False:
            objs.append("—")
        else:
            objs.append(f"r={_num(obj.get('min_fulfillment'))}, {_num(obj.get('goodput_rps'), 2)} req/s, {obj.get('gpus_used')} GPUs")
    at.add_row(Text("objective", style="dim"), *objs)
    return at


def _alternatives_table(view: CampaignView) -> Any:
    """result.json's ranked alternatives: rank, fleet, P(ε-optimal), P(SLO met), GPUs, $/h
    (where priced) and the cells each rests on that are only predicted."""
    from rich.table import Table

    rows = view.alternative_rows()
    priced = any(r["usd_per_hour"] for r in rows)
    t = Table(title=view.alternatives_title(), title_justify="left")
    for col, just in (("#", "right"), ("fleet", "left"), ("P(ε-optimal)", "right"), ("P(SLO met)", "right"),
                      ("GPUs", "right"), *((("$/h", "right"),) if priced else ()), ("predicted cells", "left")):
        t.add_column(col, justify=just)
    for r in rows:
        t.add_row(r["rank"], r["fleet"], r["p_epsilon_optimal"], r["p_slo_met"], r["gpus"],
                  *((r["usd_per_hour"],) if priced else ()), r["predicted"])
    return t


def render_status(view: CampaignView, console: Any) -> None:
    """Print the status of ``view`` as rich tables on ``console``."""
    from rich.table import Table
    from rich.text import Text

    status = view.status
    head = Text()
    head.append(view.header.campaign or view.directory.name, style="bold")
    head.append(f"  ({view.directory}, {view.state})\n")
    head.append("status: ")
    head.append(status, style=CERT_STYLE.get(status, "bold"))
    total = view.n_candidates
    head.append(
        f"   cells measured: {len(view.measurements)} / {total if total is not None else '?'}"
        f"   GPU-seconds: {view.gpu_seconds:,.0f}   rounds: {len(view.rounds)}"
        f"   strategy: {view.header.strategy}   seed: {view.header.seed}"
    )
    console.print(head)
    if view.budget_line() is not None:
        console.print(view.budget_line(), highlight=False)
    last = view.last_round
    if last is not None:
        g = last.gap
        console.print(
            f"round {last.round}: [bold]{last.certificate}[/] — {last.reason}",
            highlight=False,
        )
        console.print(
            f"gap: critical {_num(g.get('critical'), 0)}, min fulfillment {_num(g.get('min_fulfillment'))}, "
            f"goodput {_num(g.get('goodput'))}",
            highlight=False,
        )
        j = last.joint
        if j:
            d = j.get("diagnostics") or {}
            console.print(
                f"joint check: P(ε-optimal) {_num(j.get('p_epsilon_optimal'))}, P(SLO met) {_num(j.get('p_slo_met'))}, "
                f"P(infeasible) {_num(j.get('p_infeasible'))}; certifying posterior r_hat_max {_num(d.get('r_hat_max'))}, "
                f"ess_bulk_min {_num(d.get('ess_bulk_min'), 0)}, divergences {d.get('divergences')}",
                highlight=False,
            )
            from fleetsieve_bayes.decision.bounds import attainment_lines

            for line in attainment_lines(j):
                console.print(line, highlight=False)
        nxt = last.chosen
        if nxt is not None:
            rep = bool(getattr(last, "repeat", False))
            console.print(f"{_chosen_state(view, nxt, rep, last.round)}: {nxt.label}", highlight=False)

        console.print(_allocations_table(view, last))
        if view.result is not None:
            from fleetsieve_bayes.reporting.misses import describe_unserved, unserved

            rows = [r.row for r in view.measurements]
            for w, u in unserved(view.result.get("allocation"), view.slos, rows).items():
                console.print(describe_unserved(w, u, view.result), highlight=False)
        if view.alternatives:
            console.print(_alternatives_table(view))

    mt = Table(title="Measured cells", title_justify="left")
    for col, just in (("#", "right"), ("cell", "left"), ("phase", "left"), ("req/s", "right"), ("TTFT p99", "right"), ("compl. p99", "right"), ("success", "right"), ("GPU-s", "right")):
        mt.add_column(col, justify=just, no_wrap=True, min_width=len(col) if just == "right" else None)
    for i, r in enumerate(view.measurements):
        row = r.row
        mt.add_row(
            str(i + 1),
            r.cell.label,
            f"{r.phase} r{r.round}",
            _num(row.get("throughput_rps"), 2),
            _num(row.get("ttft_p99_s"), 2),
            _num(row.get("completion_p99_s"), 1),
            _num(row.get("success_rate"), 3),
            _num(r.gpu_seconds, 0),
        )
    console.print(mt)
    flying = read_in_flight(view.directory)
    if flying:
        what = ", ".join(f"{c['workload']} TP{c['tp']}@{c['load']}" for c in flying)
        console.print(f"in flight ({len(flying)}): {what}", highlight=False)


def main(args: argparse.Namespace) -> int:
    view = load_campaign_dir(args.directory)
    if args.json:
        print(json.dumps(status_json(view), indent=2, default=str, allow_nan=False))
        return 0
    from rich.console import Console

    # Piped output gets a fixed, wide-enough width instead of rich's 80-column default.
    render_status(view, Console(file=sys.stdout, width=None if sys.stdout.isatty() else 120))
    return 0
