"""Serving configurations in the model: roles, composition and engine covariates.

A campaign with a catalogue of configurations (:mod:`fleetsieve_bayes.configs`)
has cells whose replica is more than one engine of TP GPUs. The model shares
strength across them through two structures and one set of covariates:

* **per-role behaviour.** One engine of TP ``2^u`` of class ``w`` serves at most
  ``L_w(u) = u log 2 + a_w − b_w (u − m_w)²`` (log req/s; the class's
  interior-knee curve of :mod:`~fleetsieve_bayes.model.curves`). A request
  spends a share ``φ_w`` of that engine's time in prefill and ``1 − φ_w`` in
  decode, so one engine alone prefills ``L_w(u) − log φ_w`` and decodes
  ``L_w(u) − log(1 − φ_w)`` (log req/s).
* **composition.** A disaggregated replica of ``x`` prefill engines of TP
  ``2^{u_p}`` and ``y`` decode engines of TP ``2^{u_d}`` serves the smooth
  minimum of its two roles, ``log x + L_w(u_p) − log φ_w`` and ``log y +
  L_w(u_d) − log(1 − φ_w) + g`` (``g``: the decode engines' gain from running
  without prefill interference), less the KV transfer's cost ``κ``. Its TTFT
  reads the prefill role's TP and its completion time the decode role's, each
  shifted by a learned offset of disaggregation (``δ``: the transfer on TTFT,
  the steadier decode on completion).
* **engine covariates.** ``log2(max_num_seqs / 256)`` and
  ``log2(max_num_batched_tokens / 8192)`` (vLLM's reference values; 0 where a
  configuration does not set them) move log capacity and log tail bases by
  coefficients ``β (2, 3)`` shared by the classes.

An aggregated configuration is one engine: ``L_w(u)``, the model as it is
without a catalogue. Each (class, configuration) keeps its own departure from
these curves (:func:`~fleetsieve_bayes.model.curves.tp_departure`, one column per
configuration), so a measured cell pins its configuration's other loads.

The priors are the prior card's ``[roles]`` section
(:mod:`fleetsieve_bayes.model.priors`; the ``generic`` card's are weak and say
their evidence, ``priors derive`` writes a family's from its roofline,
:mod:`fleetsieve_bayes.model.derive`): ``logit φ`` normal
(``prefill_share_logit_mean``, ``_sd``), ``g`` normal (``decode_gain_log_mean``,
``_sd``), ``κ`` log-normal (``kv_cost_median``, ``kv_cost_log_sd``), the tail
offsets ``δ`` at 0 with sd ``disagg_tail_sd`` and the engine coefficients ``β``
at 0 with sd ``engine_coef_sd``. A card without the section cannot fit a
catalogue that needs these sites (:func:`needs_roles`): :func:`role_sites`
refuses it with :func:`missing_roles_message`, as a campaign's setup does
before it starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist

from fleetsieve_bayes.errors import InputError

if TYPE_CHECKING:
    from fleetsieve_bayes.model.priors import PriorCard

__all__ = [
    "RoleInputs",
    "role_inputs",
    "role_sites",
    "role_log_capacity",
    "role_tail_shift",
    "role_site_count",
    "config_centre",
    "engine_covariates",
    "needs_roles",
    "missing_roles_message",
    "ENGINE_COVARIATES",
    "ENGINE_REFERENCE",
]

# The engine covariates and the reference value each is a log2 ratio to (vLLM's
# long-standing defaults of max_num_seqs and of the chunked-prefill token budget).
ENGINE_COVARIATES: tuple[str, ...] = ("max_num_seqs", "max_num_batched_tokens")
ENGINE_REFERENCE: tuple[float, ...] = (256.0, 8192.0)
# Sharpness of the smooth minimum of the two roles' capacities (as the saturation's).
_ROLE_SHARPNESS = 25.0


class RoleInputs(NamedTuple):
    """Per cell, what its configuration is to the model (jnp arrays, ``(n_cells, …)``).

    ``disagg`` bool ``(n_cells,)``; ``u_prefill``, ``u_decode`` ``(n_cells,)``: log2 of
    each role's engine TP (both the one engine's for an aggregated cell);
    ``log_workers (n_cells, 2)``: log of each role's engine count (0 aggregated);
    ``engine_x (n_cells, len(ENGINE_COVARIATES))`` the engine covariates.
    """

    disagg: jnp.ndarray
    u_prefill: jnp.ndarray
    u_decode: jnp.ndarray
    log_workers: jnp.ndarray
    engine_x: jnp.ndarray
    # The configurations themselves (the model's configuration columns, in catalogue
    # order): a RoleInputs whose rows are configurations, not cells (``(n_configs, …)``),
    # and ``config_log_gpus (n_configs,)`` log of each one's GPUs per replica.
    config: RoleInputs | None = None
    config_log_gpus: jnp.ndarray | None = None
    # ``(n_cells,)`` each cell's configuration column.
    config_col: jnp.ndarray | None = None


def engine_covariates(config: Any) -> list[float]:
    """A configuration's engine covariates (:data:`ENGINE_COVARIATES` order): ``log2`` of each
    numeric engine limit over its :data:`ENGINE_REFERENCE`, 0 where the configuration does not
    set it."""
    args = config.engine_args
    out = []
    for name, ref in zip(ENGINE_COVARIATES, ENGINE_REFERENCE, strict=True):
        v = args.get(name)
        out.append(math.log2(float(v) / ref) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0)
    return out


def needs_roles(configs: Sequence[Any] | None) -> bool:
    """Whether configurations ``configs`` (a catalogue, or each cell's) need the role sites: one is
    disaggregated, or one sets an engine limit away from its reference value."""
    return any(c.disaggregated or any(engine_covariates(c)) for c in configs or ())


def missing_roles_message(card_name: str) -> str:
    """What a card without ``[roles]`` is told when a catalogue needs the section: how to add it."""
    return (
        f"the prior card {card_name} has no [roles] section, which a catalogue of disaggregated configurations "
        "or engine limits needs (copy the generic card's [roles], or write one with `priors derive`)"
    )


def role_inputs(grid: Any) -> RoleInputs | None:
    """The :class:`RoleInputs` of a catalogued grid; None when the model needs none: no
    catalogue, or a catalogue of aggregated configurations without engine covariates
    (each TP one configuration: exactly the model without a catalogue)."""
    if not getattr(grid, "catalogued", False):
        return None
    confs = [grid.serving_config(i) for i in range(grid.n_cells)]
    if not needs_roles(confs):
        return None
    disagg = np.array([c.disaggregated for c in confs], bool)
    x = np.array([engine_covariates(c) for c in confs], np.float64).reshape(grid.n_cells, len(ENGINE_COVARIATES))
    u_p = np.array([math.log2(c.prefill.tp if c.prefill else c.tp) for c in confs])
    u_d = np.array([math.log2(c.decode.tp if c.decode else c.tp) for c in confs])
    workers = np.array([[c.prefill.workers, c.decode.workers] if c.prefill and c.decode else [1, 1] for c in confs])
    conf = grid.config_idx
    first = np.array([int(np.flatnonzero(conf == k)[0]) for k in np.unique(conf)], np.int64)
    return RoleInputs(
        disagg=jnp.asarray(disagg),
        u_prefill=jnp.asarray(u_p),
        u_decode=jnp.asarray(u_d),
        log_workers=jnp.asarray(np.log(workers.astype(np.float64))),
        engine_x=jnp.asarray(x),
        config=RoleInputs(
            disagg=jnp.asarray(disagg[first]),
            u_prefill=jnp.asarray(u_p[first]),
            u_decode=jnp.asarray(u_d[first]),
            log_workers=jnp.asarray(np.log(workers[first].astype(np.float64))),
            engine_x=jnp.asarray(x[first]),
        ),
        config_log_gpus=jnp.asarray(np.log(np.asarray(grid.tp, np.float64)[first])),
        config_col=jnp.asarray(np.searchsorted(np.unique(conf), conf), dtype=jnp.int32),
    )


def role_site_count(n_classes: int) -> int:
    """Length of site ``role_z``: a prefill share per class, the decode gain, the KV cost
    and the two tail offsets of disaggregation."""
    return n_classes + 4


def role_sites(n_classes: int, card: PriorCard) -> dict[str, jnp.ndarray]:
    """Sample the role parameters: sites ``role_z (n_classes + 4,)`` and ``engine_z (2, 3)``,
    standard normal, mapped through the card's ``[roles]`` to the deterministic
    ``prefill_share (n_classes,)``, ``decode_gain``, ``kv_cost`` (scalars), ``disagg_tail (2,)``
    and ``engine_coef (2, 3)``.

    Raises:
        InputError: the card has no ``[roles]`` section (:func:`missing_roles_message`).
    """
    if not card.has_roles:
        raise InputError(missing_roles_message(card.name))
    c = card
    z = numpyro.sample("role_z", dist.Normal(jnp.zeros(role_site_count(n_classes)), 1.0).to_event(1))
    e = numpyro.sample("engine_z", dist.Normal(jnp.zeros((len(ENGINE_COVARIATES), 3)), 1.0).to_event(2))
    share = jax.nn.sigmoid(c.roles_prefill_share_logit_mean + c.roles_prefill_share_logit_sd * z[:n_classes])
    gain = c.roles_decode_gain_log_mean + c.roles_decode_gain_log_sd * z[n_classes]
    kv = jnp.exp(math.log(c.roles_kv_cost_median) + c.roles_kv_cost_log_sd * z[n_classes + 1])
    return {
        "prefill_share": numpyro.deterministic("prefill_share", share),
        "decode_gain": numpyro.deterministic("decode_gain", gain),
        "kv_cost": numpyro.deterministic("kv_cost", kv),
        "disagg_tail": numpyro.deterministic("disagg_tail", c.roles_disagg_tail_sd * z[n_classes + 2 : n_classes + 4]),
        "engine_coef": numpyro.deterministic("engine_coef", c.roles_engine_coef_sd * e),
    }


def role_log_capacity(
    params: dict[str, jnp.ndarray], roles: RoleInputs, w: jnp.ndarray, engine: Callable[[jnp.ndarray], jnp.ndarray],
    log_cap: jnp.ndarray,
) -> jnp.ndarray:
    """Each cell's log replica capacity ``(n_cells,)``: ``log_cap`` (one engine, ``engine(u)``)
    for an aggregated cell, the composition of its roles for a disaggregated one, plus the
    engine covariates' effect.

    Args:
        w: int ``(n_cells,)`` each cell's class; engine: ``u (n_cells,) -> L_w(u) (n_cells,)``.
    """
    share = params["prefill_share"][w]
    prefill = roles.log_workers[:, 0] + engine(roles.u_prefill) - jnp.log(share)
    decode = roles.log_workers[:, 1] + engine(roles.u_decode) - jnp.log1p(-share) + params["decode_gain"]
    k = _ROLE_SHARPNESS
    composed = -jnp.logaddexp(-k * prefill, -k * decode) / k - params["kv_cost"]
    out = jnp.where(roles.disagg, composed, log_cap)
    return out + roles.engine_x @ params["engine_coef"][:, 0]


def role_tail_shift(params: dict[str, jnp.ndarray], roles: RoleInputs, tail_slope: jnp.ndarray, u: jnp.ndarray) -> jnp.ndarray:
    """Log shift of the tail bases ``(n_cells, 2)`` (ttft, completion): a disaggregated cell's
    TTFT reads its prefill role's TP and its completion its decode role's (in place of
    ``u``, along the tails' slope ``tail_slope (2,)``) plus the offsets ``disagg_tail``;
    every cell adds its engine covariates' effect."""
    u_roles = jnp.stack([roles.u_prefill, roles.u_decode], axis=1)
    moved = tail_slope[None, :] * (u_roles - u[:, None]) + params["disagg_tail"][None, :]
    shift = jnp.where(roles.disagg[:, None], moved, 0.0)
    return shift + roles.engine_x @ params["engine_coef"][:, 1:3]


def config_centre(params: dict[str, jnp.ndarray], roles: RoleInputs, cap_loc: jnp.ndarray) -> jnp.ndarray:
    """``(n_classes, n_configs)``: each class's smooth log capacity per GPU at each configuration
    (:func:`role_log_capacity` without departures, less log GPUs per replica) less its prior
    centre ``cap_loc (n_classes,)``; for an aggregated configuration exactly
    :func:`~fleetsieve_bayes.model.curves.capacity_parabola`'s value. The centre of the
    per-configuration capacity departures, sampled centred (model.curves.tp_departure)."""
    assert roles.config is not None and roles.config_log_gpus is not None
    conf = roles.config
    knee, curv, cap = (params[k][:, None] for k in ("knee", "curvature", "cap_level"))

    def engine(v: jnp.ndarray) -> jnp.ndarray:  # (n_classes, n_configs)
        return v * math.log(2.0) + cap - curv * (v - knee) ** 2

    u_p, u_d = conf.u_prefill[None, :], conf.u_decode[None, :]
    share = params["prefill_share"][:, None]
    one = engine(u_d)
    prefill = conf.log_workers[:, 0][None, :] + engine(u_p) - jnp.log(share)
    decode = conf.log_workers[:, 1][None, :] + one - jnp.log1p(-share) + params["decode_gain"]
    k = _ROLE_SHARPNESS
    composed = -jnp.logaddexp(-k * prefill, -k * decode) / k - params["kv_cost"]
    log_cap = jnp.where(conf.disagg[None, :], composed, one)
    log_cap = log_cap + (conf.engine_x @ params["engine_coef"][:, 0])[None, :]
    return log_cap - roles.config_log_gpus[None, :] - cap_loc[:, None]
