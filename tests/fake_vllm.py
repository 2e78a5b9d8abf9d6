"""A vLLM-backend campaign file against the fake OpenAI server (fleetsieve_bayes.testing)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fleetsieve_bayes.backends.traces import write_azure_trace
from fleetsieve_bayes.campaign.config import Campaign, load_campaign

WARMUP, WINDOW = 0.3, 1.2


def fake_vllm_campaign(tmp_path: Path, command: Sequence[str], *, name: str = "fake", fleet: str = "gpus = 4",
                       gpus: str = "gpus = [0, 1]", loads: str = "{ low = 1.0, high = 3.0 }",
                       family: str = "generic", extra: str = "", stopping: str = "",
                       workloads: tuple[str, ...] = ("chat",)) -> Campaign:
    """Write ``tmp_path/campaign.toml`` (TP [2, 1], a 5 req/s trace of 8 prompt and 10 output
    tokens per workload, a ``WARMUP`` + ``WINDOW`` second window) and load it.

    ``command`` is the server's argument list; ``fleet`` and ``gpus`` the ``[fleet]`` body and
    the ``[measurement] gpus`` line; ``extra`` more ``[measurement]`` lines, ``stopping`` a
    ``[stopping]`` table."""
    (tmp_path / "traces").mkdir(exist_ok=True)
    n = 30
    for w in workloads:  # 5 req/s at scale 1, 8 prompt and 10 output tokens
        write_azure_trace(tmp_path / "traces" / f"{w}.csv", np.arange(n) * 0.2, np.full(n, 8), np.full(n, 10))
    wl = "\n".join(
        f'[[workloads]]\nname = "{w}"\ndemand_rps = 3.0\nslo = {{ success_min = 0.99, ttft_p99_s = 1.0 }}\n'
        for w in workloads
    )
    traces = ", ".join(f'{w} = "traces/{w}.csv"' for w in workloads)
    text = f"""
name = "{name}"
[fleet]
{fleet}
[model]
family = "{family}"
[measurement]
backend = "vllm"
model = "fake-model"
command = {json.dumps(list(command))}
tp = [2, 1]
{gpus}
loads = {loads}
traces = {{ {traces} }}
warmup_s = {WARMUP}
duration_s = {WINDOW}
readiness_timeout_s = 20
request_timeout_s = 5
stop_timeout_s = 5
{extra}
{stopping}
{wl}
"""
    path = tmp_path / "campaign.toml"
    path.write_text(text)
    return load_campaign(path)
