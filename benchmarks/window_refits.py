"""Warm refits at an SLO-attainment level: carried across window-row buckets, or restarted there.

At a level, a campaign fits every measurement window. The window rows are padded
to a multiple of ``ROW_BUCKET`` (a new compiled program per bucket), and so are
the rows of repeated cells. A sampler state depends only on the parameter space,
so a round that crosses a bucket can go on from the previous round's step size,
mass matrix and positions ("carry"); it used to rerun the full warm-up
("before"). When a warm refit's draws diverge in more than 2 % of transitions,
"carry" re-tunes the step size alone over ``_RETUNE_STEPS`` transitions before
falling back to a full warm-up; "before" went straight to the full warm-up.

For each fleet of the noisy suite (``noisy_suite_fleet``) the same sequence of
measurements is fitted round by round in both ways, the two arms interleaved
(round r of one, then of the other), so that both see the same machine load:
the initial design, then ``--rounds`` more windows (a seeded random order; every
third one repeats a measured cell, as a campaign at a level does). "before" is
the previous behaviour: its warm start is reused only by the very same
compiled program, and its divergent warm refits rerun the full warm-up. Reported per
arm: the fit seconds summed over the rounds, the rounds that ran a full warm-up
or a step-size re-tune, the divergent share of the last round's draws, and how
far the last round's posterior medians of the four metrics lie from the other
arm's (the largest relative difference over the cells, the scale of Monte Carlo
error of 500 draws).

    python benchmarks/window_refits.py --fleets 0,1,2 --rounds 24

Prints a markdown table and writes JSON (default benchmarks/results/window_refits.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

import fleetsieve_bayes as fsb
from fleetsieve_bayes.evaluation.noisy import noisy_suite_fleet
from fleetsieve_bayes.evaluation.synthetic import write_synthetic
from fleetsieve_bayes.model import inference
from fleetsieve_bayes.round import fit_round, pending_design, repeatable

REPO = Path(__file__).resolve().parent.parent
ARMS = ("before", "carry")


class _Count:
    """Counts, in one arm's round, the fits whose chains ran a full warm-up or a step-size
    re-tune (by the length of the chain runs of ``inference._nuts_chain``)."""

    def __init__(self) -> None:
        self.full = 0
        self.retune = 0

    def install(self) -> None:
        chain = inference._nuts_chain

        def counted(objs: Any, state: Any, data: Any, n_iter: int, keep: int) -> Any:
            if n_iter > keep + inference._RETUNE_STEPS:
                self.full = 1
            elif n_iter > keep:
                self.retune = 1
            return chain(objs, state, data, n_iter, keep)

        inference._nuts_chain = counted


def _next(state: Any, r: int, rng: np.random.Generator) -> tuple[int, bool] | None:
    """Round ``r``'s window: every third a repeat of a repeatable cell (at most 3 windows),
    else a cell never measured, at random; None when neither is left."""
    rep = np.flatnonzero(repeatable(state, 3))
    fresh = np.flatnonzero(~np.asarray(state.measured, bool))
    if (r % 3 == 2 and rep.size) or not fresh.size:
        return (int(rng.choice(rep)), True) if rep.size else None
    return int(rng.choice(fresh)), False


def _strip(post: Any) -> Any:
    """The posterior as a warm start that only the very same compiled program may reuse."""
    if isinstance(post.state, dict):
        return post._replace(state={k: v for k, v in post.state.items() if k != "sampler"})
    return post


def _no_retune(*_: Any, **__: Any) -> tuple[None, Any]:
    """Stands for the step-size re-tune in the "before" arm: reports every transition
    divergent without running, so the fit goes straight to a full warm-up."""
    return None, argparse.Namespace(diverging=np.ones(1))


def bench_fleet(k: int, suite_seed: int, rounds: int, counter: _Count) -> dict[str, Any]:
    _, table, camp = noisy_suite_fleet(suite_seed, k)
    with tempfile.TemporaryDirectory() as tmp:
        campaign = write_synthetic(tmp, table, camp)
        settings = fsb.DecisionSettings.from_campaign(campaign)
        base = fsb.init(campaign, seed=0)
        for i in pending_design(base):
            base = fsb.measure(base, i)
        rng = np.random.default_rng(k)
        states = dict.fromkeys(ARMS, base)
        out = {a: {"fit_s": 0.0, "full": 0, "retune": 0} for a in ARMS}
        last: dict[str, Any] = {}
        n_rounds = 0
        for r in range(rounds + 1):
            step = None if r == 0 else _next(states["carry"], r, rng)
            if r > 0 and step is None:
                break
            n_rounds += 1
            for arm in ARMS:
                st = states[arm]
                if step is not None:
                    st = fsb.measure(st, step[0], repeat=step[1])
                if arm == "before" and st.warm_start is not None:
                    st = st._replace(warm_start=_strip(st.warm_start))
                counter.full = counter.retune = 0
                retune = inference._retuned_chain
                if arm == "before":
                    inference._retuned_chain = _no_retune
                t0 = time.perf_counter()
                try:
                    post = fit_round(st, r, settings)
                finally:
                    inference._retuned_chain = retune
                out[arm]["fit_s"] += time.perf_counter() - t0
                out[arm]["full"] += counter.full
                out[arm]["retune"] += counter.retune
                states[arm] = st._replace(warm_start=post)
                last[arm] = post
        for arm in ARMS:
            out[arm]["divergent"] = float(np.mean(last[arm].idata.sample_stats["diverging"]))
        med = {a: np.median(last[a].latent, axis=0) for a in ARMS}
        rel = np.abs(np.log(np.maximum(med["carry"], 1e-9) / np.maximum(med["before"], 1e-9)))
        rows = int(np.asarray(last["carry"].windows.rows).shape[0])
    return {"fleet": f"n{k:03d}", "cells": int(base.grid.n_cells), "rounds": n_rounds,
            "windows": len(states["carry"].records), "padded_rows": rows, "arms": out,
            "max_median_log_ratio": float(np.nanmax(rel))}


def published_table(res: dict[str, Any]) -> str:
    """The markdown table of a run's JSON ``res`` and the summed ratio."""
    lines = [
        "| fleet | cells | rounds | windows | fit s before | fit s carry | carry / before | "
        "rounds with a full warm-up, before / carry | rounds re-tuned (carry) | largest log ratio of posterior medians |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for f in res["fleets"]:
        a, b = f["arms"]["before"], f["arms"]["carry"]
        lines.append(f"| {f['fleet']} | {f['cells']} | {f['rounds']} | {f['windows']} | {a['fit_s']:.0f} | "
                     f"{b['fit_s']:.0f} | {b['fit_s'] / a['fit_s']:.2f} | {a['full']} / {b['full']} | "
                     f"{b['retune']} | {f['max_median_log_ratio']:.3f} |")
    ta = sum(f["arms"]["before"]["fit_s"] for f in res["fleets"])
    tb = sum(f["arms"]["carry"]["fit_s"] for f in res["fleets"])
    lines.append("")
    lines.append(f"Summed over {len(res['fleets'])} fleets: carry / before = {tb / ta:.2f} "
                 f"({tb:.0f} s against {ta:.0f} s of fitting).")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fleets", default="0,1,2", help="noisy suite fleet numbers, comma-separated")
    ap.add_argument("--suite-seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=24, help="windows measured after the initial design")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "window_refits.json")
    ap.add_argument("--publish", action="store_true", help="write benchmarks/published/window_refits.json, its docs/results.md section and MANIFEST.json")
    args = ap.parse_args()
    counter = _Count()
    counter.install()
    fleets = []
    for k in (int(x) for x in args.fleets.split(",")):
        f = bench_fleet(k, args.suite_seed, args.rounds, counter)
        fleets.append(f)
        print(f"{f['fleet']}: before {f['arms']['before']['fit_s']:.0f} s, carry {f['arms']['carry']['fit_s']:.0f} s",
              flush=True)
    res = {"machine": platform.platform(), "cpus": os.cpu_count(), "rounds": args.rounds, "fleets": fleets}
    md = published_table(res)
    print("\n" + md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out}")
    if args.publish:
        from publish import command_line, publish

        publish("window_refits", res, md, command_line(__file__))


if __name__ == "__main__":
    main()
