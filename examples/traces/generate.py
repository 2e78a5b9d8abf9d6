"""Generate the SYNTHETIC chat and code traces shipped in this folder.

They are NOT measurements of real traffic: arrival times and token counts are
drawn from fixed distributions chosen to resemble the shape of the public
Azure LLM inference traces (2023) — chat: Poisson arrivals, prompts of about
a thousand tokens and outputs of a few hundred; code: burstier arrivals
(gamma gaps, burstiness 0.5), longer prompts and short outputs. They are
written in the Azure CSV format (``TIMESTAMP,ContextTokens,GeneratedTokens``,
seven fractional digits) so that the real traces can replace them unchanged.

Run from the repository root (deterministic; rewrites the two CSV files):

    python examples/traces/generate.py
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from fleetsieve_bayes.backends.traces import write_azure_trace

HERE = Path(__file__).resolve().parent


def gaps(rng: np.random.Generator, n: int, rate: float, burstiness: float) -> np.ndarray:
    """``(n,)`` inter-arrival gaps: gamma(shape=burstiness) with mean 1/rate (1 = Poisson)."""
    return rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)


def tokens(rng: np.random.Generator, n: int, median: float, sigma: float, lo: int, hi: int) -> np.ndarray:
    """``(n,)`` log-normal token counts clipped to ``[lo, hi]``."""
    return np.clip(np.round(rng.lognormal(np.log(median), sigma, size=n)), lo, hi).astype(np.int64)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=HERE)
    p.add_argument("--seconds", type=float, default=600.0, help="trace length")
    args = p.parse_args()
    specs = {
        # name: (seed, rate req/s, burstiness, prompt median/sigma, output median/sigma)
        "synthetic_chat_azure.csv": (1, 2.0, 1.0, (1000, 0.8), (250, 0.7)),
        "synthetic_code_azure.csv": (2, 2.0, 0.5, (2000, 0.7), (30, 0.8)),
    }
    for name, (seed, rate, burst, (pm, ps), (om, os_)) in specs.items():
        rng = np.random.default_rng(seed)
        n = int(args.seconds * rate * 1.5)
        t = np.cumsum(gaps(rng, n, rate, burst))
        t = t[t < args.seconds]
        n = len(t)
        write_azure_trace(args.out / name, t, tokens(rng, n, pm, ps, 4, 7500), tokens(rng, n, om, os_, 1, 2000))
        print(f"{name}: {n} requests over {args.seconds:g} s")


if __name__ == "__main__":
    main()
