"""A vLLM-backend campaign file against the fake OpenAI server (fleetsieve_bayes.testing).

Every test that runs the vLLM backend on the fake engine writes its campaign
file here, through :func:`write_fake_vllm_campaign` (the path) or
:func:`fake_vllm_campaign` (the loaded campaign).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fleetsieve_bayes.backends.traces import write_azure_trace
from fleetsieve_bayes.campaign.config import Campaign, load_campaign

WARMUP, WINDOW = 0.3, 1.2
SLO = "{ success_min = 0.99, ttft_p99_s = 1.0 }"


def write_fake_vllm_campaign(
    tmp_path: Path, command: Sequence[str], *, name: str = "fake", fleet: str = "gpus = 4",
    gpus: str = "gpus = [0, 1]", tp: Sequence[int] = (2, 1), loads: str = "{ low = 1.0, high = 3.0 }",
    family: str = "generic", model_lines: str = "", served_model: str = "fake-model",
    warmup_s: float = WARMUP, duration_s: float = WINDOW, readiness_timeout_s: float = 20,
    extra: str = "", stopping: str = "", workloads: tuple[str, ...] = ("chat",),
    demand_rps: float = 3.0, slo: str = SLO, critical: bool = False,
    n_requests: int = 30, gap_s: float = 0.2, output_tokens: int = 10,
) -> Path:
    """Write ``tmp_path/campaign.toml`` and its traces; return the file's path.

    Each workload's trace (``traces/<workload>.csv``) is ``n_requests`` arrivals
    ``gap_s`` apart (5 req/s at scale 1 by default), each of 8 prompt and
    ``output_tokens`` output tokens. The window is ``warmup_s`` + ``duration_s``.

    ``command`` is the server's argument list; ``fleet`` and ``gpus`` the
    ``[fleet]`` body and the ``[measurement] gpus`` line; ``model_lines`` more
    ``[model]`` lines; ``served_model`` the ``[measurement] model``; ``extra``
    more ``[measurement]`` lines, ``stopping`` a ``[stopping]`` table (header
    included). Every workload has ``demand_rps``, ``slo`` (a TOML inline
    table) and, with ``critical``, ``critical = true``.
    """
    (tmp_path / "traces").mkdir(exist_ok=True)
    n = n_requests
    for w in workloads:
        write_azure_trace(tmp_path / "traces" / f"{w}.csv", np.arange(n) * gap_s, np.full(n, 8),
                          np.full(n, output_tokens))
    crit = "critical = true\n" if critical else ""
    wl = "\n".join(
        f'[[workloads]]\nname = "{w}"\ndemand_rps = {demand_rps}\n{crit}slo = {slo}\n'
        for w in workloads
    )
    traces = ", ".join(f'{w} = "traces/{w}.csv"' for w in workloads)
    text = f"""
name = "{name}"
[fleet]
{fleet}
[model]
family = "{family}"
{model_lines}
[measurement]
backend = "vllm"
model = "{served_model}"
command = {json.dumps(list(command))}
tp = {json.dumps(list(tp))}
{gpus}
loads = {loads}
traces = {{ {traces} }}
warmup_s = {warmup_s}
duration_s = {duration_s}
readiness_timeout_s = {readiness_timeout_s}
request_timeout_s = 5
stop_timeout_s = 5
{extra}
{stopping}
{wl}
"""
    path = tmp_path / "campaign.toml"
    path.write_text(text)
    return path


def fake_vllm_campaign(tmp_path: Path, command: Sequence[str], **kw: object) -> Campaign:
    """:func:`write_fake_vllm_campaign`, loaded."""
    return load_campaign(write_fake_vllm_campaign(tmp_path, command, **kw))  # type: ignore[arg-type]
