"""Derive a prior card from a model's architecture and a GPU's public specs.

The arithmetic is a roofline of one vLLM replica at each tensor-parallel
degree ``t`` (per GPU, in bytes, FLOPs and seconds):

* **memory** — weights ``W/t`` (embeddings stay BF16 in an FP8 checkpoint),
  activations of one ``MAX_BATCHED_TOKENS`` step, a fixed runtime reserve, and
  what is left of ``gpu_memory_utilization × memory`` is KV cache. KV bytes per
  token per GPU = ``2 · layers · max(1, kv_heads / t) · head_dim · kv_bytes``
  (vLLM replicates KV heads when ``t`` exceeds their number). A TP is
  *feasible* when the cache holds ``min_concurrency`` typical requests
  (prompt + output tokens); otherwise the memory guard skips it at zero cost.
* **decode** (bandwidth-bound) at the batch the KV cache allows,
  ``B = min(MAX_NUM_SEQS, KV tokens / (prompt + output/2))``: one step reads the
  touched weights (a mixture-of-experts batch touches
  ``E (1 - (1 - k/E)^B)`` of its ``E`` experts: the active ones at batch 1, all
  of them at large batches) and the batch's KV cache, computes
  ``2 · active params`` FLOPs per token, and adds two all-reduces per layer
  (latency + ring bandwidth, zero at TP1) and a fixed per-step overhead.
* **prefill** (compute-bound): ``2 · active params`` FLOPs per prompt token at
  the attainable fraction of the dense peak, plus its all-reduce bytes.
* **capacity** of a replica (req/s) = 1 / (prefill time of a typical prompt +
  output tokens × decode step / B) — prefill and decode take turns (the
  pessimistic *sum* of the Floor First account); per-GPU capacity = that / t.
  A least-squares parabola of log per-GPU capacity over log2(TP) gives the
  card's level (``capacity.per_gpu_at_knee``), knee (``knee.tp``) and
  ``curvature.median``.
  The knee stays within half a TP step of the grid, and never below the
  smallest feasible TP when a smaller one cannot hold the model.
* **roles** (the ``[roles]`` section, :mod:`fleetsieve_bayes.model.roles`) —
  at each feasible TP the prefill share of a typical request is
  ``φ_t = prefill / (prefill + output tokens × decode step / B)``, the prefill
  part of the capacity's turns; ``prefill_share_logit_mean`` is the mean of
  ``logit φ_t`` over the feasible TPs. The KV transfer's cost is what sending a
  prompt's KV cache adds to its prefill, ``κ_t = log(1 + prompt tokens × KV
  bytes per token per GPU / (link_efficiency × the GPU's link) / prefill)``
  (each GPU of the prefill engine sends its own shard, over the same link as
  the all-reduces); ``kv_cost_median`` is their geometric mean. The decode
  gain, the tail offsets of disaggregation and the engine coefficients are
  engine behaviour the roofline has no term for: the ``generic`` card's values.
* **tails** — TTFT p99 ∝ prefill of a p99 prompt + one decode step;
  completion p99 ≈ TTFT + (∝) p99 output tokens × the decode step at the
  reference load (half the KV-limited batch), with calibrated factors
  (``ttft_factor``, ``completion_factor``: queueing behind other prompts and
  chunked prefill are not in the arithmetic); their slopes over log2(TP) come
  from the same per-TP numbers.

How far the roofline is from real serving is not pretended away: the peaks
are scaled by attainable fractions (:data:`ATTAINABLE`), the capacity by a
serving efficiency, and the prior widths (:data:`WIDTHS`) are chosen so that
the derived cards' 90 % prior-predictive intervals cover the measured
capacity of the shipped H100 grid (dense ~31B FP8) and of the 8B example
(``tests/test_derive.py``). Those fractions were calibrated on exactly those
two grids, so the coverage there is in-sample; the widths are what protects
a new family.

Everything the card does not derive (saturation sharpness, utilisation
exponent, blow-up amplitudes, load elasticities, success, noise) is engine
behaviour: it takes the values the shipped hand-written vLLM cards agree on.
"""

from __future__ import annotations

import difflib
import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.model.priors import ROLE_DEFAULTS
from fleetsieve_bayes.resources import data_dir, legacy_path

__all__ = [
    "GpuSpec",
    "Architecture",
    "Workload",
    "TpRoofline",
    "Derivation",
    "load_gpus",
    "gpu_spec",
    "architecture_from_config",
    "architecture_from_fields",
    "load_architecture",
    "list_architectures",
    "roofline",
    "derive",
    "render_card",
    "DTYPE_BYTES",
    "ATTAINABLE",
    "WIDTHS",
]

# Bytes per weight / per KV element.
DTYPE_BYTES: dict[str, float] = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}

# Fractions of the datasheet peaks a serving engine attains, and the
# engine's fixed costs. `serving_efficiency` is real saturation capacity over
# the roofline capacity (scheduler, imperfect overlap, preemption): about the
# geometric mean of measured / roofline capacity over the saturated cells of
# the two shipped grids (whose spread, 0.2-1.3, sets capacity.log_sd).
ATTAINABLE: dict[str, float] = {
    "prefill_mfu": 0.5,  # fraction of dense tensor-core peak in prefill GEMMs
    "decode_mbu": 0.7,  # fraction of HBM bandwidth in a decode step
    "link_efficiency": 0.7,  # fraction of one direction of NVLink/PCIe an all-reduce moves
    "allreduce_latency_s": 12e-6,  # per all-reduce and per log2(TP) hop
    "step_overhead_s": 2.5e-3,  # scheduler, sampling, launch, per engine step
    "layer_overhead_s": 25e-6,  # per layer per step (kernel launches that do not shrink with TP)
    "serving_efficiency": 0.6,
    "ttft_factor": 4.0,  # p99 TTFT at the reference load over the prefill+step arithmetic
    "completion_factor": 0.6,  # p99 completion over TTFT + p99 output x step at the reference load
}
# Prior widths: how far the roofline is from measured reality (natural-log sds
# unless named otherwise). See docs/method.md, "Prior cards".
WIDTHS: dict[str, float] = {
    "capacity_log_sd": 0.6,
    "capacity_class_sd": 0.4,
    "knee_logit_sd": 0.9,
    "knee_class_sd": 0.4,
    "curvature_log_sd": 0.9,
    "curvature_class_sd": 0.4,
    "tail_base_log_sd": 0.9,
    "tail_class_sd": 0.5,
    "tail_slope_sd": 0.4,
    # A class's prompt and output lengths move its prefill share from the mean request's.
    "prefill_share_logit_sd": 1.0,
    # A transfer between nodes runs over a network several times slower than NVLink; one
    # overlapped with the prefill layer by layer costs less.
    "kv_cost_log_sd": 1.2,
}
# vLLM defaults the arithmetic assumes.
MAX_NUM_SEQS = 256
MAX_BATCHED_TOKENS = 8192
RUNTIME_RESERVE_GB = 2.0  # CUDA context, CUDA graphs, sampler buffers
TP_RESERVE_GB = 0.5  # NCCL / custom all-reduce buffers when t > 1
TOKEN_P99_OVER_MEAN = 4.0  # p99 / mean of prompt and output lengths (Azure-like traces: 3-4.5)
REFERENCE_BATCH_FRACTION = 0.5  # the reference load sits near half of saturation
# Curvature floor: a roofline that is flat or convex over the TPs still gets a
# (weak) interior knee; the model's curvature is log-normal, so it must be > 0.
CURVATURE_FLOOR = 0.05
# Engine-level hyperpriors shared by the shipped hand-written vLLM cards.
ENGINE_DEFAULTS: dict[str, dict[str, float]] = {
    "saturation": {"sharpness_median": 10.0, "sharpness_log_sd": 0.5},
    "utilisation": {"exponent_median": 2.0, "exponent_log_sd": 0.3},
    "success": {
        "logit_base_mean": 6.5,
        "logit_base_sd": 1.0,
        "class_sd": 0.5,
        "drop_median": 2.5,
        "drop_log_sd": 0.6,
        "drop_class_sd": 0.3,
    },
    "noise": {"throughput": 0.03, "ttft": 0.25, "completion": 0.2, "success": 0.8},
}
TAIL_ENGINE: dict[str, float] = {
    "blowup_median": 0.8,
    "blowup_log_sd": 0.5,
    "blowup_class_sd": 0.3,
    "load_elasticity_mean": 0.3,
    "load_elasticity_sd": 0.3,
    "load_elasticity_class_sd": 0.15,
}


# --- GPUs -----------------------------------------------------------------------


class GpuSpec(NamedTuple):
    """One row of ``fleetsieve_bayes/data/priors/hardware/gpus.toml`` (public datasheet numbers)."""

    name: str
    description: str
    memory_gb: float
    hbm_bandwidth_tb_s: float
    bf16_dense_tflops: float
    fp8_dense_tflops: float | None  # None: no FP8 tensor cores
    nvlink_gb_s: float | None  # None: PCIe only
    pcie_gb_s: float

    def peak_flops(self, dtype: str) -> float:
        """Dense tensor-core FLOP/s for weights of ``dtype`` (FP8 without FP8 cores: BF16 rate)."""
        if dtype == "fp8" and self.fp8_dense_tflops is not None:
            return self.fp8_dense_tflops * 1e12
        return self.bf16_dense_tflops * 1e12

    def link_bytes_s(self) -> float:
        """One direction of the GPU's interconnect, bytes/s."""
        both = self.nvlink_gb_s if self.nvlink_gb_s is not None else self.pcie_gb_s
        return both * 1e9 / 2.0


_GPU_KEYS = {
    "description": str,
    "memory_gb": float,
    "hbm_bandwidth_tb_s": float,
    "bf16_dense_tflops": float,
    "fp8_dense_tflops": float,
    "nvlink_gb_s": float,
    "pcie_gb_s": float,
}
_GPU_REQUIRED = ("memory_gb", "hbm_bandwidth_tb_s", "bf16_dense_tflops", "pcie_gb_s")


def gpu_table_path() -> Path:
    return data_dir("priors") / "hardware" / "gpus.toml"


def load_gpus(path: str | Path | None = None) -> dict[str, GpuSpec]:
    """All GPUs of the shipped spec table (or of ``path``), by name.

    Raises:
        InputError: unreadable table, unknown or missing key, non-positive number.
    """
    p = Path(path) if path is not None else gpu_table_path()
    try:
        raw = tomllib.loads(p.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise InputError(f"{p}: cannot read the GPU table: {exc}") from None
    out = {}
    for name, row in raw.items():
        if not isinstance(row, dict):
            raise InputError(f"{p}: [{name}] must be a table")
        for key, value in row.items():
            if key not in _GPU_KEYS:
                raise InputError(f"{p}: [{name}] unknown key {key!r}; allowed: {', '.join(_GPU_KEYS)}")
            if _GPU_KEYS[key] is float and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
            ):
                raise InputError(f"{p}: [{name}] {key} must be a positive number, got {value!r}")
        for key in _GPU_REQUIRED:
            if key not in row:
                raise InputError(f"{p}: [{name}] missing {key!r}")
        out[name] = GpuSpec(
            name=name,
            description=str(row.get("description", name)),
            memory_gb=float(row["memory_gb"]),
            hbm_bandwidth_tb_s=float(row["hbm_bandwidth_tb_s"]),
            bf16_dense_tflops=float(row["bf16_dense_tflops"]),
            fp8_dense_tflops=float(row["fp8_dense_tflops"]) if "fp8_dense_tflops" in row else None,
            nvlink_gb_s=float(row["nvlink_gb_s"]) if "nvlink_gb_s" in row else None,
            pcie_gb_s=float(row["pcie_gb_s"]),
        )
    return out


def gpu_spec(name: str) -> GpuSpec:
    """The shipped spec of GPU ``name``.

    Raises:
        InputError: unknown GPU (with a did-you-mean and the known names).
    """
    gpus = load_gpus()
    if name in gpus:
        return gpus[name]
    # "h100" or "H100-SXM" should point at "h100-sxm-80gb".
    close = [n for n in sorted(gpus) if name.lower() in n] or difflib.get_close_matches(
        name.lower(), list(gpus), n=1, cutoff=0.5
    )
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise InputError(f"unknown GPU {name!r}{hint}; known GPUs: {', '.join(sorted(gpus))}")


# --- architectures ----------------------------------------------------------------


class Architecture(NamedTuple):
    """What the roofline needs of a decoder. Parameter counts are in units (not billions)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int  # 1 = dense
    active_experts: int
    params_total: float
    params_active: float  # per token
    tied_embeddings: bool

    @property
    def embedding_params(self) -> float:
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2)

    def attention_params_per_layer(self) -> float:
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        return 2 * q + kv  # q and o projections, k and v projections


# Hugging Face config.json keys → field; the first key present wins.
_HF_KEYS: dict[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv"),
    "head_dim": ("head_dim",),
    "vocab": ("vocab_size",),
    "intermediate": ("intermediate_size", "ffn_hidden_size"),
    "moe_intermediate": ("moe_intermediate_size",),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "active_experts": ("num_experts_per_tok", "moe_topk", "top_k"),
    "parameters": ("num_parameters", "parameters"),
    "tied": ("tie_word_embeddings",),
}
# Flag spelling of each field (for error messages).
FLAG_NAMES: dict[str, str] = {
    "layers": "--layers",
    "hidden": "--hidden-size",
    "heads": "--heads",
    "kv_heads": "--kv-heads",
    "head_dim": "--head-dim",
    "vocab": "--vocab",
    "intermediate": "--intermediate-size",
    "experts": "--experts",
    "active_experts": "--active-experts",
    "parameters": "--parameters",
}


def architecture_from_config(raw: Mapping[str, Any], source: str) -> Architecture:
    """An :class:`Architecture` from a Hugging Face ``config.json`` mapping.

    Multimodal configs with a ``text_config`` use that. ``num_key_value_heads``
    defaults to the attention heads (as in transformers), ``head_dim`` to
    ``hidden / heads``. The parameter count comes from ``intermediate_size``
    (gated MLP, three matrices) or from an explicit ``num_parameters``.

    Raises:
        InputError: a missing or malformed field, naming ``source`` and the key.
    """
    if not isinstance(raw, Mapping):
        raise InputError(f"{source}: an architecture config must be a JSON object")
    if isinstance(raw.get("text_config"), Mapping):
        raw = {**raw, **raw["text_config"]}
    fields: dict[str, Any] = {}
    for field, keys in _HF_KEYS.items():
        for key in keys:
            if key in raw and raw[key] is not None:
                fields[field] = raw[key]
                break
    name = str(raw.get("_name_or_path") or raw.get("model_type") or Path(source).stem)
    return architecture_from_fields(fields, source=source, name=name, key_names=_HF_KEYS)


def architecture_from_fields(
    fields: Mapping[str, Any],
    *,
    source: str,
    name: str,
    key_names: Mapping[str, Sequence[str]] | None = None,
) -> Architecture:
    """Validate architecture fields (``layers``, ``hidden``, ``heads``, ``kv_heads``,
    ``head_dim``, ``vocab``, ``intermediate``, ``experts``, ``active_experts``,
    ``parameters`` — a count, or billions when < 10,000 — and ``tied``).

    Raises:
        InputError: ``"<source>: incomplete architecture: missing <key>"`` and the like.
    """

    def label(field: str) -> str:
        if key_names is not None:
            return repr(key_names[field][0])
        return FLAG_NAMES.get(field, field)

    def integer(field: str, default: int | None = None) -> int:
        v = fields.get(field)
        if v is None:
            if default is not None:
                return default
            raise InputError(f"{source}: incomplete architecture: missing {label(field)}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v) or v < 1:
            raise InputError(f"{source}: {label(field)} must be a positive integer, got {v!r}")
        return int(v)

    layers = integer("layers")
    hidden = integer("hidden")
    heads = integer("heads")
    kv_heads = integer("kv_heads", heads)
    head_dim = integer("head_dim", hidden // heads if hidden % heads == 0 else None)
    vocab = integer("vocab")
    experts = integer("experts", 1)
    active = integer("active_experts", 1 if experts == 1 else 2)
    if active > experts:
        raise InputError(
            f"{source}: {label('active_experts')} ({active}) exceeds {label('experts')} ({experts})"
        )
    if heads % kv_heads:
        raise InputError(f"{source}: {label('heads')} ({heads}) is not a multiple of {label('kv_heads')} ({kv_heads})")
    tied = bool(fields.get("tied", False))
    base = Architecture(name, layers, hidden, heads, kv_heads, head_dim, vocab, experts, active, 0.0, 0.0, tied)
    router = hidden * experts if experts > 1 else 0
    shared = base.embedding_params + layers * (base.attention_params_per_layer() + router)
    inter = fields.get("moe_intermediate") if experts > 1 and fields.get("moe_intermediate") else fields.get("intermediate")
    params = fields.get("parameters")
    if params is not None:
        if isinstance(params, bool) or not isinstance(params, (int, float)) or not params > 0:
            raise InputError(f"{source}: {label('parameters')} must be a positive number, got {params!r}")
        total = float(params) * (1e9 if params < 1e4 else 1.0)
        expert_params = total - shared
        if expert_params <= 0:
            raise InputError(
                f"{source}: {label('parameters')} = {total / 1e9:.2f}B is smaller than the attention and "
                f"embedding weights alone ({shared / 1e9:.2f}B)"
            )
    elif inter is not None:
        if isinstance(inter, bool) or not isinstance(inter, (int, float)) or not inter > 0:
            raise InputError(f"{source}: {label('intermediate')} must be a positive number, got {inter!r}")
        expert_params = layers * experts * 3.0 * hidden * float(inter)
        total = shared + expert_params
    else:
        raise InputError(
            f"{source}: incomplete architecture: missing {label('intermediate')} "
            f"(or the parameter count, {label('parameters')})"
        )
    activ = total - expert_params * (1.0 - active / experts)
    return base._replace(params_total=total, params_active=activ)


def list_architectures() -> list[str]:
    """Names (file stems) of the shipped architecture configs."""
    return sorted(p.stem for p in (data_dir("priors") / "architectures").glob("*.json"))


def load_architecture(name_or_path: str | Path) -> Architecture:
    """A config.json by path, or a shipped architecture by name (``fleetsieve_bayes/data/priors/architectures/``).

    Raises:
        InputError: not found (did-you-mean), not JSON, incomplete.
    """
    s = str(name_or_path)
    p = legacy_path(s) or Path(s)
    if not p.is_file():
        shipped = data_dir("priors") / "architectures" / f"{s}.json"
        if shipped.is_file():
            p = shipped
        else:
            names = list_architectures()
            close = difflib.get_close_matches(s, names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise InputError(f"{s}: architecture config not found{hint}; shipped: {', '.join(names)}")
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{p}: cannot read architecture config: {exc}") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{p}: not valid JSON: {exc}") from None
    arch = architecture_from_config(raw, str(p))
    return arch._replace(name=p.stem if arch.name in ("", p.stem) or p.parent.name == "architectures" else arch.name)


# --- the roofline -----------------------------------------------------------------


class Workload(NamedTuple):
    """Mean tokens of a typical request."""

    prompt_tokens: float
    output_tokens: float


DEFAULT_WORKLOAD = Workload(1000.0, 250.0)


class TpRoofline(NamedTuple):
    """The arithmetic at one TP (per GPU unless named otherwise)."""

    tp: int
    feasible: bool
    why: str  # why not feasible ('' when feasible)
    weights_gb: float
    activations_gb: float
    kv_cache_gb: float
    kv_tokens: float  # tokens the replica's cache holds
    batch: float  # KV-limited decode batch (0 when infeasible)
    prefill_s: float  # one typical prompt
    step_s: float  # decode step at the KV-limited batch
    allreduce_s: float  # of that step
    capacity_rps: float  # replica saturation capacity, after serving efficiency
    per_gpu_rps: float
    ttft_s: float  # p99 at the reference load
    completion_s: float  # p99 at the reference load


def _weight_bytes(arch: Architecture, dtype: str) -> float:
    """Weights in bytes: FP8 checkpoints keep embeddings and the LM head in BF16."""
    emb = arch.embedding_params
    return (arch.params_total - emb) * DTYPE_BYTES[dtype] + emb * DTYPE_BYTES["bf16"]


def roofline(
    arch: Architecture,
    gpu: GpuSpec,
    *,
    dtype: str,
    kv_dtype: str,
    workload: Workload,
    tps: Sequence[int],
    gpu_memory_utilization: float = 0.9,
    min_concurrency: int = 8,
) -> list[TpRoofline]:
    """The per-TP roofline rows (see the module docstring for the equations)."""
    a = ATTAINABLE
    n_in, n_out = float(workload.prompt_tokens), float(workload.output_tokens)
    ctx = n_in + n_out / 2.0  # mean context of a decoding request
    w_bytes = _weight_bytes(arch, dtype)
    # Compute: an input-embedding lookup is free; the LM head is a GEMM.
    flop_params = arch.params_active - (0 if arch.tied_embeddings else arch.vocab * arch.hidden)
    peak = gpu.peak_flops(dtype) * a["prefill_mfu"]
    hbm = gpu.hbm_bandwidth_tb_s * 1e12 * a["decode_mbu"]
    link = gpu.link_bytes_s() * a["link_efficiency"]
    act_bytes = DTYPE_BYTES["bf16"]
    rows = []
    for t in tps:
        kv_token = _kv_token_bytes(arch, kv_dtype, t)
        weights = w_bytes / t
        inter_active = 3.0 * arch.active_experts * _intermediate(arch) / t
        activations = MAX_BATCHED_TOKENS * act_bytes * (4.0 * arch.hidden + inter_active)
        reserve = (RUNTIME_RESERVE_GB + (TP_RESERVE_GB if t > 1 else 0.0)) * 1e9
        kv_bytes = gpu.memory_gb * 1e9 * gpu_memory_utilization - weights - activations - reserve
        kv_tokens = max(kv_bytes, 0.0) / kv_token
        need = min_concurrency * (n_in + n_out)
        feasible = kv_tokens >= need
        why = ""
        if not feasible:
            why = (
                f"TP{t}: weights {weights / 1e9:.1f} GB + activations {activations / 1e9:.1f} GB + "
                f"reserve {reserve / 1e9:.1f} GB leave {max(kv_bytes, 0) / 1e9:.1f} GB of KV cache "
                f"= {kv_tokens:,.0f} tokens < {min_concurrency} requests x {n_in + n_out:.0f} tokens "
                f"(of {gpu_memory_utilization:g} x {gpu.memory_gb:g} GB)"
            )
        batch = min(float(MAX_NUM_SEQS), kv_tokens / (n_in + n_out / 2.0)) if feasible else 0.0

        def allreduce(tokens: float, t: int = t) -> float:
            if t == 1:
                return 0.0
            hops = math.log2(t)
            per = a["allreduce_latency_s"] * hops + 2.0 * (t - 1) / t * tokens * arch.hidden * act_bytes / link
            return 2.0 * arch.layers * per

        def step(b: float, t: int = t, kv_token: float = kv_token) -> tuple[float, float]:
            """(decode step seconds, its all-reduce seconds) at batch b."""
            if arch.experts > 1:
                # A batch of b tokens routes to E (1 - (1 - k/E)^b) distinct experts.
                touched = arch.experts * (1.0 - (1.0 - arch.active_experts / arch.experts) ** max(b, 1.0))
                moe = expert_bytes_moe(arch, dtype)
                w_read = (w_bytes - moe) + moe * touched / arch.experts
            else:
                w_read = w_bytes
            mem = (w_read / t + b * ctx * kv_token) / hbm
            flops = b * (2.0 * flop_params + 4.0 * arch.layers * ctx * arch.heads * arch.head_dim) / t
            ar = allreduce(b)
            fixed = a["step_overhead_s"] + arch.layers * a["layer_overhead_s"]
            return max(mem, flops / peak) + ar + fixed, ar

        prefill_flops = n_in * 2.0 * flop_params + 2.0 * arch.layers * n_in * n_in * arch.heads * arch.head_dim
        prefill = prefill_flops / (t * peak) + allreduce(n_in)
        if feasible:
            s_full, ar_full = step(batch)
            per_request = prefill + n_out * s_full / batch
            capacity = a["serving_efficiency"] / per_request
            b_ref = max(1.0, REFERENCE_BATCH_FRACTION * batch)
            s_ref, _ = step(b_ref)
            p99_prompt = TOKEN_P99_OVER_MEAN * n_in
            pre99 = (2.0 * p99_prompt * flop_params) / (t * peak) + allreduce(p99_prompt)
            ttft = a["ttft_factor"] * (pre99 + s_ref)
            completion = ttft + a["completion_factor"] * TOKEN_P99_OVER_MEAN * n_out * s_ref
        else:
            s_full = ar_full = per_request = capacity = ttft = completion = 0.0
        rows.append(
            TpRoofline(
                tp=int(t),
                feasible=bool(feasible),
                why=why,
                weights_gb=weights / 1e9,
                activations_gb=activations / 1e9,
                kv_cache_gb=max(kv_bytes, 0.0) / 1e9,
                kv_tokens=kv_tokens,
                batch=batch,
                prefill_s=prefill,
                step_s=s_full,
                allreduce_s=ar_full,
                capacity_rps=capacity,
                per_gpu_rps=capacity / t,
                ttft_s=ttft,
                completion_s=completion,
            )
        )
    return rows


def _kv_token_bytes(arch: Architecture, kv_dtype: str, t: int) -> float:
    """KV cache bytes per token on one GPU of a TP-``t`` engine (KV heads replicated past their number)."""
    return 2.0 * arch.layers * max(1.0, arch.kv_heads / t) * arch.head_dim * DTYPE_BYTES[kv_dtype]


def _intermediate(arch: Architecture) -> float:
    """Per-expert MLP width implied by the parameter count (gated MLP: three matrices)."""
    router = arch.hidden * arch.experts if arch.experts > 1 else 0
    shared = arch.embedding_params + arch.layers * (arch.attention_params_per_layer() + router)
    return (arch.params_total - shared) / (arch.layers * arch.experts * 3.0 * arch.hidden)


def expert_bytes_moe(arch: Architecture, dtype: str) -> float:
    """Bytes of all experts' MLP weights (the part a decode batch may touch partially)."""
    return arch.layers * arch.experts * 3.0 * arch.hidden * _intermediate(arch) * DTYPE_BYTES[dtype]


# --- from the roofline to a card -----------------------------------------------------


class Derivation(NamedTuple):
    """A derived card: its TOML sections (values already rounded, so the
    rendered card loads back to exactly these numbers), one comment per derived
    number, and the roofline rows behind them."""

    name: str
    sections: dict[str, dict[str, Any]]
    comments: dict[str, str]  # "section.key" -> why
    rows: list[TpRoofline]
    arch: Architecture
    gpu: GpuSpec


def _r(x: float, digits: int = 4) -> float:
    """Round to ``digits`` significant digits (a float that survives TOML exactly)."""
    if x == 0 or not math.isfinite(x):
        return float(x)
    return float(f"{x:.{digits}g}")


def _fit_knee(u: np.ndarray, y: np.ndarray, lo: float, hi: float) -> tuple[float, float, float]:
    """``(a, b, m)`` of ``y ≈ a - b (u - m)^2`` by least squares, with ``b`` floored at
    :data:`CURVATURE_FLOOR` and the knee ``m`` kept in ``[lo, hi]``; when the bound
    binds, ``a`` and ``b`` are refitted with ``m`` held there (a monotone curve: the
    peak sits at the edge and ``b`` is the fall-off away from it)."""
    if len(u) == 1:
        return float(y[0]), CURVATURE_FLOOR, float(np.clip(u[0], lo, hi))
    b = CURVATURE_FLOOR
    if len(u) >= 3:
        b = max(-float(np.polyfit(u, y, 2)[0]), CURVATURE_FLOOR)
    # With b fixed, y + b u^2 = (a - b m^2) + 2 b m u is linear in u.
    c1, _ = np.polyfit(u, y + b * u * u, 1)
    m0 = c1 / (2.0 * b)
    m = float(np.clip(m0, lo, hi))
    if m != m0:
        # y = a - b (u - m)^2 is linear in (a, b) once m is fixed.
        design = np.stack([np.ones_like(u), -((u - m) ** 2)], axis=1)
        b = max(float(np.linalg.lstsq(design, y, rcond=None)[0][1]), CURVATURE_FLOOR)
    a = float(np.mean(y + b * (u - m) ** 2))
    return a, b, m


class _Shape(NamedTuple):
    """The card's shape fitted to the feasible roofline rows (u = log2 TP)."""

    a: float  # log per-GPU capacity at the knee
    b: float  # curvature of log capacity over u
    m: float  # the knee, in u
    slopes: dict[str, float]  # "ttft"/"completion" → d log tail / d u
    bases: dict[str, float]  # "ttft"/"completion" → tail seconds at u_mid
    u_mid: float  # the middle of the TP range, in u
    pad: float  # the knee prior's padding of the TP range, in u


def derive(
    arch: Architecture,
    gpu: GpuSpec,
    *,
    dtype: str,
    kv_dtype: str | None = None,
    workload: Workload = DEFAULT_WORKLOAD,
    tps: Sequence[int] = (1, 2, 4, 8),
    gpu_memory_utilization: float = 0.9,
    min_concurrency: int = 8,
    name: str | None = None,
    source: str = "flags",
) -> Derivation:
    """Derive a prior card (see the module docstring).

    Raises:
        InputError: bad dtype, TP list or token counts; no TP can hold the model.
    """
    kv_dtype, tps = _check_derive_inputs(dtype, kv_dtype, tps, workload, gpu_memory_utilization)
    rows = roofline(
        arch, gpu, dtype=dtype, kv_dtype=kv_dtype, workload=workload, tps=tps,
        gpu_memory_utilization=gpu_memory_utilization, min_concurrency=min_concurrency,
    )
    ok = [r for r in rows if r.feasible]
    if not ok:
        raise InputError(f"{arch.name} in {dtype} does not fit {gpu.name} at any TP in {tps}: {rows[-1].why}")
    shape = _fit_shape(ok, tps)
    fam = name or f"{arch.name}-{dtype}-{gpu.name}"
    sections = _card_sections(fam, arch, gpu, dtype, kv_dtype, shape)
    sections["roles"], role_comments = _role_section(arch, gpu, kv_dtype, workload, ok)
    sections["feasibility"] = {"checked_tp": list(tps), "infeasible_tp": [r.tp for r in rows if not r.feasible]}
    sections["derivation"] = {
        "source": source,
        **_architecture_fields(arch),
        "gpu": gpu.name,
        "dtype": dtype,
        "kv_dtype": kv_dtype,
        "prompt_tokens": _r(workload.prompt_tokens),
        "output_tokens": _r(workload.output_tokens),
        "tp": list(tps),
        "gpu_memory_utilization": gpu_memory_utilization,
        "min_concurrency": min_concurrency,
    }
    comments = {**_card_comments(rows, ok, dtype, workload, mid_tp=2.0**shape.u_mid), **role_comments}
    return Derivation(fam, sections, comments, rows, arch, gpu)


def _role_section(
    arch: Architecture, gpu: GpuSpec, kv_dtype: str, workload: Workload, ok: list[TpRoofline]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The card's ``[roles]`` (module docstring, *roles*) from the feasible roofline rows, and
    its comments."""
    n_in, n_out = float(workload.prompt_tokens), float(workload.output_tokens)
    link = gpu.link_bytes_s() * ATTAINABLE["link_efficiency"]
    share = np.array([r.prefill_s / (r.prefill_s + n_out * r.step_s / r.batch) for r in ok])
    kv = np.array([math.log1p(n_in * _kv_token_bytes(arch, kv_dtype, r.tp) / link / r.prefill_s) for r in ok])
    engine = {k.split(".", 1)[1]: v for k, v in ROLE_DEFAULTS.items()}
    section = {
        "prefill_share_logit_mean": _r(float(np.mean(np.log(share / (1.0 - share)))), 3),
        "prefill_share_logit_sd": WIDTHS["prefill_share_logit_sd"],
        "decode_gain_log_mean": engine["decode_gain_log_mean"],
        "decode_gain_log_sd": engine["decode_gain_log_sd"],
        "kv_cost_median": _r(float(np.exp(np.mean(np.log(kv)))), 3),
        "kv_cost_log_sd": WIDTHS["kv_cost_log_sd"],
        "disagg_tail_sd": engine["disagg_tail_sd"],
        "engine_coef_sd": engine["engine_coef_sd"],
    }
    per_tp = lambda v: "; ".join(f"TP{r.tp} {x:.3g}" for r, x in zip(ok, v, strict=True))  # noqa: E731
    comments = {
        "roles": (
            "a catalogue's serving configurations (model/roles.py); the decode gain, the tail offsets of "
            "disaggregation and the engine coefficients are engine behaviour, not derived (the generic card's values)"
        ),
        "roles.prefill_share_logit_mean": (
            f"mean over the feasible TPs of logit(prefill / (prefill + {n_out:g} tokens x decode step / KV-limited "
            f"batch)), the prefill share of a {n_in:g}-token request's turns; per TP: {per_tp(share)}"
        ),
        "roles.prefill_share_logit_sd": "a class's prompt and output lengths move its share: x2.7 on the odds at one sd",
        "roles.kv_cost_median": (
            f"geometric mean over the feasible TPs of log(1 + KV of a {n_in:g}-token prompt per GPU / "
            f"({ATTAINABLE['link_efficiency']:g} x the GPU's link) / prefill): the prefill engine's time sending "
            f"its cache; per TP: {per_tp(kv)}"
        ),
        "roles.kv_cost_log_sd": (
            "a transfer between nodes runs over a network several times slower than NVLink, one overlapped with "
            "the prefill costs less: x7 either way at 90 %"
        ),
    }
    return section, comments


def _check_derive_inputs(
    dtype: str,
    kv_dtype: str | None,
    tps: Sequence[int],
    workload: Workload,
    gpu_memory_utilization: float,
) -> tuple[str, list[int]]:
    """``(kv_dtype, sorted unique tps)`` after checking the flags (errors name the flag)."""
    if dtype not in ("bf16", "fp8"):
        raise InputError(f"--dtype must be bf16 or fp8, got {dtype!r}")
    kv_dtype = kv_dtype or "bf16"
    if kv_dtype not in DTYPE_BYTES:
        raise InputError(f"--kv-dtype must be one of {', '.join(DTYPE_BYTES)}, got {kv_dtype!r}")
    tps = sorted({int(t) for t in tps})
    if not tps or tps[0] < 1:
        raise InputError(f"--tp must list positive TP degrees, got {tps!r}")
    if not (workload.prompt_tokens > 0 and workload.output_tokens > 0):
        raise InputError(f"--prompt-tokens and --output-tokens must be > 0, got {workload}")
    if not 0 < gpu_memory_utilization <= 1:
        raise InputError(f"--gpu-memory-utilization must be in (0, 1], got {gpu_memory_utilization!r}")
    return kv_dtype, tps


def _fit_shape(ok: list[TpRoofline], tps: list[int]) -> _Shape:
    """Fit the knee parabola to log capacity and a log-linear tail per metric over log2 TP."""
    pad = 0.5
    u_all = np.log2(np.array(tps, dtype=float))
    u_lo, u_hi = float(u_all.min()), float(u_all.max())
    u_mid = 0.5 * (u_lo + u_hi)
    u = np.log2(np.array([r.tp for r in ok], dtype=float))
    # The knee stays within pad/2 of the TP range (the model's knee prior lives on the
    # range padded by `pad`: a centre at its very edge could not move), and never
    # below the smallest feasible TP when a smaller one cannot hold the model.
    knee_lo = u_lo - pad / 2.0 if ok[0].tp == tps[0] else float(u[0])
    a, b, m = _fit_knee(u, np.log([r.per_gpu_rps for r in ok]), knee_lo, u_hi + pad / 2.0)
    slopes, bases = {}, {}
    for metric in ("ttft", "completion"):
        y = np.log([getattr(r, f"{metric}_s") for r in ok])
        if len(ok) >= 2:
            s, c = np.polyfit(u, y, 1)
        else:
            s, c = -0.3, float(y[0]) + 0.3 * float(u[0])
        slopes[metric], bases[metric] = float(s), float(np.exp(c + s * u_mid))
    return _Shape(a, b, m, slopes, bases, u_mid, pad)


def _card_sections(
    fam: str, arch: Architecture, gpu: GpuSpec, dtype: str, kv_dtype: str, shape: _Shape
) -> dict[str, dict[str, Any]]:
    """The card's prior sections, in card order: derived centres, fixed widths, engine defaults."""
    W = WIDTHS
    knee_tp = _r(2.0**shape.m, 3)
    sections: dict[str, dict[str, Any]] = {
        "card": {
            "family": fam,
            "description": (
                f"Derived by `fleetsieve-bayes priors derive` from {arch.name} ({dtype} weights, "
                f"{kv_dtype} KV cache) on {gpu.name}; roofline knee at TP{knee_tp:g}."
            ),
            "gpu": gpu.name,
        },
        "knee": {
            "tp": knee_tp,
            "logit_sd": W["knee_logit_sd"],
            "class_sd": W["knee_class_sd"],
            "edge_pad_log2": shape.pad,
        },
        "curvature": {"median": _r(shape.b, 3), "log_sd": W["curvature_log_sd"], "class_sd": W["curvature_class_sd"]},
        "capacity": {
            "per_gpu_at_knee": _r(math.exp(shape.a)),
            "log_sd": W["capacity_log_sd"],
            "class_sd": W["capacity_class_sd"],
        },
        "saturation": dict(ENGINE_DEFAULTS["saturation"]),
        "utilisation": dict(ENGINE_DEFAULTS["utilisation"]),
    }
    for metric in ("ttft", "completion"):
        sections[metric] = {
            "base_median_s": _r(shape.bases[metric], 3),
            "base_log_sd": W["tail_base_log_sd"],
            "class_sd": W["tail_class_sd"],
            "slope_per_log2tp": _r(shape.slopes[metric], 3),
            "slope_sd": W["tail_slope_sd"],
            **TAIL_ENGINE,
        }
    sections["success"] = dict(ENGINE_DEFAULTS["success"])
    sections["noise"] = dict(ENGINE_DEFAULTS["noise"])
    return sections


def _architecture_fields(arch: Architecture) -> dict[str, Any]:
    """The architecture's part of the ``[derivation]`` provenance section."""
    return {
        "architecture": arch.name,
        "parameters_b": _r(arch.params_total / 1e9),
        "active_parameters_b": _r(arch.params_active / 1e9),
        "layers": arch.layers,
        "hidden_size": arch.hidden,
        "attention_heads": arch.heads,
        "kv_heads": arch.kv_heads,
        "head_dim": arch.head_dim,
        "vocab_size": arch.vocab,
        "experts": arch.experts,
        "active_experts": arch.active_experts,
    }


def _card_comments(
    rows: list[TpRoofline], ok: list[TpRoofline], dtype: str, workload: Workload, *, mid_tp: float
) -> dict[str, str]:
    """"section.key" → why, written next to the value in the card."""
    best = max(ok, key=lambda r: r.per_gpu_rps)
    table = "; ".join(
        f"TP{r.tp} {r.per_gpu_rps:.2f}" if r.feasible else f"TP{r.tp} infeasible" for r in rows
    )
    return {
        "knee.tp": (
            f"argmax of the fitted parabola of log per-GPU capacity over log2 TP; per-GPU roofline "
            f"capacity (req/s/GPU): {table}; the roofline's best TP is TP{best.tp}"
        ),
        "knee.logit_sd": "the roofline ranks neighbouring TPs within ~30 %: keep the knee movable by one TP step",
        "curvature.log_sd": "x4.4 either way at 90 %: reaches the measured fall-off of the 8B example",
        "ttft.base_log_sd": "p99 tails depend on queueing and chunked prefill the arithmetic leaves out: x4.4 at 90 %",
        "completion.base_log_sd": "as for TTFT",
        "ttft.blowup_median": "blow-up and load elasticity are engine behaviour, not derived (the hand-written cards' values)",
        "saturation": "engine behaviour, not derived: the values the shipped hand-written vLLM cards share",
        "utilisation": "engine behaviour, not derived (as [saturation])",
        "success": "engine behaviour, not derived (as [saturation])",
        "noise": "measurement repeatability, not derived (as [saturation])",
        "derivation": "the inputs of this card (provenance; the model does not read them)",
        "curvature.median": (
            f"-(quadratic coefficient) of that fit (floor {CURVATURE_FLOOR}); measured serving falls away "
            "from the knee 4-7x faster (0.8 on the 31B grid, 0.3 in the 8B example), hence the wide log_sd; "
            "a 3x steeper median cost more GPU-seconds on both shipped grids"
        ),
        "capacity.per_gpu_at_knee": (
            f"fitted per-GPU capacity at the knee = serving efficiency {ATTAINABLE['serving_efficiency']} x "
            f"1 / (prefill of {workload.prompt_tokens:g} tokens at {ATTAINABLE['prefill_mfu']:.0%} of "
            f"the {dtype} peak + {workload.output_tokens:g} tokens x decode step / KV-limited batch) / TP"
        ),
        "capacity.log_sd": (
            "how far the roofline is from serving: on the shipped grids' saturated cells measured / derived "
            "capacity spans 0.33-2.1; with class_sd the 90 % interval of a class is e^(1.645 x 0.72) = 3.3x each way"
        ),
        "ttft.base_median_s": (
            f"{ATTAINABLE['ttft_factor']:g} x (prefill of a p99 prompt ({TOKEN_P99_OVER_MEAN:g} x mean) + one "
            f"decode step at half the KV-limited batch), log-linear in TP, at the grid's middle TP{mid_tp:g}"
        ),
        "ttft.slope_per_log2tp": "slope of log TTFT over log2 TP across the feasible TPs",
        "completion.base_median_s": (
            f"TTFT + {ATTAINABLE['completion_factor']:g} x p99 output ({TOKEN_P99_OVER_MEAN:g} x mean) x decode "
            f"step at half the KV-limited batch, at the grid's middle TP{mid_tp:g}"
        ),
        "completion.slope_per_log2tp": "slope of log completion over log2 TP across the feasible TPs",
        "feasibility.infeasible_tp": (
            "TPs whose KV cache cannot hold the minimum concurrency; the vLLM backend's memory guard "
            "skips them at zero GPU-seconds"
            + ("".join(f"\n{r.why}" for r in rows if not r.feasible))
        ),
    }


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot render {v!r}")


def render_card(d: Derivation) -> str:
    """The card as TOML: a header with the per-TP arithmetic, then every section,
    with a comment block above each derived number."""
    lines = [
        f"# Prior card: {d.name} — DERIVED by `fleetsieve-bayes priors derive` (do not hand-edit the",
        "# derived numbers; re-derive). A roofline of one vLLM replica per TP, scaled by attainable",
        "# fractions, with widths that say how far the roofline is from measured serving",
        "# (fleetsieve_bayes/model/derive.py). Inputs are recorded in [derivation].",
        f"# Model: {d.arch.name}: {d.arch.params_total / 1e9:.2f}B parameters "
        f"({d.arch.params_active / 1e9:.2f}B active per token), {d.arch.layers} layers, "
        f"{d.arch.kv_heads} KV heads x {d.arch.head_dim}.",
        f"# GPU: {d.gpu.description}.",
        "#",
        "# TP  feasible  weights GB  KV GB  KV tokens  batch  prefill ms  step ms (all-reduce)  "
        "req/s/replica  req/s/GPU  TTFT s  completion s",
    ]
    for r in d.rows:
        lines.append(
            f"# {r.tp:<3} {'yes' if r.feasible else 'NO ':<8}  {r.weights_gb:10.1f}  {r.kv_cache_gb:5.1f}  "
            f"{r.kv_tokens:9,.0f}  {r.batch:5.0f}  {r.prefill_s * 1e3:10.1f}  "
            f"{r.step_s * 1e3:7.1f} ({r.allreduce_s * 1e3:4.1f})      {r.capacity_rps:13.2f}  "
            f"{r.per_gpu_rps:9.2f}  {r.ttft_s:6.2f}  {r.completion_s:12.1f}"
        )
    for section, values in d.sections.items():
        lines.append("")
        if section in d.comments:
            lines.append(f"# {d.comments[section]}")
        lines.append(f"[{section}]")
        for key, value in values.items():
            why = d.comments.get(f"{section}.{key}")
            if why:
                for text in why.split("\n"):
                    lines.append(f"# {text}")
            lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"
