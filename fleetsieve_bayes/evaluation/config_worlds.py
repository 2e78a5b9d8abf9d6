"""Synthetic worlds of serving configurations: aggregated and disaggregated replicas with a known truth.

A config world is a fully measured table over (class, configuration, load)
cells of one dense model on one GPU type, a campaign over it with a
``[[configs]]`` catalogue, and the noise-free truth of every cell. The truth
comes from a small physical model of an inference engine, deliberately *not*
the package model's parametric form (per-GPU capacity as a parabola in
log2 TP, tails in utilisation), so a benchmark on these worlds does not test
the model against itself.

Catalogue (:func:`enumerate_catalogue`, Dynamo-Spica-like for one dense model):
aggregated configurations ``agg-tp{t}-s{B}`` for ``t ∈ {1, 2, 4, 8}`` and
disaggregated ``xPyD`` ones ``{x}p-tp{tp}+{y}d-tp{td}-s{B}`` (prefill TP in
{1, 2, 4} with 1–3 workers, decode TP in {1, 2, 4, 8} with 1–2 workers,
at most ``max_gpus`` GPUs in all), each with every ``max_num_seqs`` ``B``.

Truth (:func:`true_metrics`), per class (prompt tokens ISL, output tokens OSL)
and engine of TP ``t`` with ``max_num_seqs`` ``B``:

- prefill runs at ``P(t) = P0·t^a·eff(t)`` tokens/s (``a < 1``; ``eff`` falls
  past a communication knee); a decode step at batch ``b`` takes
  ``s(b, t) = s0/t^c + ar·log2(t)·knee + h0 + (kv·ctx/(t·BW) + h1)·b``
  (weights read, all-reduce, step overhead, then the memory-bound KV reads of
  each sequence); the batch is capped by ``B`` and by the KV cache
  (``(t·M·u − W)/kv`` tokens over ``ISL + OSL`` a sequence);
- an **aggregated** replica shares one engine: a request costs it
  ``φ·ISL/P + OSL·(s_base/b_lim + k)`` seconds, the inverse of its capacity,
  with ``φ = 1 − piggyback + interference·ISL/(ISL + 3000)``: a short prompt's
  chunks ride on memory-bound decode steps (``φ < 1``), a long one's stall
  them (``φ > 1``). The batch follows from Little's law; ITL is the step time at
  the batch's upper range (``b + 1.5√b``, capped at ``B``) stretched by the
  engine's prefill share; TTFT is the p99 prompt's prefill plus an M/D/1-like
  p99 wait (service ``φ·ISL/P``) in the replica's utilisation, plus the backlog
  a saturated 300 s window leaves; completion p99 is ``TTFT + tail·OSL·ITL``;
- a **disaggregated** replica (``x`` prefill workers of TP ``tp``, ``y``
  decode workers of TP ``td``): capacity ``min(x·P(tp)/ISL, y/(OSL·(s_base/b_lim
  + k) + ψ·τ_kv + h))·(1 − ℓ)``, where ``τ_kv = ISL·kv/link`` is the KV
  transfer (added to TTFT; the decode engine stalls on a share ``ψ`` of it),
  ``h`` the hand-off's decode-engine time per request and ``ℓ`` a small
  routing loss; TTFT waits for a prefill worker and then for a decode slot;
  no interference, so ITL is lower and steadier;
- served throughput is a smooth minimum of offered and capacity; success falls
  past saturation (timeouts) and tails blow up.

A smaller ``max_num_seqs`` caps the batch, so the replica saturates earlier
(lower capacity) but keeps ITL lower near saturation (the batch's upper range
is cut at ``B``).

Regimes: ``"disagg"`` draws long-prompt classes (summarise, doc-QA, RAG,
code) with tight SLOs (completion 1.4–1.8×, TTFT 3–5× the best cell's), where
disaggregation wins; ``"agg"`` draws short-prompt, decode-heavy classes
(assist, agent, creative; a fourth class is chat) with loose SLOs (TTFT 10–15×, completion 2.5–3.5×
the worst configuration's at its lightest load), where it does not;
``"mixed"`` draws any classes, each tight or loose. Every SLO asks success ≥
0.99. Demands: each class's share (Dirichlet) of the budget at its best
SLO-admissible served rate per GPU, scaled to 85–97 % of the largest scale at
which the exact optimum on the truth still serves every class in full; so the
best fleet fits the budget with little to spare.

Loads: each class has a geometric ladder of offered rates labelled ``C0, C1,
…``; each configuration is measured at ``n_loads`` of them, a step of
1.28–1.36× apart from about 30 % of its replica capacity (every configuration
at nearly the same utilisations), so one label is one offered rate within a
class. Each cell has one window of ``duration_s`` 300: tails carry
multiplicative log-normal noise (sd 0.05–0.1), throughput 1 % (never above the
offered rate), the failure rate 10 %; the noise-free truth sits in
``true_<metric>`` columns (:func:`truth_table` swaps them in).
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from fleetsieve_bayes.configs import Role, ServingConfig, check_catalogue
from fleetsieve_bayes.evaluation.synthetic import (
    TRUE_COLUMNS,
    campaign_toml,
    round_sig,
    truth_table,
)
from fleetsieve_bayes.table import COLUMNS, METRICS

__all__ = [
    "ConfigWorld",
    "CLASS_PROFILES",
    "LONG_PROMPTS",
    "SHORT_PROMPTS",
    "REGIMES",
    "AGG_TPS",
    "PREFILL_TPS",
    "PREFILL_WORKERS",
    "DECODE_TPS",
    "DECODE_WORKERS",
    "enumerate_catalogue",
    "config_name",
    "config_toml",
    "config_world",
    "write_config_world",
    "aggregated_only",
    "true_metrics",
    "true_capacity",
    "truth_table",
    "world_grid",
    "world_problem",
]

# Prompt and output tokens of each class's requests (means; a world jitters them).
CLASS_PROFILES: dict[str, tuple[int, int]] = {
    "summarise": (8000, 200),
    "docqa": (6000, 300),
    "rag": (4000, 250),
    "code": (3000, 150),
    "chat": (1000, 300),
    "assist": (500, 400),
    "agent": (400, 600),
    "creative": (250, 800),
}
LONG_PROMPTS: tuple[str, ...] = ("summarise", "docqa", "rag", "code")
SHORT_PROMPTS: tuple[str, ...] = ("assist", "agent", "creative", "chat")
REGIMES: tuple[str, ...] = ("disagg", "agg", "mixed")

AGG_TPS: tuple[int, ...] = (1, 2, 4, 8)
PREFILL_TPS: tuple[int, ...] = (1, 2, 4)
PREFILL_WORKERS: tuple[int, ...] = (1, 2, 3)
DECODE_TPS: tuple[int, ...] = (1, 2, 4, 8)
DECODE_WORKERS: tuple[int, ...] = (1, 2)

DURATION_S = 300.0
GPU_MEMORY_GB = 80.0
_SAT_K = 10.0  # sharpness of the smooth minimum of offered and capacity
_RHO_CAP = 0.99  # the M/D/1-like wait is evaluated up to this utilisation; past it the window's backlog grows
_LADDER_SUB = 3  # fine ladder points per step of a configuration's loads
_BATCH_Z = 1.5  # the batch a request sees at its tail: mean + z·sqrt(mean), capped by the engine


class ConfigWorld(NamedTuple):
    """One world.

    Attributes:
        table: one row per cell: the docs/contracts.md columns (``tp`` the
            aggregated TP, None for a disaggregated configuration), ``config``
            and the noise-free ``true_<metric>`` columns.
        campaign: the campaign mapping (as ``tomllib`` would parse it), with a
            ``configs`` list of ``[[configs]]`` tables.
        catalogue: the configurations, in catalogue order.
        regime: ``"disagg"``, ``"agg"`` or ``"mixed"``.
        spec: everything drawn (JSON-ready): the engine's physics, each class's
            profile, SLO and demand, the noise; :func:`true_metrics` reads it.
    """

    table: pd.DataFrame
    campaign: dict[str, Any]
    catalogue: tuple[ServingConfig, ...]
    regime: str
    spec: dict[str, Any]


# ----------------------------------------------------------------- catalogue


def config_name(config: ServingConfig | None = None, *, tp: int | None = None, prefill: Role | None = None,
                decode: Role | None = None, max_num_seqs: int | None = None) -> str:
    """``agg-tp4-s256`` or ``2p-tp2+1d-tp4-s256`` (without ``-s…`` when no max_num_seqs)."""
    if config is not None:
        tp, prefill, decode = config.tp, config.prefill, config.decode
        max_num_seqs = config.engine_args.get("max_num_seqs")
    if prefill is not None and decode is not None:
        base = f"{prefill.workers}p-tp{prefill.tp}+{decode.workers}d-tp{decode.tp}"
    else:
        base = f"agg-tp{tp}"
    return base if max_num_seqs is None else f"{base}-s{int(max_num_seqs)}"


def enumerate_catalogue(
    max_gpus: int = 8,
    seqs: tuple[int, ...] = (64, 256),
    *,
    n_configs: int | None = None,
    agg_tps: Sequence[int] = AGG_TPS,
    prefill_tps: Sequence[int] = PREFILL_TPS,
    prefill_workers: Sequence[int] = PREFILL_WORKERS,
    decode_tps: Sequence[int] = DECODE_TPS,
    decode_workers: Sequence[int] = DECODE_WORKERS,
    disaggregated: bool = True,
) -> tuple[ServingConfig, ...]:
    """The configurations of one dense model on nodes of ``max_gpus`` GPUs.

    Aggregated: every TP of ``agg_tps`` with ``tp ≤ max_gpus``, × each of
    ``seqs``. Disaggregated: every prefill (TP, workers) × decode (TP, workers)
    with ``workers·tp`` summed over both roles ``≤ max_gpus``, × each of ``seqs``.
    Order: aggregated first (TP, then max_num_seqs), then disaggregated (prefill
    TP, prefill workers, decode TP, decode workers, then max_num_seqs). With the
    defaults: 4 aggregated layouts and 33 disaggregated ones, 74 configurations.

    ``n_configs``: keep every aggregated configuration and an evenly spaced
    subset of the disaggregated ones (positions ``round(linspace(0, n − 1, m))``),
    ``n_configs`` in all; deterministic.

    Raises:
        ValueError: ``n_configs`` below the aggregated count or above the total.
    """
    seqs = tuple(int(s) for s in seqs)
    if not seqs or any(s < 1 for s in seqs) or len(set(seqs)) != len(seqs):
        raise ValueError(f"seqs must be distinct integers >= 1, got {seqs}")

    def engine(s: int) -> tuple[tuple[str, Any], ...]:
        return (("max_num_seqs", s),)

    agg = [
        ServingConfig(name=config_name(tp=t, max_num_seqs=s), tp=int(t), engine=engine(s))
        for t in sorted(agg_tps) if t <= max_gpus for s in seqs
    ]
    dis: list[ServingConfig] = []
    if disaggregated:
        for tp_p in sorted(prefill_tps):
            for w_p in sorted(prefill_workers):
                for tp_d in sorted(decode_tps):
                    for w_d in sorted(decode_workers):
                        if tp_p * w_p + tp_d * w_d > max_gpus:
                            continue
                        p, d = Role(int(tp_p), int(w_p)), Role(int(tp_d), int(w_d))
                        dis += [ServingConfig(name=config_name(prefill=p, decode=d, max_num_seqs=s), prefill=p,
                                              decode=d, engine=engine(s)) for s in seqs]
    if n_configs is not None:
        n = int(n_configs)
        if not len(agg) <= n <= len(agg) + len(dis):
            raise ValueError(f"n_configs {n}: between {len(agg)} (the aggregated ones) and {len(agg) + len(dis)}")
        m = n - len(agg)
        keep = np.round(np.linspace(0, len(dis) - 1, m)).astype(int) if m else np.array([], int)
        dis = [dis[i] for i in keep]
    out = tuple(agg + dis)
    check_catalogue(out, "enumerate_catalogue")
    return out


def config_toml(config: ServingConfig) -> dict[str, Any]:
    """The ``[[configs]]`` table of a configuration (what ``parse_catalogue`` reads back)."""
    out: dict[str, Any] = {"name": config.name}
    if config.disaggregated:
        assert config.prefill is not None and config.decode is not None
        out["prefill"] = {"tp": config.prefill.tp, "workers": config.prefill.workers}
        out["decode"] = {"tp": config.decode.tp, "workers": config.decode.workers}
    else:
        out["tp"] = int(config.tp)  # type: ignore[arg-type]
    if config.engine:
        out["engine"] = dict(config.engine)
    return out


# --------------------------------------------------------------------- truth


def _draw_engine(rng: np.random.Generator) -> dict[str, float]:
    """The model's and the GPU's physics (one dense ~30B fp8 model on 80 GB GPUs)."""
    return {
        "weights_gb": float(rng.uniform(28.0, 40.0)),
        "kv_gb_per_token": float(rng.uniform(0.8e-4, 1.2e-4)),
        "mem_util": 0.9,
        "prefill_tok_s": float(rng.uniform(5000.0, 7000.0)),  # prompt tokens/s of one GPU (TP1)
        "prefill_exp": float(rng.uniform(0.8, 0.9)),  # a in P0·t^a
        "knee_tp": float(rng.choice([2.0, 4.0])),  # communication knee: efficiency falls past this TP
        "knee_loss": float(rng.uniform(0.15, 0.35)),
        "bw_gb_s": float(rng.uniform(1800.0, 2400.0)),  # effective HBM bandwidth of one GPU
        "weights_exp": float(rng.uniform(0.85, 0.95)),  # c in s0/t^c
        "allreduce_s": float(rng.uniform(0.8e-3, 1.6e-3)),  # per decode step and log2(TP)
        "step_s": float(rng.uniform(3e-3, 5e-3)),  # scheduling and launch overhead per step
        "per_seq_s": float(rng.uniform(1.5e-5, 2.5e-5)),  # sampling etc. per sequence per step
        # φ = 1 − piggyback + interference·ISL/(ISL + 3000): a short prompt's chunks ride on
        # memory-bound decode steps (cheaper than alone), a long one's stall them.
        "piggyback": float(rng.uniform(0.2, 0.3)),
        "interference": float(rng.uniform(0.6, 0.8)),
        "link_gb_s": float(rng.uniform(25.0, 50.0)),  # KV transfer between prefill and decode workers
        "kv_stall": float(rng.uniform(0.3, 0.6)),  # share of a transfer the decode engine stalls on
        "disagg_loss": float(rng.uniform(0.02, 0.04)),  # routing / imbalance loss of a disaggregated replica
        "handoff_s": float(rng.uniform(4e-3, 8e-3)),  # decode-engine time per request of the KV hand-off
        "len_tail": float(rng.uniform(1.5, 2.0)),  # p99 prompt length over the mean
        "queue_tail": float(rng.uniform(3.0, 4.5)),  # p99 wait over the M/D/1 mean
        "completion_tail": float(rng.uniform(1.2, 1.5)),  # p99 of OSL·ITL over its mean
    }


def _prefill_rate(e: dict[str, float], tp: float) -> float:
    """Prompt tokens/s of one engine of ``tp`` GPUs."""
    over = max(0.0, math.log2(tp / e["knee_tp"]))
    return e["prefill_tok_s"] * tp ** e["prefill_exp"] / (1.0 + e["knee_loss"] * over * over)


def _decode_costs(e: dict[str, float], tp: float, ctx: float) -> tuple[float, float]:
    """``(s_base, k)``: a decode step at batch ``b`` takes ``s_base + k·b`` seconds."""
    over = max(0.0, math.log2(tp / e["knee_tp"]))
    s_base = (e["weights_gb"] / e["bw_gb_s"]) / tp ** e["weights_exp"] + e["allreduce_s"] * math.log2(tp) * (
        1.0 + e["knee_loss"] * over) + e["step_s"]
    k = e["kv_gb_per_token"] * ctx / (tp * e["bw_gb_s"]) + e["per_seq_s"]
    return s_base, k


def _batch_limit(e: dict[str, float], tp: float, isl: float, osl: float, max_num_seqs: int) -> float:
    """Sequences one engine runs at once: ``max_num_seqs`` or what its KV cache holds."""
    kv_tokens = (tp * GPU_MEMORY_GB * e["mem_util"] - e["weights_gb"]) / e["kv_gb_per_token"]
    return float(max(1.0, min(float(max_num_seqs), math.floor(kv_tokens / (isl + osl)))))


def _interference(e: dict[str, float], isl: float) -> float:
    """φ: engine seconds of an aggregated prefill per second of a dedicated one."""
    return 1.0 - e["piggyback"] + e["interference"] * isl / (isl + 3000.0)


def _engine_seqs(config: ServingConfig) -> int:
    return int(config.engine_args.get("max_num_seqs", 256))


def _wait(tau: np.ndarray | float, rho: np.ndarray, tail: float) -> np.ndarray:
    """p99 wait of an M/D/1-like queue of service time ``tau`` at utilisation ``rho`` (held at
    :data:`_RHO_CAP` beyond it: the backlog term of :func:`_backlog` takes over)."""
    r = np.minimum(rho, _RHO_CAP)
    return tail * tau * r / (2.0 * (1.0 - r))


def _backlog(rho: np.ndarray) -> np.ndarray:
    """p99 wait of a saturated window: the backlog the last arrivals of a 300 s window find."""
    return DURATION_S * np.maximum(0.0, 1.0 - 1.0 / np.maximum(rho, 1e-9))


def _success(rho: np.ndarray) -> np.ndarray:
    """Share of requests that succeed: about all below saturation, falling past it (timeouts)."""
    soft = 0.03
    fail = 0.0005 + 1.5 * soft * np.logaddexp(0.0, (rho - 1.03) / soft)
    return np.clip(1.0 - fail, 0.0, 1.0)


def _capacity(e: dict[str, float], isl: float, osl: float, config: ServingConfig) -> float:
    b_seqs = _engine_seqs(config)
    ctx = isl + osl / 2.0
    if not config.disaggregated:
        t = float(config.tp)  # type: ignore[arg-type]
        s_base, k = _decode_costs(e, t, ctx)
        b_lim = _batch_limit(e, t, isl, osl, b_seqs)
        return 1.0 / (_interference(e, isl) * isl / _prefill_rate(e, t) + osl * (s_base / b_lim + k))
    assert config.prefill is not None and config.decode is not None
    lam_p = config.prefill.workers * _prefill_rate(e, config.prefill.tp) / isl
    td = float(config.decode.tp)
    s_base, k = _decode_costs(e, td, ctx)
    b_lim = _batch_limit(e, td, isl, osl, b_seqs)
    tau_kv = isl * e["kv_gb_per_token"] / e["link_gb_s"]
    lam_d = config.decode.workers / (osl * (s_base / b_lim + k) + e["kv_stall"] * tau_kv + e["handoff_s"])
    return min(lam_p, lam_d) * (1.0 - e["disagg_loss"])


def _class_profile(spec: dict[str, Any], workload: str) -> tuple[float, float]:
    for c in spec["classes"]:
        if c["name"] == workload:
            return float(c["isl"]), float(c["osl"])
    raise KeyError(f"no class {workload!r} in the world")


def true_capacity(spec: dict[str, Any], workload: str, config: ServingConfig) -> float:
    """Requests/s one replica of ``config`` serves of ``workload`` at saturation (the truth)."""
    isl, osl = _class_profile(spec, workload)
    return _capacity(spec["engine"], isl, osl, config)


def true_metrics(spec: dict[str, Any], workload: str, config: ServingConfig, offered: Any) -> np.ndarray:
    """Noise-free metrics ``(n, 4)`` (METRICS order) of one replica of ``config`` serving
    ``workload`` at offered rates ``offered (n,)`` req/s."""
    e = spec["engine"]
    isl, osl = _class_profile(spec, workload)
    lam = np.asarray(offered, np.float64).reshape(-1)
    cap = _capacity(e, isl, osl, config)
    rho = lam / cap
    thr = (lam ** -_SAT_K + cap ** -_SAT_K) ** (-1.0 / _SAT_K)
    b_seqs = _engine_seqs(config)
    ctx = isl + osl / 2.0
    tail_len, tail_q, tail_c = e["len_tail"], e["queue_tail"], e["completion_tail"]
    if not config.disaggregated:
        t = float(config.tp)  # type: ignore[arg-type]
        phi = _interference(e, isl)
        tau_p = isl / _prefill_rate(e, t)
        s_base, k = _decode_costs(e, t, ctx)
        b_lim = _batch_limit(e, t, isl, osl, b_seqs)
        u_p = np.minimum(thr * phi * tau_p, 0.95)  # share of the engine's time on prefill
        denom = np.maximum(1.0 - thr * (phi * tau_p + osl * k), 1e-9)
        b = np.minimum(thr * osl * s_base / denom, b_lim)
        b_tail = np.minimum(b + _BATCH_Z * np.sqrt(b), b_lim)
        itl = (s_base + k * b_tail) / (1.0 - u_p)
        # A new request waits for the engine's prefill (its queue fills as the replica saturates).
        ttft = tail_len * phi * tau_p * (1.0 + 0.5 * b / b_lim) + _wait(phi * tau_p, rho, tail_q) + _backlog(rho)
    else:
        assert config.prefill is not None and config.decode is not None
        n_p, n_d = config.prefill.workers, config.decode.workers
        tau_p = isl / _prefill_rate(e, config.prefill.tp)
        td = float(config.decode.tp)
        s_base, k = _decode_costs(e, td, ctx)
        b_lim = _batch_limit(e, td, isl, osl, b_seqs)
        tau_kv = isl * e["kv_gb_per_token"] / e["link_gb_s"]
        keep = 1.0 - e["disagg_loss"]
        lam_p = n_p / tau_p * keep
        d_req = osl * (s_base / b_lim + k) + e["kv_stall"] * tau_kv + e["handoff_s"]
        lam_d = n_d / d_req * keep
        per_d = thr / n_d  # requests/s into one decode engine
        stall = np.minimum(per_d * (e["kv_stall"] * tau_kv + e["handoff_s"]), 0.5)
        denom = np.maximum(1.0 - per_d * (osl * k + e["kv_stall"] * tau_kv + e["handoff_s"]), 1e-9)
        b = np.minimum(per_d * osl * s_base / denom, b_lim)
        b_tail = np.minimum(b + _BATCH_Z * np.sqrt(b), b_lim)
        itl = (s_base + k * b_tail) / (1.0 - stall)
        # Waits for a prefill worker, then for a decode slot (one frees every d_req / b_lim seconds).
        wait = _wait(tau_p / n_p, lam / lam_p, tail_q) + _wait(d_req / (b_lim * n_d), lam / lam_d, tail_q)
        ttft = tail_len * tau_p + tau_kv + e["handoff_s"] + wait + _backlog(rho)
    completion = ttft + tail_c * osl * itl
    return np.stack([thr, ttft, completion, _success(rho)], axis=-1)


# -------------------------------------------------------------------- worlds


def _loads(rng: np.random.Generator, caps: np.ndarray, n_loads: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """A class's geometric ladder ``(n_ladder,)`` and, per configuration, the ``n_loads``
    ladder indices it is measured at: every :data:`_LADDER_SUB`-th point from about 30 % of
    its capacity (a step of 1.28–1.36×, so the top load is 1.0–1.4× the capacity). The fine
    ladder puts every configuration's loads at nearly the same utilisations (within ±7 %)."""
    ratio = float(rng.uniform(1.28, 1.36))
    fine = ratio ** (1.0 / _LADDER_SUB)
    lows = 0.3 * np.exp(rng.uniform(-0.03, 0.03, len(caps))) * caps
    start = float(lows.min()) / fine ** float(rng.uniform(0.0, 1.0))
    first = np.round(np.log(lows / start) / math.log(fine)).astype(int)
    picks = [f + _LADDER_SUB * np.arange(n_loads) for f in first]
    n_ladder = int(max(int(p[-1]) for p in picks)) + 1
    ladder = np.array([round_sig(start * fine ** j, 5) for j in range(n_ladder)])
    return ladder, picks


def _slo(rng: np.random.Generator, truth: np.ndarray, first: np.ndarray, tight: bool) -> dict[str, float]:
    """One class's SLO from its cells' truth ``(n_cells, 4)`` (``first``: bool ``(n_cells,)``,
    each configuration's lightest load). Tight: completion 1.4–1.8× and TTFT 3–5× the best
    cell's. Loose: TTFT 10–15× and completion 2.5–3.5× the worst configuration's at its lightest
    load (every configuration meets them at light load)."""
    ok = truth[:, 3] >= 0.99
    if tight:
        ttft = float(truth[ok, 1].min()) * float(rng.uniform(3.0, 5.0))
        comp = float(truth[ok, 2].min()) * float(rng.uniform(1.4, 1.8))
    else:
        ttft = float(truth[first, 1].max()) * float(rng.uniform(10.0, 15.0))
        comp = float(truth[first, 2].max()) * float(rng.uniform(2.5, 3.5))
    # The best cell for completion stays admissible on TTFT too.
    j = int(np.flatnonzero(ok)[np.argmin(truth[ok, 2])])
    ttft = max(ttft, float(truth[j, 1]))
    return {"success_min": 0.99, "ttft_p99_s": _ceil3(ttft), "completion_p99_s": _ceil3(comp)}


def _ceil3(x: float) -> float:
    e = 2 - int(math.floor(math.log10(abs(x))))
    return float(math.ceil(x * 10**e) / 10**e)


def _admissible(truth: np.ndarray, slo: dict[str, float]) -> np.ndarray:
    return ((truth[:, 3] >= slo["success_min"]) & (truth[:, 1] <= slo["ttft_p99_s"])
            & (truth[:, 2] <= slo["completion_p99_s"]) & (truth[:, 0] > 0))


def config_world(
    seed: int,
    n_classes: int = 3,
    n_configs: int = 63,
    n_loads: int = 6,
    regime: str | None = None,
    *,
    gpus: int | None = None,
    max_gpus: int = 8,
    seqs: tuple[int, ...] = (64, 256),
) -> ConfigWorld:
    """World ``seed``: the same arguments always give the same world.

    Args:
        n_classes: 1–4 workload classes.
        n_configs: configurations of :func:`enumerate_catalogue` (every aggregated one kept).
        n_loads: offered rates per (class, configuration).
        regime: ``"disagg"`` (long prompts, tight completion SLOs: disaggregation
            wins), ``"agg"`` (short prompts, loose SLOs: it does not), ``"mixed"``,
            or None: drawn from the three.
        gpus: the fleet's GPU budget (None: drawn from 16, 24, 32, at least 8 a class).
        max_gpus, seqs: the catalogue's GPUs per replica at most and max_num_seqs values.
    """
    rng = np.random.default_rng([int(seed), 20250611])
    if regime is None:
        regime = str(rng.choice(REGIMES))
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {', '.join(REGIMES)} or None, got {regime!r}")
    if not 1 <= n_classes <= 4:
        raise ValueError("n_classes must be 1..4")
    if n_loads < 2:
        raise ValueError("n_loads must be at least 2")
    catalogue = enumerate_catalogue(max_gpus, seqs, n_configs=n_configs)
    engine = _draw_engine(rng)
    # Room for a few replicas of a class's largest configurations.
    budget = int(gpus) if gpus is not None else int(rng.choice([g for g in (16, 24, 32) if g >= 8 * n_classes] or [32]))
    if regime == "disagg":
        names = list(rng.choice(LONG_PROMPTS, n_classes, replace=False))
        tight = [True] * n_classes
    elif regime == "agg":
        names = list(rng.choice(SHORT_PROMPTS[:3], min(n_classes, 3), replace=False))
        names += [SHORT_PROMPTS[3]] * (n_classes - len(names))
        tight = [False] * n_classes
    else:
        names = list(rng.choice(list(CLASS_PROFILES), n_classes, replace=False))
        tight = [bool(rng.random() < 0.5) for _ in range(n_classes)]
    classes = []
    for name in names:
        isl0, osl0 = CLASS_PROFILES[str(name)]
        classes.append({"name": str(name), "isl": round(isl0 * float(np.exp(rng.uniform(-0.15, 0.15)))),
                        "osl": round(osl0 * float(np.exp(rng.uniform(-0.15, 0.15))))})
    noise = {"tail_sd": float(rng.uniform(0.05, 0.1)), "throughput_sd": 0.01, "failure_sd": 0.1}
    spec: dict[str, Any] = {
        "seed": int(seed), "regime": regime, "gpus": budget, "n_configs": len(catalogue), "n_loads": int(n_loads),
        "duration_s": DURATION_S, "engine": engine, "classes": classes, "noise": noise,
    }
    rows: list[dict[str, Any]] = []
    workloads: list[dict[str, Any]] = []
    best: list[float] = []
    for cls, is_tight in zip(classes, tight, strict=True):
        class_rows, slo, best_i = _class_cells(rng, spec, cls["name"], catalogue, n_loads, is_tight)
        cls["tight"] = bool(is_tight)
        cls["slo"] = slo
        workloads.append({"name": cls["name"], "slo": slo})
        best.append(best_i)
        rows.extend(class_rows)
    share = rng.dirichlet(np.full(n_classes, 3.0))
    pressure = float(rng.uniform(0.85, 0.97))
    table = pd.DataFrame(rows, columns=[*COLUMNS, "config", *TRUE_COLUMNS])
    table["tp"] = pd.Series([None if v is None or pd.isna(v) else int(v) for v in table["tp"]], dtype=object)
    base = np.array([budget * float(share[i]) * best[i] for i in range(n_classes)])
    scale = _fitting_scale(table, catalogue, workloads, budget, base)
    for i, w in enumerate(workloads):
        w["demand_rps"] = round_sig(max(pressure * scale * float(base[i]), 1e-3), 4)
        classes[i]["demand_rps"] = w["demand_rps"]
    spec["pressure"] = pressure
    spec["fitting_scale"] = scale
    spec["best_per_gpu"] = best
    campaign = {
        "name": f"config-world-{int(seed)}",
        "fleet": {"gpus": budget},
        "model": {"family": "generic"},
        "measurement": {"backend": "replay", "table": "grid.csv"},
        "stopping": {"epsilon": 0.05, "credible_level": 0.9, "slo_attainment": "point"},
        "workloads": workloads,
        "configs": [config_toml(c) for c in catalogue],
    }
    return ConfigWorld(table, campaign, catalogue, regime, spec)


def _class_cells(rng: np.random.Generator, spec: dict[str, Any], name: str, catalogue: tuple[ServingConfig, ...],
                 n_loads: int, tight: bool) -> tuple[list[dict[str, Any]], dict[str, float], float]:
    """One class's rows (a window and the truth of every (configuration, load) cell), its SLO
    and its best SLO-admissible served rate per GPU on the truth."""
    caps = np.array([true_capacity(spec, name, c) for c in catalogue])
    ladder, picks = _loads(rng, caps, n_loads)
    truths = [true_metrics(spec, name, c, ladder[idx]) for c, idx in zip(catalogue, picks, strict=True)]
    stacked = np.concatenate(truths)
    slo = _slo(rng, stacked, np.tile(np.arange(n_loads) == 0, len(catalogue)), tight)
    per_gpu = stacked[:, 0] / np.repeat([c.gpus for c in catalogue], n_loads)
    best = float(np.max(np.where(_admissible(stacked, slo), per_gpu, 0.0)))
    rows: list[dict[str, Any]] = []
    for c, idx, truth in zip(catalogue, picks, truths, strict=True):
        offered = ladder[idx]
        noisy = _observe(rng, truth, offered, spec["noise"])
        for j, k in enumerate(idx):
            row: dict[str, Any] = {"workload": name, "tp": c.tp, "load": f"C{int(k)}", "offered_rps": float(offered[j])}
            for m_i, m in enumerate(METRICS):
                row[m] = round(float(noisy[j, m_i]), 6)
            row["duration_s"] = DURATION_S
            row["config"] = c.name
            for m_i, m in enumerate(METRICS):
                row[f"true_{m}"] = float(truth[j, m_i])
            rows.append(row)
    return rows, slo, best


def _fitting_scale(table: pd.DataFrame, catalogue: tuple[ServingConfig, ...], workloads: list[dict[str, Any]],
                   budget: int, base: np.ndarray) -> float:
    """The largest ``x`` (within 1 %) at which demands ``x·base (n_classes,)`` are all served by
    the exact optimum on the truth within ``budget`` GPUs (bisection; the served share falls
    with the demand's scale)."""
    from fleetsieve_bayes.allocation.milp import allocate_milp

    world = ConfigWorld(table, {"workloads": [{**w, "demand_rps": 1.0} for w in workloads],
                                "fleet": {"gpus": budget}}, catalogue, "", {})
    grid, values, problem = world_grid(world)

    def fits(x: float) -> bool:
        a = allocate_milp(grid, values, problem._replace(demand=x * base))
        return a.feasible and a.min_fulfillment >= 1.0 - 1e-6

    lo, hi = 0.05, 1.0
    while fits(hi) and hi < 64.0:
        lo, hi = hi, hi * 2.0
    if not fits(lo):
        return lo
    while hi / lo > 1.01:
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def _observe(rng: np.random.Generator, truth: np.ndarray, offered: np.ndarray, noise: dict[str, float]) -> np.ndarray:
    """One window of each cell ``truth (n, 4)``: log-normal tails, a little throughput noise
    (never above the offered rate), a log-normal failure rate."""
    z = rng.standard_normal(truth.shape)
    out = truth.copy()
    out[:, 0] = np.minimum(truth[:, 0] * np.exp(noise["throughput_sd"] * z[:, 0]), offered)
    out[:, 1] = truth[:, 1] * np.exp(noise["tail_sd"] * z[:, 1])
    out[:, 2] = truth[:, 2] * np.exp(noise["tail_sd"] * z[:, 2])
    out[:, 3] = np.clip(1.0 - (1.0 - truth[:, 3]) * np.exp(noise["failure_sd"] * z[:, 3]), 0.0, 1.0)
    return out


def aggregated_only(world: ConfigWorld) -> ConfigWorld:
    """The same world (classes, SLOs, demands, budget, windows) with its aggregated configurations only."""
    keep = tuple(c for c in world.catalogue if not c.disaggregated)
    names = {c.name for c in keep}
    table = world.table[world.table["config"].isin(names)].reset_index(drop=True)
    campaign = {**world.campaign, "name": f"{world.campaign['name']}-agg",
                "configs": [t for t in world.campaign["configs"] if t["name"] in names]}
    spec = {**world.spec, "n_configs": len(keep), "aggregated_only": True}
    return ConfigWorld(table, campaign, keep, world.regime, spec)


def write_config_world(directory: str | Path, world: ConfigWorld) -> Path:
    """Write ``grid.csv`` (the windows, ``config`` and ``true_*`` columns) and ``campaign.toml``
    into ``directory``; returns the campaign's path (``load_campaign`` reads it)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    world.table.to_csv(directory / str(world.campaign["measurement"]["table"]), index=False)
    path = directory / "campaign.toml"
    text = campaign_toml(world.campaign)
    tomllib.loads(text)  # what is written parses
    path.write_text(text, encoding="utf-8")
    return path


def world_grid(world: ConfigWorld, *, truth: bool = True) -> tuple[Any, np.ndarray, Any]:
    """``(grid, values (n_cells, 4), problem)`` of a world: its cells resolved against its
    catalogue, the noise-free truth (``truth``) or the windows, and its allocation problem."""
    from fleetsieve_bayes.allocation.problem import grid_from_table, values_from_table
    from fleetsieve_bayes.configs import resolve_configs
    from fleetsieve_bayes.table import validate_table

    raw = truth_table(world.table) if truth else world.table
    df = resolve_configs(validate_table(raw), world.catalogue, "world")
    names = tuple(w["name"] for w in world.campaign["workloads"])
    grid = grid_from_table(df, names, configs=world.catalogue)
    return grid, values_from_table(grid, df), world_problem(world)


def world_problem(world: ConfigWorld) -> Any:
    """The world's allocation problem (what ``Campaign.problem()`` of its campaign gives)."""
    from fleetsieve_bayes.allocation.problem import AllocationProblem

    ws = world.campaign["workloads"]
    inf = np.inf
    return AllocationProblem(
        demand=np.array([w["demand_rps"] for w in ws], np.float64),
        critical=np.array([bool(w.get("critical", False)) for w in ws]),
        floor=np.array([float(w.get("floor", 1.0)) for w in ws]),
        success_min=np.array([w["slo"]["success_min"] for w in ws], np.float64),
        ttft_max=np.array([w["slo"].get("ttft_p99_s", inf) for w in ws], np.float64),
        completion_max=np.array([w["slo"].get("completion_p99_s", inf) for w in ws], np.float64),
        gpus=int(world.campaign["fleet"]["gpus"]),
    )
