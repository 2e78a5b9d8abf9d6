"""Model-family prior cards: every hyperprior of :func:`fleetsieve_bayes.model.joint.fleet_model`.

A card is a TOML file under ``fleetsieve_bayes/data/priors/`` (shipped; found with
``fleetsieve_bayes.resources.data_dir("priors")``) describing one model family
on one GPU type. A campaign names it by file stem (``family =
"dense-31b-fp8-h100"``) or by path. Swapping priors for a new family means
adding a card; the model code does not change.

Every key is optional and defaults to the value of the weakly informative
``generic`` card (listed in :data:`DEFAULTS`); unknown keys are errors (with a
did-you-mean) so a typo never silently falls back to a default.

Notation: ``u = log2(TP)``; a class's per-GPU saturation capacity is
``exp(a - b (u - m)^2)`` req/s/GPU (a concave parabola in log space whose peak
``m`` is the *knee*); a replica's capacity is ``TP`` times that; utilisation is
``ρ = offered_rps / capacity``; the congestion terms are
``h_queue(ρ) = -log(1 - ρ_s)`` (``ρ_s`` = ``ρ^γ`` smoothly capped just below 1),
scaled by the card's ``blowup`` amplitude, plus ``log(1 + Ω·max(0, ρ − 1))``
past saturation (``Ω`` per class, a model constant prior) for the tails and
``h_succ(ρ) = log(1 + ρ^γ)`` for success (see :func:`fleetsieve_bayes.model.joint.congestion`). "log_sd" is a standard deviation on the natural-log
scale; "class_sd" is the sd of the between-class spread (partial pooling: each class's
value = family value + a normal class deviation of this sd; 0-ish = classes
share one value, large = independent classes).

Fields (section.key — meaning):

``[card]``
  ``family`` — display name (defaults to the file stem); ``description`` — free text;
  ``gpu`` — GPU type (free text).
``[knee]`` — where per-GPU capacity peaks.
  ``tp`` — expected knee as a TP degree (absolute), **or** ``position`` —
  expected knee as a fraction of the grid's log2(TP) range (0 = smallest TP,
  1 = largest; scale-free). Exactly one may be given (default ``position = 0.5``).
  ``logit_sd`` — prior sd of the knee on the logit scale of the padded range
  (about 0.5 = confident, 1.5 = vague). ``class_sd`` — between-class spread
  (logit scale). ``edge_pad_log2`` — how far (in log2 TP) beyond the smallest
  and largest TP the knee may move, so the data can put the peak at (or past) an
  edge, making capacity per GPU monotone over the grid.
``[curvature]`` — ``b``, how sharply per-GPU capacity falls away from the knee
  (per unit of log2 TP squared, log scale). ``median``, ``log_sd``, ``class_sd``.
``[capacity]`` — ``a``, per-GPU capacity at the knee. ``per_gpu_at_knee``
  (req/s/GPU, absolute) **or** ``relative_to_offered`` — a multiplier of the
  class's median ``offered_rps / TP`` over the grid (scale-free: the grid's
  offered loads are chosen around each class's saturation point, whatever its
  scale). Exactly one (default ``relative_to_offered = 1.0``). ``log_sd``, ``class_sd``.
  ``tp_sd`` — sd of a class's departure from the parabola at each TP degree
  (log scale; 0, the default of a card that omits it, switches the departures
  off: capacity follows the parabola exactly; the generic card has 0.3). ``[ttft]`` and ``[completion]`` have a ``tp_sd`` of
  their own for the tail bases. ``tp_departures`` — ``"free"`` (default) or
  ``"orthogonal"``: every departure (capacity and tails) is projected off a
  constant and a linear trend in log2 TP over the grid's TP degrees, which
  the parabola's level and knee (and the tails' base and slope) already
  carry; without that ridge between them the certifying fit of a mixed-GPU
  campaign converges (docs/results.md, "Several GPU types"). Cards written
  with a ``[gpu_axis]`` set it.
``[saturation]`` — served throughput is the smooth minimum
  ``(offered^-k + capacity^-k)^(-1/k)``; ``sharpness_median`` and
  ``sharpness_log_sd`` give the log-normal prior of ``k``.
``[utilisation]`` — ``exponent_median``, ``exponent_log_sd``: log-normal prior
  of ``γ`` (the power of ``ρ`` in both congestion terms).
``[ttft]`` and ``[completion]`` — tail latency (p99, seconds):
  ``log L = base + slope (u - u_mid) + elasticity · (log λ - log λ_ref) + blowup · h_tail(ρ)``.
  ``base_median_s`` — p99 at the class's reference load (the median offered
  load of its cells, ``λ_ref``) and low utilisation, at the grid's middle TP (seconds);
  ``base_log_sd``; ``class_sd`` — between-class spread of the base (log);
  ``slope_per_log2tp``, ``slope_sd`` — change of log latency per doubling of TP;
  ``blowup_median``, ``blowup_log_sd``, ``blowup_class_sd`` — log-normal prior
  of the congestion amplitude (log latency gained per unit of ``h``);
  ``load_elasticity_mean``, ``load_elasticity_sd``, ``load_elasticity_class_sd``
  — normal prior of the elasticity of the tail to the offered load *below*
  saturation (log latency per unit of log load): batches grow with the load, so
  a real p99 rises gradually long before queueing sets in. Without this term
  every such rise would have to be read as utilisation, i.e. as a lower
  capacity (an over-confident capacity posterior).
``[success]`` — ``logit(success) = base - drop · h_succ(ρ)``.
  ``logit_base_mean``, ``logit_base_sd``, ``class_sd``;
  ``drop_median``, ``drop_log_sd``, ``drop_class_sd``.
``[noise]`` — half-normal scales of the per-metric Student-t noise on the
  transformed scale (log throughput, log ttft, log completion, logit success):
  ``throughput``, ``ttft``, ``completion``, ``success``.
``[window]`` — the window noise: how one measurement window of a cell scatters
  around the cell's truth (used when the campaign's ``slo_attainment`` is a
  level, not ``"point"``; see :func:`fleetsieve_bayes.model.joint.window_scales`).
  Tails (log scale): sd ``s0 + s1 · sigmoid((ρ − knee_utilisation) / knee_width)``
  with ``s0`` log-normal around ``tail_light_sd`` and ``s1`` around
  ``tail_knee_sd`` (sd ``tail_log_sd`` at the family level, ``tail_class_sd``
  between classes), per tail metric. Success (logit scale): with probability
  ``1 − π`` a normal scatter of sd around ``success_sd`` (``success_log_sd``);
  with probability ``π`` (logit-normal around ``burst_probability``, sd
  ``burst_logit_sd``, ``burst_class_sd`` between classes) a burst that drops the
  logit by an exponential amount of mean around ``burst_drop``
  (``burst_drop_log_sd``). Throughput: normal, sd ``throughput_sd`` (fixed).
  ``knee_utilisation`` must lie in (0, 2).
``[feasibility]`` — which TPs can hold the model at all (not a hyperprior: the
  vLLM backend's memory guard reads it and skips an infeasible TP at zero
  GPU-seconds, recording the cell as infeasible). ``checked_tp`` — the TPs
  that were checked; ``infeasible_tp`` — those that cannot fit (a subset).
  A TP outside ``checked_tp`` is unknown and measured normally.
``[derivation]`` — the inputs of a card written by ``priors derive`` (model
  architecture, GPU, dtypes, mean tokens, TPs; see
  :mod:`fleetsieve_bayes.model.derive`). Provenance only: the model ignores it.
``[gpu_axis]`` — roofline ratios of other GPU types to the card's
  (``priors derive --also-gpus``, :mod:`fleetsieve_bayes.model.gpu_axis`):
  ``reference`` (the card's GPU), ``gpus`` (every GPU, the reference
  among them), ``tp`` (strictly increasing), and per GPU a row per TP of ``log_capacity`` (per-GPU
  capacity, ``-inf`` where the model does not fit), ``log_ttft`` and
  ``log_completion`` (``inf`` there). Read by
  :func:`fleetsieve_bayes.model.gpu_axis.axis_from_card`; the joint model
  does not use it.
``[roles]`` — the priors of a catalogue's serving configurations
  (:mod:`fleetsieve_bayes.model.roles`; read only when a campaign's catalogue
  has a disaggregated configuration or engine limits that move the engine
  covariates). ``prefill_share_logit_mean``, ``prefill_share_logit_sd`` —
  normal prior of ``logit φ``, the share of an engine's time a request spends
  in prefill (per class); ``decode_gain_log_mean``, ``decode_gain_log_sd`` —
  normal prior of ``g``, the decode engines' log gain from running without
  prefill; ``kv_cost_median``, ``kv_cost_log_sd`` — log-normal prior of ``κ``,
  the KV transfer's cost to a disaggregated replica's log capacity;
  ``disagg_tail_sd`` — sd of the two tail offsets of disaggregation (log);
  ``engine_coef_sd`` — sd of the engine covariates' coefficients. A card
  without the section has none (a catalogue that needs it is refused, naming
  the fix); a section that omits a key takes the ``generic`` card's value
  (:data:`ROLE_DEFAULTS`). ``priors derive`` writes it from its roofline
  (:mod:`fleetsieve_bayes.model.derive`).
"""

from __future__ import annotations

import difflib
import math
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.resources import data_dir, legacy_path

__all__ = ["PriorCard", "DEFAULTS", "ROLE_DEFAULTS", "list_cards", "load_card", "card_path", "card_fields"]

# Defaults = the generic card, but for [capacity] tp_sd (0.3 there, 0 for a card that omits it:
# the architecture cards keep their parabola) and [roles] (absent from a card that omits the
# section; ROLE_DEFAULTS fills the keys a given section omits). Keys are "section.key".
DEFAULTS: dict[str, float | str | tuple[int, ...] | None] = {
    "card.family": "",
    "card.description": "",
    "card.gpu": "",
    "knee.tp": None,
    "knee.position": None,
    "knee.logit_sd": 1.0,
    "knee.class_sd": 0.5,
    "knee.edge_pad_log2": 0.5,
    "curvature.median": 0.5,
    "curvature.log_sd": 0.8,
    "curvature.class_sd": 0.3,
    "capacity.per_gpu_at_knee": None,
    "capacity.relative_to_offered": None,
    "capacity.log_sd": 1.0,
    "capacity.class_sd": 0.5,
    "capacity.tp_sd": 0.0,
    "capacity.tp_departures": "free",
    "saturation.sharpness_median": 15.0,
    "saturation.sharpness_log_sd": 0.6,
    "saturation.class_sd": 0.0,
    "utilisation.exponent_median": 2.0,
    "utilisation.exponent_log_sd": 0.35,
    "ttft.base_median_s": 0.5,
    "ttft.base_log_sd": 1.5,
    "ttft.class_sd": 0.5,
    "ttft.slope_per_log2tp": -0.3,
    "ttft.slope_sd": 0.6,
    "ttft.blowup_median": 0.8,
    "ttft.blowup_log_sd": 0.6,
    "ttft.blowup_class_sd": 0.3,
    "ttft.load_elasticity_mean": 0.2,
    "ttft.load_elasticity_sd": 0.3,
    "ttft.load_elasticity_class_sd": 0.15,
    "ttft.tp_sd": 0.0,
    "completion.base_median_s": 10.0,
    "completion.base_log_sd": 1.5,
    "completion.class_sd": 0.5,
    "completion.slope_per_log2tp": -0.3,
    "completion.slope_sd": 0.6,
    "completion.blowup_median": 0.8,
    "completion.blowup_log_sd": 0.6,
    "completion.blowup_class_sd": 0.3,
    "completion.load_elasticity_mean": 0.2,
    "completion.load_elasticity_sd": 0.3,
    "completion.load_elasticity_class_sd": 0.15,
    "completion.tp_sd": 0.0,
    "success.logit_base_mean": 6.0,
    "success.logit_base_sd": 1.5,
    "success.class_sd": 0.5,
    "success.drop_median": 2.0,
    "success.drop_log_sd": 0.8,
    "success.drop_class_sd": 0.3,
    "noise.throughput": 0.05,
    "noise.ttft": 0.25,
    "noise.completion": 0.25,
    "noise.success": 0.8,
    # Window noise (the scatter of one measurement window around its cell's
    # truth; docs/results.md "Window noise"): tails' log-scale sd at light load
    # and its extra near and past the knee, success's ordinary logit scatter and
    # its bursts, throughput's tiny scatter.
    "window.tail_light_sd": 0.04,
    "window.tail_knee_sd": 0.15,
    "window.tail_log_sd": 0.5,
    "window.tail_class_sd": 0.3,
    "window.knee_utilisation": 0.85,
    "window.knee_width": 0.1,
    "window.throughput_sd": 0.01,
    "window.success_sd": 0.3,
    "window.success_log_sd": 0.7,
    "window.burst_probability": 0.03,
    "window.burst_logit_sd": 0.7,
    "window.burst_class_sd": 0.4,
    "window.burst_drop": 1.5,
    "window.burst_drop_log_sd": 0.5,
    "feasibility.checked_tp": None,
    "feasibility.infeasible_tp": None,
    "derivation.source": None,
    "derivation.architecture": None,
    "derivation.parameters_b": None,
    "derivation.active_parameters_b": None,
    "derivation.layers": None,
    "derivation.hidden_size": None,
    "derivation.attention_heads": None,
    "derivation.kv_heads": None,
    "derivation.head_dim": None,
    "derivation.vocab_size": None,
    "derivation.experts": None,
    "derivation.active_experts": None,
    "derivation.gpu": None,
    "derivation.dtype": None,
    "derivation.kv_dtype": None,
    "derivation.prompt_tokens": None,
    "derivation.output_tokens": None,
    "derivation.tp": None,
    "derivation.gpu_memory_utilization": None,
    "derivation.min_concurrency": None,
    "gpu_axis.reference": None,
    "gpu_axis.gpus": None,
    "gpu_axis.tp": None,
    "gpu_axis.log_capacity": None,
    "gpu_axis.log_ttft": None,
    "gpu_axis.log_completion": None,
    # [roles]: None when the card has no such section (model/roles.py).
    "roles.prefill_share_logit_mean": None,
    "roles.prefill_share_logit_sd": None,
    "roles.decode_gain_log_mean": None,
    "roles.decode_gain_log_sd": None,
    "roles.kv_cost_median": None,
    "roles.kv_cost_log_sd": None,
    "roles.disagg_tail_sd": None,
    "roles.engine_coef_sd": None,
}
# The generic card's [roles] (its evidence is in generic.toml): what a key that a card's
# [roles] section omits takes.
ROLE_DEFAULTS: dict[str, float] = {
    "roles.prefill_share_logit_mean": 0.0,
    "roles.prefill_share_logit_sd": 1.5,
    "roles.decode_gain_log_mean": 0.1,
    "roles.decode_gain_log_sd": 0.3,
    "roles.kv_cost_median": 0.05,
    "roles.kv_cost_log_sd": 1.0,
    "roles.disagg_tail_sd": 0.5,
    "roles.engine_coef_sd": 0.3,
}
# [gpu_axis] keys: all or none; the three ratio matrices are (len(gpus), len(tp)).
_GPU_AXIS_MATRICES = ("gpu_axis.log_capacity", "gpu_axis.log_ttft", "gpu_axis.log_completion")
_STRINGS = {
    "card.family",
    "card.description",
    "card.gpu",
    "derivation.source",
    "derivation.architecture",
    "derivation.gpu",
    "derivation.dtype",
    "derivation.kv_dtype",
    "gpu_axis.reference",
}
# String fields with a fixed set of values.
_CHOICES = {"capacity.tp_departures": ("free", "orthogonal")}
# Lists of TP degrees (positive integers), stored as sorted tuples.
_TP_LISTS = {"feasibility.checked_tp", "feasibility.infeasible_tp", "derivation.tp"}
# Fields that may be 0 (0 switches the per-class spread off).
_NON_NEGATIVE = {"saturation.class_sd", "capacity.tp_sd", "ttft.tp_sd", "completion.tp_sd"}
# Fields that must be > 0 (scales, medians); the rest may be any finite number.
_REAL = {
    "ttft.slope_per_log2tp",
    "completion.slope_per_log2tp",
    "success.logit_base_mean",
    "ttft.load_elasticity_mean",
    "completion.load_elasticity_mean",
    "roles.prefill_share_logit_mean",
    "roles.decode_gain_log_mean",
}


@dataclass(frozen=True)
class PriorCard:
    """A validated prior card (hashable, so the model can close over it under ``jit``).

    Field names are ``section_key`` of the TOML (``knee.logit_sd`` → ``knee_logit_sd``).
    Exactly one of ``knee_tp`` / ``knee_position`` and one of
    ``capacity_per_gpu_at_knee`` / ``capacity_relative_to_offered`` is not None.
    """

    name: str
    path: str
    card_family: str
    card_description: str
    card_gpu: str
    knee_tp: float | None
    knee_position: float | None
    knee_logit_sd: float
    knee_class_sd: float
    knee_edge_pad_log2: float
    curvature_median: float
    curvature_log_sd: float
    curvature_class_sd: float
    capacity_per_gpu_at_knee: float | None
    capacity_relative_to_offered: float | None
    capacity_log_sd: float
    capacity_class_sd: float
    capacity_tp_sd: float
    capacity_tp_departures: str
    saturation_sharpness_median: float
    saturation_sharpness_log_sd: float
    saturation_class_sd: float
    utilisation_exponent_median: float
    utilisation_exponent_log_sd: float
    ttft_base_median_s: float
    ttft_base_log_sd: float
    ttft_class_sd: float
    ttft_slope_per_log2tp: float
    ttft_slope_sd: float
    ttft_blowup_median: float
    ttft_blowup_log_sd: float
    ttft_blowup_class_sd: float
    ttft_load_elasticity_mean: float
    ttft_load_elasticity_sd: float
    ttft_load_elasticity_class_sd: float
    ttft_tp_sd: float
    completion_base_median_s: float
    completion_base_log_sd: float
    completion_class_sd: float
    completion_slope_per_log2tp: float
    completion_slope_sd: float
    completion_blowup_median: float
    completion_blowup_log_sd: float
    completion_blowup_class_sd: float
    completion_load_elasticity_mean: float
    completion_load_elasticity_sd: float
    completion_load_elasticity_class_sd: float
    completion_tp_sd: float
    success_logit_base_mean: float
    success_logit_base_sd: float
    success_class_sd: float
    success_drop_median: float
    success_drop_log_sd: float
    success_drop_class_sd: float
    noise_throughput: float
    noise_ttft: float
    noise_completion: float
    noise_success: float
    window_tail_light_sd: float
    window_tail_knee_sd: float
    window_tail_log_sd: float
    window_tail_class_sd: float
    window_knee_utilisation: float
    window_knee_width: float
    window_throughput_sd: float
    window_success_sd: float
    window_success_log_sd: float
    window_burst_probability: float
    window_burst_logit_sd: float
    window_burst_class_sd: float
    window_burst_drop: float
    window_burst_drop_log_sd: float
    feasibility_checked_tp: tuple[int, ...] | None
    feasibility_infeasible_tp: tuple[int, ...] | None
    derivation_source: str | None
    derivation_architecture: str | None
    derivation_parameters_b: float | None
    derivation_active_parameters_b: float | None
    derivation_layers: float | None
    derivation_hidden_size: float | None
    derivation_attention_heads: float | None
    derivation_kv_heads: float | None
    derivation_head_dim: float | None
    derivation_vocab_size: float | None
    derivation_experts: float | None
    derivation_active_experts: float | None
    derivation_gpu: str | None
    derivation_dtype: str | None
    derivation_kv_dtype: str | None
    derivation_prompt_tokens: float | None
    derivation_output_tokens: float | None
    derivation_tp: tuple[int, ...] | None
    derivation_gpu_memory_utilization: float | None
    derivation_min_concurrency: float | None
    gpu_axis_reference: str | None
    gpu_axis_gpus: tuple[str, ...] | None
    gpu_axis_tp: tuple[int, ...] | None
    gpu_axis_log_capacity: tuple[tuple[float, ...], ...] | None
    gpu_axis_log_ttft: tuple[tuple[float, ...], ...] | None
    gpu_axis_log_completion: tuple[tuple[float, ...], ...] | None
    roles_prefill_share_logit_mean: float | None
    roles_prefill_share_logit_sd: float | None
    roles_decode_gain_log_mean: float | None
    roles_decode_gain_log_sd: float | None
    roles_kv_cost_median: float | None
    roles_kv_cost_log_sd: float | None
    roles_disagg_tail_sd: float | None
    roles_engine_coef_sd: float | None

    @property
    def has_roles(self) -> bool:
        """Whether the card has a ``[roles]`` section (the priors of a catalogue's configurations)."""
        return self.roles_prefill_share_logit_mean is not None

    def tp_feasible(self, tp: int) -> bool | None:
        """Whether TP ``tp`` can hold the model: True/False when the card's
        ``[feasibility]`` checked it, None when unknown."""
        if self.feasibility_infeasible_tp and int(tp) in self.feasibility_infeasible_tp:
            return False
        if self.feasibility_checked_tp is not None and int(tp) in self.feasibility_checked_tp:
            return True
        return None


def card_fields(card: PriorCard) -> list[tuple[str, Any]]:
    """``[("section.key", value), ...]`` in card order (for ``priors show``)."""
    key_of = {k.replace(".", "_", 1): k for k in DEFAULTS}  # a section may hold "_" (gpu_axis)
    out = []
    for f in fields(card):
        if f.name in ("name", "path"):
            continue
        out.append((key_of[f.name], getattr(card, f.name)))
    return out


def list_cards() -> list[str]:
    """Names (file stems) of the shipped prior cards, sorted."""
    return sorted(p.stem for p in data_dir("priors").glob("*.toml"))


def card_path(name_or_path: str | Path) -> Path:
    """Resolve a card name (shipped file stem) or a path to a file.

    Raises:
        InputError: neither a shipped card nor an existing file (with a did-you-mean).
    """
    s = str(name_or_path)
    p = Path(s)
    if p.suffix == ".toml" or "/" in s or p.is_file():
        if not p.is_file():
            p = legacy_path(p) or p
        if not p.is_file():
            raise InputError(f"{p}: prior card not found")
        return p
    shipped = data_dir("priors") / f"{s}.toml"
    if shipped.is_file():
        return shipped
    names = list_cards()
    close = difflib.get_close_matches(s, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise InputError(f"prior card {s!r} not found{hint}; shipped cards: {', '.join(names)}")


def load_card(name_or_path: str | Path) -> PriorCard:
    """Load and validate a prior card by name (file stem under ``fleetsieve_bayes/data/priors/``) or path.

    Raises:
        InputError: missing file, bad TOML, unknown section/key (did-you-mean),
            wrong type, non-positive scale, or conflicting alternatives — naming
            the file and the key.
    """
    path = card_path(name_or_path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read prior card: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: not valid TOML: {exc}") from None
    return parse_card(raw, path)


def parse_card(raw: dict[str, Any], path: Path) -> PriorCard:
    """Validate an already-parsed card mapping; ``path`` names it in errors."""
    sections = sorted({k.split(".")[0] for k in DEFAULTS})
    values: dict[str, Any] = dict(DEFAULTS)
    for section, table in raw.items():
        if section not in sections:
            close = difflib.get_close_matches(section, sections, n=1)
            hint = f" (did you mean [{close[0]}]?)" if close else ""
            raise InputError(f"{path}: unknown section [{section}]{hint}")
        if not isinstance(table, dict):
            raise InputError(f"{path}: [{section}] must be a table")
        allowed = [k.split(".", 1)[1] for k in DEFAULTS if k.startswith(section + ".")]
        for key, value in table.items():
            full = f"{section}.{key}"
            if full not in DEFAULTS:
                close = difflib.get_close_matches(key, allowed, n=1)
                hint = f" (did you mean {section}.{close[0]!r}?)" if close else ""
                raise InputError(
                    f"{path}: unknown key {full!r}{hint}; allowed in [{section}]: {', '.join(allowed)}"
                )
            values[full] = _check(path, full, value)
    if values["knee.tp"] is not None and values["knee.position"] is not None:
        raise InputError(f"{path}: [knee] give either 'tp' or 'position', not both")
    if values["knee.tp"] is None and values["knee.position"] is None:
        values["knee.position"] = 0.5
    if values["knee.position"] is not None and not 0.0 < values["knee.position"] < 1.0:
        raise InputError(f"{path}: 'knee.position' must be strictly between 0 and 1")
    if not 0.0 < values["window.knee_utilisation"] < 2.0:
        raise InputError(f"{path}: 'window.knee_utilisation' must be strictly between 0 and 2")
    if not 0.0 < values["window.burst_probability"] < 1.0:
        raise InputError(f"{path}: 'window.burst_probability' must be strictly between 0 and 1")
    cap_abs, cap_rel = values["capacity.per_gpu_at_knee"], values["capacity.relative_to_offered"]
    if cap_abs is not None and cap_rel is not None:
        raise InputError(
            f"{path}: [capacity] give either 'per_gpu_at_knee' or 'relative_to_offered', not both"
        )
    if cap_abs is None and cap_rel is None:
        values["capacity.relative_to_offered"] = 1.0
    checked, infeasible = values["feasibility.checked_tp"], values["feasibility.infeasible_tp"]
    if checked is not None and infeasible is not None and not set(infeasible) <= set(checked):
        extra = sorted(set(infeasible) - set(checked))
        raise InputError(f"{path}: 'feasibility.infeasible_tp' lists TP {extra} not in 'feasibility.checked_tp'")
    _check_gpu_axis(path, values)
    if "roles" in raw:  # a section that omits a key takes the generic card's value
        values.update({k: v for k, v in ROLE_DEFAULTS.items() if values[k] is None})
    if not values["card.family"]:
        values["card.family"] = path.stem
    kwargs = {k.replace(".", "_", 1): v for k, v in values.items()}
    return PriorCard(name=path.stem, path=str(path), **kwargs)


def _check_gpu_axis(path: Path, values: dict[str, Any]) -> None:
    """``[gpu_axis]``: all keys or none, matrices of one row per GPU and one column per TP."""
    keys = [k for k in DEFAULTS if k.startswith("gpu_axis.")]
    given = [k for k in keys if values[k] is not None]
    if not given:
        return
    if len(given) != len(keys):
        missing = ", ".join(repr(k) for k in keys if values[k] is None)
        raise InputError(f"{path}: [gpu_axis] is missing {missing}")
    if values["gpu_axis.reference"] not in values["gpu_axis.gpus"]:
        raise InputError(f"{path}: 'gpu_axis.reference' {values['gpu_axis.reference']!r} is not in 'gpu_axis.gpus'")
    n_g, n_t = len(values["gpu_axis.gpus"]), len(values["gpu_axis.tp"])
    for k in _GPU_AXIS_MATRICES:
        m = values[k]
        if len(m) != n_g or any(len(row) != n_t for row in m):
            raise InputError(f"{path}: {k!r} must have {n_g} rows (gpu_axis.gpus) of {n_t} values (gpu_axis.tp)")


def _check(path: Path, key: str, value: Any) -> Any:
    if key == "gpu_axis.tp":
        if (
            not isinstance(value, list)
            or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in value)
            or any(b <= a for a, b in zip(value, value[1:], strict=False))
            or not value
        ):
            raise InputError(f"{path}: {key!r} must be a strictly increasing list of TP degrees, got {value!r}")
        return tuple(value)
    if key == "gpu_axis.gpus":
        if not isinstance(value, list) or not value or not all(isinstance(g, str) and g for g in value):
            raise InputError(f"{path}: {key!r} must be a non-empty list of GPU names, got {value!r}")
        return tuple(value)
    if key in _GPU_AXIS_MATRICES:
        ok = isinstance(value, list) and all(
            isinstance(row, list)
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x) for x in row)
            for row in value
        )
        if not ok:
            raise InputError(f"{path}: {key!r} must be a list of rows of numbers (inf allowed), got {value!r}")
        return tuple(tuple(float(x) for x in row) for row in value)
    if key in _TP_LISTS:
        if not isinstance(value, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and t >= 1 for t in value
        ):
            raise InputError(f"{path}: {key!r} must be a list of positive integers (TP degrees), got {value!r}")
        return tuple(sorted(set(value)))
    if key in _CHOICES:
        if value not in _CHOICES[key]:
            raise InputError(f"{path}: {key!r} must be one of {', '.join(map(repr, _CHOICES[key]))}, got {value!r}")
        return value
    if key in _STRINGS:
        if not isinstance(value, str):
            raise InputError(f"{path}: {key!r} must be a string, got {value!r}")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"{path}: {key!r} must be a number, got {value!r}")
    x = float(value)
    if not math.isfinite(x):
        raise InputError(f"{path}: {key!r} must be finite, got {value!r}")
    if key in _NON_NEGATIVE:
        if x < 0:
            raise InputError(f"{path}: {key!r} must be >= 0, got {value!r}")
    elif key not in _REAL and x <= 0:
        raise InputError(f"{path}: {key!r} must be > 0, got {value!r}")
    return x
