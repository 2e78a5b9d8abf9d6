"""Accuracy and cost of the success likelihood's quadrature over a cell's shared departure.

A cell's success windows share its logit departure ``δ_s ~ N(0, a²)``, and each
window is plain or in a burst (``model/success.py``, ``burst_logpdf``). The
model integrates ``δ_s`` out per cell (``_success_node_loglik``): exactly over
which of the cell's highest windows burst, Gauss-Hermite for the rest. This
script draws random cells (2–5 windows; random discrepancy sd ``a``, window sd,
burst probability and drop; some windows in bursts, the whole cell shifted far
from its curve in some cases) and compares the log density with a dense
Riemann sum (200,001 points) for several node counts, then times the jitted
value and gradient of ``_success_loglik`` on a campaign-sized set of windows.

    python benchmarks/success_quadrature.py                  # nodes 7, 9, 15; 300 cells
    python benchmarks/success_quadrature.py --nodes 9 --cases 1000

Prints a markdown table and writes JSON (default
benchmarks/results/success_quadrature.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special, stats

from fleetsieve_bayes.model import joint, success


def _burst_logpdf(x: np.ndarray, sd: float, p: float, drop: float) -> np.ndarray:
    """NumPy twin of ``success.burst_logpdf`` (the reference is independent of JAX)."""
    lam = 1.0 / drop
    core = -0.5 * (x / sd) ** 2 - math.log(sd) - 0.5 * math.log(2 * math.pi)
    burst = math.log(lam) + 0.5 * (lam * sd) ** 2 + lam * x + special.log_ndtr(-x / sd - lam * sd)
    return np.logaddexp(math.log1p(-p) + core, math.log(p) + burst)


def draw_cases(n: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    cases = []
    for _ in range(n):
        k = int(rng.integers(2, 6))
        sd, p, drop = float(rng.uniform(0.05, 0.5)), float(rng.uniform(0.01, 0.3)), float(rng.uniform(0.5, 2.5))
        d = float(rng.normal(0, 2)) + rng.normal(0, sd, k) - np.where(rng.random(k) < 0.3, rng.exponential(drop, k), 0)
        cases.append({"d": d, "a": float(rng.uniform(0.1, 1.5)), "sd": sd, "p": p, "drop": drop})
    return cases


def reference(c: dict[str, Any]) -> float:
    d, a = c["d"], c["a"]
    xs = np.linspace(min(d.min(), 0) - 10 * a - 8, max(d.max(), 0) + 10 * a + 2, 200_001)
    v = _burst_logpdf(d[:, None] - xs[None, :], c["sd"], c["p"], c["drop"]).sum(0) + stats.norm(0, a).logpdf(xs)
    return float(special.logsumexp(v) + math.log(xs[1] - xs[0]))


def quadrature(c: dict[str, Any]) -> float:
    d = c["d"]
    k = d.size
    rank = jnp.asarray(np.argsort(np.argsort(-d, kind="stable")), jnp.int32)
    window = jnp.asarray([[0.01, 0.1, 0.1, c["sd"], c["p"], c["drop"]]])
    terms, _ = success.success_node_loglik(
        jnp.asarray(d), jnp.ones(k, bool), jnp.zeros(k, jnp.int32), rank, 1, jnp.asarray(c["a"]), window
    )
    return float(jax.nn.logsumexp(terms[0]))


def gradient_fn(nodes: int) -> Any:
    """A jitted, already compiled value-and-gradient of ``_success_loglik`` at ``nodes`` Gauss-Hermite
    nodes on 60 cells, 10 of them with 3 windows; called with a float ``i``."""
    rng = np.random.default_rng(0)
    n_cells = 60
    counts = np.where(rng.random(n_cells) < 0.6, 1, 0)
    counts[:10] = 3
    cell = np.repeat(np.arange(n_cells), counts)
    rows = np.column_stack([np.ones((cell.size, 3)), 1 / (1 + np.exp(-rng.normal(3, 1, cell.size)))])
    wr = joint.window_rows(rows, cell, np.ones(n_cells, bool))
    window = jnp.asarray(np.column_stack([
        np.full((n_cells, 3), 0.1), rng.uniform(0.1, 0.5, n_cells), np.full(n_cells, 0.05), np.full(n_cells, 1.5),
    ]))
    y = joint.to_transformed(wr.rows)[:, 3]
    f = jax.jit(jax.value_and_grad(lambda ell, a: success.success_loglik(y - ell[wr.cell], wr, a, window), argnums=(0, 1)))
    ell, a = jnp.full(n_cells, 3.0), jnp.asarray(0.4)
    with gh_nodes(nodes):
        jax.block_until_ready(f(ell, a))  # traced with these nodes
    return lambda i: f(ell + 1e-4 * i, a)


@contextlib.contextmanager
def gh_nodes(k: int) -> Iterator[None]:
    """The model's Gauss-Hermite rule set to ``k`` nodes for the duration."""
    saved = success._GH_NODES, success._GH_LOGW
    x, w = np.polynomial.hermite_e.hermegauss(k)
    success._GH_NODES, success._GH_LOGW = x, np.log(w / math.sqrt(2 * math.pi))
    try:
        yield
    finally:
        success._GH_NODES, success._GH_LOGW = saved


def time_side_by_side(fns: dict[int, Any], repeat: int, blocks: int = 5) -> dict[int, float]:
    """Median microseconds per call of each function, blocks of ``repeat`` calls interleaved."""
    times: dict[int, list[float]] = {k: [] for k in fns}
    for _ in range(blocks):
        for k, f in fns.items():
            t = time.perf_counter()
            for i in range(repeat):
                out = f(float(i))
            jax.block_until_ready(out)
            times[k].append((time.perf_counter() - t) / repeat * 1e6)
    return {k: float(np.median(v)) for k, v in times.items()}


def published_table(payload: dict[str, Any]) -> str:
    lines = [
        f"{payload['cases']} random cells (2–5 windows), log density against a dense Riemann sum; "
        "the gradient time is the jitted value and gradient of the success likelihood on 60 cells, "
        "10 of them with three windows (median of 5 interleaved blocks).",
        "",
        "| nodes | max abs. error (nats) | 95th percentile | mean | value + gradient (µs) | × shipped | shipped |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in payload["results"]:
        lines.append(
            f"| {r['nodes']} | {r['max']:.4f} | {r['p95']:.4f} | {r['mean']:.4f} | {r['grad_us']:.0f} | "
            f"{r['grad_ratio']:.2f} | {'yes' if r['shipped'] else ''} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", default="7,9,15")
    ap.add_argument("--cases", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=1000, help="gradient calls per timed block (5 interleaved blocks per node count)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "success_quadrature.json")
    ap.add_argument("--publish", action="store_true", help="write benchmarks/published/success_quadrature.json, its docs/results.md section and MANIFEST.json")
    args = ap.parse_args(argv)
    cases = draw_cases(args.cases, args.seed)
    want = np.array([reference(c) for c in cases])
    shipped = len(success._GH_NODES)
    nodes = [int(v) for v in args.nodes.split(",")]
    results = []
    for k in nodes:
        with gh_nodes(k):
            err = np.abs(np.array([quadrature(c) for c in cases]) - want)
        results.append({"nodes": k, "max": float(err.max()), "p95": float(np.quantile(err, 0.95)),
                        "mean": float(err.mean()), "shipped": k == shipped})
    us = time_side_by_side({k: gradient_fn(k) for k in nodes}, args.repeat)
    base = us.get(shipped, us[nodes[0]])
    for r in results:
        r["grad_us"], r["grad_ratio"] = us[r["nodes"]], us[r["nodes"]] / base
    print(published_table({"cases": args.cases, "results": results}))
    payload = {"cases": args.cases, "seed": args.seed, "load_average_1min": os.getloadavg()[0], "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    if args.publish:
        sys.path.insert(0, str(Path(__file__).parent))
        from publish import command_line, publish

        publish("success_quadrature", payload, published_table(payload), command_line(__file__, argv))


if __name__ == "__main__":
    main()
