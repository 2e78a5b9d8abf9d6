"""A tiny replay campaign (10 cells, a fast SVI preset, a short certifying NUTS run) that
runs end to end in seconds.

Tests that need a whole campaign — killed, resumed, re-planned, seeded — use
this instead of the shipped 22-cell grid with NUTS.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

GRID = """workload,tp,load,offered_rps,throughput_rps,ttft_p99_s,completion_p99_s,success_rate,duration_s
chat,2,C16,1.6,1.596,0.82,13.9,0.998,300
chat,2,C32,3.2,2.41,2.9,38.5,0.981,300
chat,4,C32,3.2,3.198,0.41,8.7,1.0,300
chat,4,C64,6.4,6.3,0.9,15.0,0.995,300
chat,4,C96,9.6,8.9,1.5,24.0,0.992,300
code,2,C16,1.6,1.59,0.9,12.0,0.998,300
code,2,C32,3.2,3.1,2.0,20.0,0.99,300
code,4,C32,3.2,3.19,0.5,9.0,1.0,300
code,4,C64,6.4,6.2,1.2,14.0,0.996,300
code,4,C96,9.6,8.7,3.0,22.0,0.991,300
"""

PRESET = """method = "svi"
[svi]
guide = "AutoNormal"
optimizer = "adam"
learning_rate = 0.02
steps = 600
warm_steps = 200
draws = 200
"""

# The certifying fit on two chains (the shipped ``certify`` runs four): it still has to
# pass the convergence criteria (r_hat ≤ 1.01, bulk ESS ≥ 400, no divergence), and takes
# about 0.6× the time on this campaign.
CERTIFY_PRESET = """method = "nuts"
[nuts]
chains = 2
chain_method = "parallel"
warmup = 200
samples = 400
target_accept = 0.9
max_tree_depth = 8
dense_mass = true
adaptation = "pooled"
"""


def write_certify_preset(folder: Path) -> str:
    """Write ``tiny-certify.toml`` (:data:`CERTIFY_PRESET`) into ``folder``; return its name,
    for ``[model] certify_inference``."""
    (folder / "tiny-certify.toml").write_text(CERTIFY_PRESET)
    return "tiny-certify.toml"


def write_tiny(
    folder: Path,
    *,
    name: str = "campaign.toml",
    chat_demand: float = 6.0,
    gpus: int = 8,
    measurement_extra: str = "",
    model_extra: str = "",
    family: str = "dense-31b-fp8-h100",
) -> Path:
    """Write grid.csv, tiny-svi.toml and a campaign file into ``folder``; return the campaign path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "grid.csv").write_text(GRID)
    (folder / "tiny-svi.toml").write_text(PRESET)
    write_certify_preset(folder)
    path = folder / name
    path.write_text(
        f"""name = "tiny"
[fleet]
gpus = {gpus}
[model]
family = "{family}"
inference = "tiny-svi.toml"
certify_inference = "tiny-certify.toml"
{model_extra}
[measurement]
backend = "replay"
table = "grid.csv"
{measurement_extra}
[stopping]
epsilon = 0.05
slo_attainment = "point"
[[workloads]]
name = "chat"
demand_rps = {chat_demand}
slo = {{ success_min = 0.99, ttft_p99_s = 2.0, completion_p99_s = 30.0 }}
[[workloads]]
name = "code"
demand_rps = 8.0
slo = {{ success_min = 0.99, ttft_p99_s = 5.0 }}
"""
    )
    return path


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 1800, **kw: object) -> subprocess.CompletedProcess:
    """Run ``fleetsieve-bayes ARGS`` in a fresh Python process. ``timeout`` only guards against a
    hang: a tiny campaign takes seconds alone, minutes on a crowded machine."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "MPLBACKEND": "Agg", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "fleetsieve_bayes", *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        **kw,  # type: ignore[arg-type]
    )
