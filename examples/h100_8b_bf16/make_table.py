"""Generate the SYNTHETIC measurement table of the 8B example campaign.

Nothing here was measured on hardware. Ground truth comes from a plausible
curve for an 8B BF16 model on H100 (per-GPU capacity peaks at TP1-2 and falls
with all-reduce cost at higher TP), plus multiplicative noise, with a fixed
seed so the file is reproducible:

    python examples/h100_8b_bf16/make_table.py   # writes grid_synthetic.csv

Curves (u = log2 TP, λ = offered req/s):
  per-GPU capacity κ(u) = K · exp(-b (u - m)^2); replica capacity C = TP · κ
  throughput = (λ^-8 + C^-8)^(-1/8);  ρ = λ / C;  h = log(1 + ρ^2)
  ttft p99 = t0 · 2^(s_t (u - 2)) · exp(2.5 h);  completion p99 likewise
  success  = sigmoid(6.5 - 2.5 h)
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

CLASSES = {
    # name: (K req/s/GPU, knee m in log2 TP, curvature b, ttft0 s, completion0 s)
    "chat": (11.0, 0.6, 0.35, 0.12, 4.0),
    "summarize": (6.0, 0.9, 0.30, 0.35, 9.0),
}
TPS = (1, 2, 4, 8)
LOAD_FRACTIONS = {"L25": 0.25, "L50": 0.5, "L75": 0.75, "L100": 1.0, "L125": 1.25}


DEFAULT_OUT = Path(__file__).with_name("grid_synthetic.csv")


def main(out: Path = DEFAULT_OUT, seed: int = 7) -> None:
    rng = np.random.default_rng(seed)
    rows = []
    for name, (k, m, b, t0, c0) in CLASSES.items():
        # The load ladder is shared by all TPs of a class (as on real grids):
        # fractions of the TP2 replica's capacity.
        ref = 2 * k * math.exp(-b * (1 - m) ** 2)
        for tp in TPS:
            u = math.log2(tp)
            cap = tp * k * math.exp(-b * (u - m) ** 2)
            for label, f in LOAD_FRACTIONS.items():
                lam = round(f * ref * (1 + 0.5 * (tp >= 4)), 2)
                thr = (lam**-8 + cap**-8) ** (-1 / 8)
                h = math.log1p((lam / cap) ** 2)
                ttft = t0 * 2 ** (-0.25 * (u - 2)) * math.exp(2.5 * h)
                comp = c0 * 2 ** (-0.15 * (u - 2)) * math.exp(2.5 * h)
                succ = 1 / (1 + math.exp(-(6.5 - 2.5 * h)))
                rows.append(
                    {
                        "workload": name,
                        "tp": tp,
                        "load": label,
                        "offered_rps": lam,
                        "throughput_rps": round(min(lam, thr * math.exp(rng.normal(0, 0.01))), 3),
                        "ttft_p99_s": round(ttft * math.exp(rng.normal(0, 0.1)), 3),
                        "completion_p99_s": round(comp * math.exp(rng.normal(0, 0.1)), 2),
                        "success_rate": round(min(1.0, succ * math.exp(rng.normal(0, 0.002))), 4),
                        "duration_s": 300,
                    }
                )
    pd.DataFrame(rows).to_csv(out, index=False)
    print(f"wrote {len(rows)} synthetic rows to {out}")


if __name__ == "__main__":
    main()
