"""Credible bounds for every cell, and the conservative / optimistic tables.

For an unmeasured cell the interval is the central ``level`` interval of the
posterior *predictive* distribution (latent metrics plus observation noise): it
should contain what measuring the cell would return, which is the value the
decision will use once the cell is measured. Success widening near 0/1, the
collapse of measured cells and the two tables follow the rules of
:mod:`fleetsieve_bayes.decision.intervals` — the same functions the
acquisition kernel uses. Quantiles here are NumPy's linear interpolation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pandas as pd

from fleetsieve_bayes.allocation.problem import AllocationProblem, CellGrid
from fleetsieve_bayes.decision.intervals import (
    MODEL_MARGIN,
    SUCCESS_MARGIN,
    IntervalRules,
    LoadLadder,
    bound_tables,
    credible_quantiles,
    grid_ladder,
    guard_state,
    knee_guard,
    level_tables,
    model_intervals,
    with_measured,
)
from fleetsieve_bayes.model.data import served_nothing
from fleetsieve_bayes.model.observation import sample_obs
from fleetsieve_bayes.model.window_noise import cell_offsets, probabilities_given_offsets
from fleetsieve_bayes.table import BOUNDS_COLUMNS

__all__ = [
    "Bounds",
    "credible_bounds",
    "rule_bounds",
    "conservative_table",
    "optimistic_table",
    "bounds_frame",
    "BOUNDS_COLUMNS",
    "Attainment",
    "BINDING_METRICS",
    "attainment_bounds",
    "level_bounds",
    "cell_levels",
    "slo_levels",
    "committed_attainment",
    "answer_confidence",
    "best_estimate_table",
    "cell_to_repeat",
    "repeatable_mask",
    "repeat_entry",
    "repeat_advice",
    "repeat_at_limit",
    "class_attainment_line",
    "attainment_lines",
    "decision_tables",
]

# window_probabilities given the departures, one compiled program (eagerly, one per operation).
_probabilities = jax.jit(probabilities_given_offsets)
# The metric of :attr:`Attainment.binding`, by index.
BINDING_METRICS = ("success", "ttft_p99", "completion_p99")


class Bounds(NamedTuple):
    """Per-cell credible bounds, each ``(n_cells, 4)`` in METRICS order, ``lo <= hi``."""

    lo: np.ndarray
    hi: np.ndarray


def credible_bounds(
    posterior: object,
    observed: np.ndarray,
    measured_mask: np.ndarray,
    level: float,
    repeatability: float = 0.0,
    *,
    predictive: bool = True,
    seed: int = 0,
    model_margin: float = MODEL_MARGIN,
    success_margin: float = SUCCESS_MARGIN,
    ladder: LoadLadder | None = None,
) -> Bounds:
    """Central ``level`` credible intervals, measured cells collapsed.

    Args:
        posterior: a :class:`fleetsieve_bayes.model.inference.Posterior` (uses
            ``latent (n_draws, n_cells, 4)`` and ``noise (n_draws, 4)``).
        observed: ``(n_cells, 4)`` measured values (read where measured).
        measured_mask: bool ``(n_cells,)``.
        level: e.g. 0.9 → 5 % and 95 % quantiles.
        repeatability: relative half-width of the band around measured values.
        predictive: intervals of latent + noise (default) rather than latent only.
        seed: PRNG seed of the predictive noise draws (deterministic bounds).
        model_margin: model discrepancy of the tails of unmeasured cells
            (:data:`fleetsieve_bayes.decision.intervals.MODEL_MARGIN`).
        success_margin: ... and of their failure probability
            (:data:`fleetsieve_bayes.decision.intervals.SUCCESS_MARGIN`).
        ladder: the grid's :func:`~fleetsieve_bayes.decision.intervals.load_ladder`:
            apply the knee guard (None: do not; campaigns always pass it).
    """
    q_lo, q_hi = credible_quantiles(level)
    latent = np.asarray(posterior.latent, dtype=np.float64)
    if predictive:
        noise = jnp.asarray(posterior.noise)[:, None, :]
        draws = np.asarray(
            sample_obs(jax.random.PRNGKey(seed), jnp.asarray(latent), noise), dtype=np.float64
        )
    else:
        draws = latent
    lo, hi = model_intervals(np.quantile(draws, q_lo, axis=0), np.quantile(draws, q_hi, axis=0), model_margin, success_margin)
    obs = np.asarray(observed, dtype=np.float64)
    with np.errstate(invalid="ignore"):  # unmeasured rows may be NaN; they are not read
        m = np.asarray(measured_mask, dtype=bool)
        lo, hi = with_measured(lo, hi, obs, m, float(repeatability))
        if ladder is not None:
            lo = knee_guard(lo, *guard_state(obs, m, ladder, float(repeatability)))
    return Bounds(lo=lo, hi=hi)


def rule_bounds(
    posterior: object,
    observed: np.ndarray,
    measured_mask: np.ndarray,
    level: float,
    repeatability: float,
    grid: CellGrid,
    rules: IntervalRules,
) -> Bounds:
    """:func:`credible_bounds` under a campaign's :class:`IntervalRules` (margins, knee guard)."""
    return credible_bounds(
        posterior,
        observed,
        measured_mask,
        level,
        repeatability,
        model_margin=rules.tail_margin,
        success_margin=rules.success_margin,
        ladder=grid_ladder(grid, rules.knee_guard),
    )


def conservative_table(bounds: Bounds) -> np.ndarray:
    """``(n_cells, 4)``: low throughput, high TTFT and completion, low success."""
    return bound_tables(bounds.lo, bounds.hi)[0]


def optimistic_table(bounds: Bounds) -> np.ndarray:
    """``(n_cells, 4)``: high throughput, low TTFT and completion, high success."""
    return bound_tables(bounds.lo, bounds.hi)[1]


def bounds_frame(grid: CellGrid, bounds: Bounds, measured_mask: np.ndarray) -> pd.DataFrame:
    """``bounds.csv``: one row per cell with :data:`BOUNDS_COLUMNS` (a catalogued grid adds
    ``config`` and ``gpus_per_replica``, and ``tp`` is empty for a disaggregated configuration)."""
    lo, hi = bounds.lo, bounds.hi
    frame = pd.DataFrame(
        {
            "workload": [grid.workloads[int(w)] for w in grid.workload_idx],
            "tp": grid.tp.astype(np.int64),
            "load": list(grid.load),
            "measured": np.asarray(measured_mask, dtype=bool),
            "throughput_lo": lo[:, 0],
            "throughput_hi": hi[:, 0],
            "ttft_p99_lo": lo[:, 1],
            "ttft_p99_hi": hi[:, 1],
            "completion_p99_lo": lo[:, 2],
            "completion_p99_hi": hi[:, 2],
            "success_lo": lo[:, 3],
            "success_hi": hi[:, 3],
        },
        columns=list(BOUNDS_COLUMNS),
    )
    if grid.catalogued:  # name each cell's configuration; tp only where it is an aggregated TP
        confs = [grid.serving_config(i) for i in range(grid.n_cells)]
        frame["tp"] = pd.array([c.tp for c in confs], dtype="Int64")
        frame.insert(2, "config", [c.name for c in confs])
        frame.insert(3, "gpus_per_replica", [c.gpus for c in confs])
    return frame


class Attainment(NamedTuple):
    """SLO attainment of every cell (:func:`attainment_bounds`).

    ``draws (n_draws, n_cells)`` per posterior draw; ``lo``, ``median``,
    ``hi`` ``(n_cells,)`` (``lo``/``hi`` the central credible interval, an
    unmeasured cell's widened by the campaign's model margins and knee guard
    as its metric intervals are); ``binding`` int ``(n_cells,)``: the metric
    (:data:`BINDING_METRICS`) with the lowest median probability of being met.
    """

    draws: np.ndarray
    lo: np.ndarray
    median: np.ndarray
    hi: np.ndarray
    binding: np.ndarray
    # ``(n_draws, n_cells)`` the draws the lower (resp. upper) bound is taken of.
    lo_draws: np.ndarray | None = None
    hi_draws: np.ndarray | None = None


def slo_levels(grid: CellGrid, setting: object) -> np.ndarray | None:
    """``(n_cells,)`` each cell's attainment level from a campaign's setting
    (``"point"``: None; one level or one per class)."""
    if isinstance(setting, str):
        return None
    return cell_levels(grid, np.asarray(setting, np.float64))


def cell_levels(grid: CellGrid, level_by_class: np.ndarray | float) -> np.ndarray:
    """``(n_cells,)`` each cell's attainment level from ``(n_classes,)`` (or one float)."""
    q = np.broadcast_to(np.asarray(level_by_class, np.float64), (grid.n_classes,))
    return q[grid.workload_idx]


def _limits(grid: CellGrid, problem: AllocationProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    w = grid.workload_idx
    return problem.success_min[w], problem.ttft_max[w], problem.completion_max[w]


def _shift(latent: np.ndarray, where: np.ndarray, margin: float, success_margin: float, sign: float) -> np.ndarray:
    """``latent (D, C, 4)`` with tails ×e^{sign·margin} and failure ×e^{sign·success_margin} at ``where (C,)``."""
    out = latent.copy()
    f = np.exp(sign * margin)
    out[:, where, 1:3] *= f
    fail = (1.0 - out[:, where, 3]) * np.exp(sign * success_margin)
    out[:, where, 3] = np.clip(1.0 - fail, 0.0, 1.0)
    return out


def attainment_bounds(
    posterior: object,
    grid: CellGrid,
    problem: AllocationProblem,
    observed: np.ndarray,
    measured_mask: np.ndarray,
    level: float,
    repeatability: float,
    rules: IntervalRules,
    *,
    seed: int = 0,
) -> Attainment:
    """Every cell's SLO attainment from a window-noise posterior
    (:func:`fleetsieve_bayes.model.joint.window_probabilities`), with central
    ``level`` credible bounds.

    An unmeasured cell's lower bound is taken with its tails ×``e^margin`` and
    its failure probability ×``e^success_margin`` (the campaign's model
    margins, :mod:`fleetsieve_bayes.decision.intervals` rule 1), its upper
    bound with the reverse and, where the knee guard holds it open, its tails
    at most the largest measured ones beneath it (rule 3). A measured cell's
    bounds are its posterior's, given every window of it; a measured cell none of
    whose windows served (:func:`~fleetsieve_bayes.model.joint.served_nothing`)
    has attainment 0 in every draw.

    Args:
        posterior: a window-noise :class:`~fleetsieve_bayes.model.inference.Posterior`
            (``window`` and ``windows`` set).
        observed: ``(n_cells, 4)`` measured values (the knee guard's floors);
        measured_mask: bool ``(n_cells,)``.
    """
    if getattr(posterior, "window", None) is None:
        raise ValueError("SLO attainment needs a posterior fitted to measurement windows (rows=...)")
    q_lo, q_hi = credible_quantiles(level)
    latent = np.asarray(posterior.latent, np.float64)
    lim = tuple(jnp.asarray(x) for x in _limits(grid, problem))
    key = jax.random.PRNGKey(seed)
    noise, window = jnp.asarray(posterior.noise), jnp.asarray(posterior.window)
    # One draw of every cell's departure serves all three tables: the margins shift unmeasured
    # cells only, whose departure is its prior's (it reads no curve), and a measured cell's
    # reads its own latent alone.
    delta = cell_offsets(key, jnp.asarray(latent), noise, window, posterior.windows)

    def probs(lat: np.ndarray) -> np.ndarray:
        return np.asarray(_probabilities(jnp.asarray(lat), delta, window, *lim), np.float64)

    m = np.asarray(measured_mask, bool)
    p = probs(latent)
    draws = p.prod(axis=-1)
    un = ~m
    pess = probs(_shift(latent, un, rules.tail_margin, rules.success_margin, 1.0)).prod(axis=-1)
    opt_lat = _shift(latent, un, rules.tail_margin, rules.success_margin, -1.0)
    obs = np.asarray(observed, np.float64)
    with np.errstate(invalid="ignore"):
        guarded, floor = guard_state(obs, m, grid_ladder(grid, rules.knee_guard), float(repeatability))
    guarded = np.asarray(guarded, bool)
    if guarded.any():
        # The guard's floors are window values: a window at the floor is the
        # best the model cannot exclude, so the cell's truth is put there.
        fl = np.asarray(floor, np.float64)[guarded]
        opt_lat[:, guarded, 1:3] = np.minimum(opt_lat[:, guarded, 1:3], np.where(fl > 0, fl, 1e-9)[None])
    optim = probs(opt_lat).prod(axis=-1)
    # A measured cell none of whose windows served meets its SLOs in no window (as
    # the point rule reads its measured failure), whatever the curves say of it.
    dead = served_nothing(posterior.windows, m, obs)
    draws[:, dead] = pess[:, dead] = optim[:, dead] = 0.0
    return Attainment(
        draws=draws,
        lo=np.quantile(pess, q_lo, axis=0),
        median=np.median(draws, axis=0),
        hi=np.quantile(optim, q_hi, axis=0),
        binding=np.argmin(np.median(p, axis=0), axis=-1),
        lo_draws=pess,
        hi_draws=optim,
    )


def level_bounds(
    posterior: object,
    grid: CellGrid,
    problem: AllocationProblem,
    observed: np.ndarray,
    measured_mask: np.ndarray,
    credible_level: float,
    repeatability: float,
    rules: IntervalRules,
    slo_levels: np.ndarray,
    *,
    seed: int = 0,
    settled: Sequence[int] = (),
) -> tuple[Bounds, Attainment, np.ndarray, np.ndarray]:
    """Bounds and tables at SLO-attainment levels ``slo_levels (n_cells,)``; the
    optimistic table reads ``settled`` cells at their lower attainment bound
    (:func:`settle`; the returned attainment is settled too).

    The metric intervals of EVERY cell, measured or not, are those of one new
    window of it (curve, the cell's departure given its windows, window noise;
    an unmeasured cell's widened by the model margins, the knee guard applied):
    a measured cell's interval comes from its posterior, except one none of whose
    windows served, which keeps its measured failure. Admissibility is
    attainment against the level (:func:`fleetsieve_bayes.decision.intervals.level_tables`).

    Returns:
        ``(bounds, attainment, conservative (n_cells, 4), optimistic (n_cells, 4))``.
    """
    q_lo, q_hi = credible_quantiles(credible_level)
    latent = np.asarray(posterior.latent, np.float64)
    window = np.asarray(posterior.window, np.float64)
    key_d, key_e = jax.random.split(jax.random.PRNGKey(seed))
    delta = np.asarray(cell_offsets(key_d, jnp.asarray(latent), jnp.asarray(posterior.noise), jnp.asarray(window), posterior.windows))
    eps = np.asarray(jax.random.normal(key_e, latent.shape[:2] + (3,)), np.float64)
    draws = latent.copy()
    draws[..., :3] = latent[..., :3] * np.exp(delta[..., :3] + window[..., :3] * eps)
    s = np.clip(latent[..., 3], 1e-9, 1 - 1e-9)
    draws[..., 3] = 1.0 / (1.0 + np.exp(-(np.log(s / (1 - s)) + delta[..., 3])))
    lo_m, hi_m = np.quantile(draws, q_lo, axis=0), np.quantile(draws, q_hi, axis=0)
    lo, hi = model_intervals(lo_m, hi_m, rules.tail_margin, rules.success_margin)
    m = np.asarray(measured_mask, bool)
    lo, hi = np.where(m[:, None], lo_m, lo), np.where(m[:, None], hi_m, hi)
    obs = np.asarray(observed, np.float64)
    dead = served_nothing(posterior.windows, m, obs)[:, None]  # its failure, as at "point"
    lo, hi = np.where(dead, obs, lo), np.where(dead, obs, hi)
    with np.errstate(invalid="ignore"):
        lo = knee_guard(lo, *guard_state(obs, m, grid_ladder(grid, rules.knee_guard), float(repeatability)))
    bounds = Bounds(lo=lo, hi=hi)
    att = settle(
        attainment_bounds(posterior, grid, problem, observed, m, credible_level, repeatability, rules, seed=seed),
        settled,
    )
    cons, opt = bound_tables(bounds.lo, bounds.hi)
    cons, opt = level_tables(cons, opt, att.lo, att.hi, slo_levels, *_limits(grid, problem))
    return bounds, att, cons, opt


def answer_confidence(answer: str | float, levels: np.ndarray) -> np.ndarray | None:
    """``(n_cells,)`` the confidence an uncertified answer needs of each measured cell,
    P(attainment ≥ its level) (:data:`~fleetsieve_bayes.settings.UNCERTIFIED_ANSWERS`);
    None for ``"conservative"`` (lower bounds instead).

    Args:
        answer: ``[stopping] uncertified_answer``: ``"credible"`` (by level,
            :data:`~fleetsieve_bayes.settings.ANSWER_CONFIDENCE`), ``"best-estimate"``
            (0.5), ``"conservative"``, or a confidence in [0.5, 1).
        levels: ``(n_cells,)`` each cell's attainment level.
    """
    from fleetsieve_bayes.settings import ANSWER_CONFIDENCE

    lv = np.asarray(levels, np.float64)
    if answer == "conservative":
        return None
    if answer == "best-estimate":
        return np.full(lv.shape, 0.5)
    if answer == "credible":
        at, conf = zip(*ANSWER_CONFIDENCE, strict=True)
        return np.interp(lv, at, conf)
    return np.full(lv.shape, float(answer))


def best_estimate_table(
    grid: CellGrid,
    problem: AllocationProblem,
    bounds: Bounds,
    attainment: Attainment,
    measured_mask: np.ndarray,
    levels: np.ndarray,
    confidence: np.ndarray | float = 0.5,
) -> np.ndarray:
    """``(n_cells, 4)``: the table an uncertified campaign answers on at an attainment level
    (``[stopping] uncertified_answer``, :func:`answer_confidence`). A measured cell is
    admissible where the posterior probability that its attainment reaches its level is at
    least its ``confidence`` (the ``1 − confidence`` quantile of its attainment draws reaches
    the level; 0.5: the median); a cell never measured only as in the conservative table (its
    lower bound, model margins included). Values as in the conservative table; a cell the
    conservative table admits is admitted here too (for a confidence below the lower bound's
    own), so its allocation serves at least as much.

    Args:
        bounds: the round's :class:`Bounds` (``lo``/``hi (n_cells, 4)``);
        attainment: the round's :class:`Attainment` (``draws (n_draws, n_cells)``);
        measured_mask: bool ``(n_cells,)``; levels: ``(n_cells,)`` each cell's level;
        confidence: ``(n_cells,)`` or one value in [0.5, 1).
    """
    cons, _ = bound_tables(bounds.lo, bounds.hi)
    m = np.asarray(measured_mask, bool)
    conf = np.broadcast_to(np.asarray(confidence, np.float64), m.shape)
    draws = np.asarray(attainment.draws, np.float64)
    att = np.asarray(attainment.median, np.float64).copy()
    for c in np.unique(conf):
        if c != 0.5:
            sel = conf == c
            att[sel] = np.quantile(draws[:, sel], 1.0 - c, axis=0)
    att = np.where(m, att, np.asarray(attainment.lo, np.float64))
    table, _ = level_tables(cons, cons, att, att, levels, *_limits(grid, problem))
    return np.asarray(table, np.float64)


def committed_attainment(
    grid: CellGrid,
    committed: list[int],
    attainment: Attainment,
    windows: np.ndarray,
    levels: np.ndarray,
) -> list[dict[str, object]]:
    """What result.json reports of each committed cell at an attainment level
    (docs/contracts.md): its ``windows``, ``attainment`` {median, lo, hi}, the
    ``binding`` metric (:data:`BINDING_METRICS`) and its ``level``.

    Args:
        committed: cell indices the allocation commits to.
        windows: int ``(n_cells,)`` windows measured per cell.
        levels: ``(n_cells,)`` each cell's level.
    """
    out = []
    for c in committed:
        w, tp, load = grid.key(int(c))
        out.append(
            {
                "workload": w,
                "tp": int(tp),
                "load": load,
                "windows": int(windows[c]),
                "level": float(levels[c]),
                "attainment": {
                    "median": float(attainment.median[c]),
                    "lo": float(attainment.lo[c]),
                    "hi": float(attainment.hi[c]),
                },
                "binding": BINDING_METRICS[int(attainment.binding[c])],
            }
        )
    return out


def cell_to_repeat(
    committed: list[int], attainment: Attainment, levels: np.ndarray, repeatable: np.ndarray, windows: np.ndarray,
    *, capped_first: bool = False,
) -> int | None:
    """The committed cell a repeat would help most: the one whose attainment's
    lower bound falls furthest below its level while its upper bound reaches it
    (more windows can settle it), preferring cells that may still be repeated;
    None when every committed cell with a window has its lower bound at its level.

    Args:
        repeatable: bool ``(n_cells,)`` cells that may be measured again now (:func:`repeatable_mask`).
        windows: int ``(n_cells,)`` windows held of each cell: a cell never measured
            (or measured without running) is no cell to *repeat*.
        capped_first: prefer the cells that may NOT be measured again: what a campaign
            that stopped undecided with rounds left names, since it would have measured
            any repeatable cell that could settle its decision; what holds the decision
            open is then a cell at its window limit (:func:`capped_hopes`).
    """
    short = [c for c in committed if _straddles(c, attainment, levels, windows)]
    if not short:
        return None
    short.sort(key=lambda c: (bool(repeatable[c]) == capped_first, float(attainment.lo[c] - levels[c])))
    return int(short[0])


def _straddles(c: int, attainment: Attainment, levels: np.ndarray, windows: np.ndarray) -> bool:
    """Whether measured cell ``c`` (a window held) may meet its level and may miss it."""
    return bool(windows[c] >= 1 and attainment.lo[c] < levels[c] <= attainment.hi[c] + 1e-12)


def capped_hopes(
    committed: list[int], attainment: Attainment, levels: np.ndarray, repeatable: np.ndarray, windows: np.ndarray
) -> list[int]:
    """The committed cells whose attainment straddles their level and that may not be
    measured again (their window limit, or the backend's windows): hopes no window can
    test. Arguments as :func:`cell_to_repeat`'s."""
    return [int(c) for c in committed if _straddles(c, attainment, levels, windows) and not repeatable[c]]


def settle(attainment: Attainment, cells: Sequence[int]) -> Attainment:
    """``attainment`` with the upper bound of ``cells`` at their lower bound: what the
    optimistic table reads of a cell no window may be added to (:func:`capped_hopes`),
    so that acquisition turns to the hopes a measurement can test. The certificate and
    the cell to repeat keep reading the unsettled bounds."""
    idx = np.asarray(list(cells), np.int64)
    if idx.size == 0:
        return attainment
    hi = np.asarray(attainment.hi, np.float64).copy()
    hi[idx] = np.asarray(attainment.lo, np.float64)[idx]
    hi_draws = attainment.hi_draws
    if hi_draws is not None and attainment.lo_draws is not None:
        hi_draws = np.asarray(hi_draws).copy()
        hi_draws[:, idx] = np.asarray(attainment.lo_draws)[:, idx]
    return attainment._replace(hi=hi, hi_draws=hi_draws)


def repeatable_mask(counts: np.ndarray, limits: np.ndarray, server_failed: np.ndarray,
                    max_windows_per_cell: int) -> np.ndarray:
    """``(n_cells,)`` bool from ``counts (n_cells,)`` windows held, ``limits (n_cells,)``
    windows the backend can give (``inf``: no limit) and ``server_failed (n_cells,)``
    (see :func:`fleetsieve_bayes.campaign.windows.repeatable`): a cell with a window, fewer than
    ``max_windows_per_cell`` of them and fewer than its backend can give, whose server served."""
    if max_windows_per_cell < 1:
        raise ValueError(f"max_windows_per_cell must be >= 1, got {max_windows_per_cell}")
    counts = np.asarray(counts)
    return (counts >= 1) & (counts < max_windows_per_cell) & (counts < np.asarray(limits)) & ~np.asarray(
        server_failed, bool)


def repeat_entry(
    grid: CellGrid, cell: int, windows: np.ndarray, max_windows_per_cell: int, window_limit: np.ndarray | None = None
) -> dict[str, object]:
    """What result.json's ``repeat`` says of the cell to repeat (docs/contracts.md):
    ``{workload, tp, load, windows, limit, limited_by}``. ``limit`` is the most
    windows the campaign may hold of it, ``[stopping] max_windows_per_cell`` or the
    backend's windows of it (``window_limit (n_cells,)``, ``inf``: no limit; a
    replayed cell has its table's rows), whichever is fewer; ``limited_by`` names
    which (``"max_windows_per_cell"`` or ``"backend"``).

    Args:
        windows: int ``(n_cells,)`` windows measured per cell.
    """
    w, tp, load = grid.key(int(cell))
    backend = float("inf") if window_limit is None else float(np.asarray(window_limit)[cell])
    by_backend = backend < max_windows_per_cell
    return {
        "workload": w, "tp": int(tp), "load": load, "windows": int(windows[cell]),
        "limit": int(backend) if by_backend else int(max_windows_per_cell),
        "limited_by": "backend" if by_backend else "max_windows_per_cell",
    }


def repeat_at_limit(rep: Mapping[str, Any]) -> bool:
    """Whether the cell to repeat (a :func:`repeat_entry`) holds as many windows as it
    may; an entry written before ``limit`` existed reads as not at its limit."""
    limit = rep.get("limit")
    return limit is not None and int(rep["windows"]) >= int(limit)


def repeat_advice(rep: Mapping[str, Any]) -> str:
    """One line on the cell to repeat (a :func:`repeat_entry`): measure it again, or,
    when it holds as many windows as it may, what to raise first. Entries written
    before ``limit`` existed read as not at their limit."""
    where = f"{rep['workload']} TP{rep['tp']}@{rep['load']}"
    n = int(rep["windows"])
    held = f"{n} window{'s' if n != 1 else ''}"
    if not repeat_at_limit(rep):
        return f"to settle the decision, measure {where} again ({held} so far)"
    if rep.get("limited_by") == "backend":
        return (f"to settle the decision, {where} needs another window, and the backend has no more "
                f"({held}, every replicate row the table holds of it)")
    return (f"to settle the decision, {where} needs another window, and it has {held}, the most "
            f"[stopping] max_windows_per_cell = {int(rep['limit'])} allows: raise it and start a new run "
            "with --reuse-measurements from this one")


def attainment_lines(joint: dict[str, object] | None) -> list[str]:
    """The per-class attainment lines (:func:`class_attainment_line`) of a round's
    joint-check record, and the cell to repeat; empty at ``"point"``."""
    if not joint or joint.get("committed") is None:
        return []
    cells = list(joint["committed"])  # type: ignore[arg-type]
    names = list(dict.fromkeys(str(c["workload"]) for c in cells))
    out = [class_attainment_line(n, cells) for n in names]
    rep = joint.get("repeat")
    if isinstance(rep, Mapping):
        out.append(repeat_advice(rep))
    return out


def class_attainment_line(name: str, cells: list[dict[str, object]]) -> str:
    """One line per class for ``status``, ``run`` and the report: "chat meets its
    SLOs in about 96 % of windows [91, 99] (TP4@C64, 3 windows)" from
    :func:`committed_attainment` entries of that class (the least attaining one)."""
    mine = [c for c in cells if c["workload"] == name]
    if not mine:
        return f"{name}: no committed cell"
    c = min(mine, key=lambda r: r["attainment"]["median"])  # type: ignore[index]
    a = c["attainment"]
    return (
        f"{name} meets its SLOs in about {100 * a['median']:.0f} % of windows "  # type: ignore[index]
        f"[{100 * a['lo']:.0f}, {100 * a['hi']:.0f}] (TP{c['tp']}@{c['load']}, "  # type: ignore[index]
        f"{c['windows']} window{'s' if c['windows'] != 1 else ''}; binding: {c['binding']})"
    )


def decision_tables(
    posterior: object,
    grid: CellGrid,
    problem: AllocationProblem,
    observed: np.ndarray,
    measured_mask: np.ndarray,
    credible_level: float,
    repeatability: float,
    rules: IntervalRules,
    levels: np.ndarray | None = None,
    *,
    seed: int = 0,
    settled: Sequence[int] = (),
) -> tuple[Bounds, Attainment | None, np.ndarray, np.ndarray]:
    """The bounds and the two tables a round decides on.

    ``levels`` None (the ``"point"`` rule): :func:`rule_bounds` and its
    conservative and optimistic tables, no attainment. ``levels (n_cells,)``:
    :func:`level_bounds` at those levels (a window-noise posterior), ``settled``
    cells read at their lower attainment bound in the optimistic table.

    Returns:
        ``(bounds, attainment or None, conservative (n_cells, 4), optimistic (n_cells, 4))``;
        a committed cell is within SLO when the conservative table says so
        (pass it to :func:`~fleetsieve_bayes.decision.certificate.certify` as
        the measured values at a level).
    """
    if levels is None:
        b = rule_bounds(posterior, observed, measured_mask, credible_level, repeatability, grid, rules)
        return b, None, conservative_table(b), optimistic_table(b)
    return level_bounds(
        posterior, grid, problem, observed, measured_mask, credible_level, repeatability, rules, levels, seed=seed,
        settled=settled,
    )
