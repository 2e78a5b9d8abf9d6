"""MCMC diagnostics of a stored posterior: r_hat, bulk/tail ESS, divergences.

Reads the InferenceData written by
:func:`fleetsieve_bayes.model.inference.save_posterior`. The table lists the
parameters (per-cell sites are deterministic functions of them); the
``decision_*`` headline numbers are over what a decision reads from the
posterior (:func:`decision_samples`) — the quantities a certificate's
convergence check judges (:mod:`fleetsieve_bayes.model.converged_fit`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fleetsieve_bayes.arviz_import import import_arviz
from fleetsieve_bayes.model.storage import load_idata

az = import_arviz()

__all__ = [
    "summarize",
    "diagnose_file",
    "convergence_diagnostics",
    "decision_samples",
    "failed_cells",
    "minor_mode_chains",
    "MINOR_MODE_LP_GAP",
]

_SKIP = ("latent", "capacity")
# Derived per-cell sites that are not latent metrics.
_DERIVED_CELL_SITES = ("capacity",)


def convergence_diagnostics(samples: dict[str, np.ndarray], diverging: np.ndarray) -> dict[str, Any]:
    """r_hat max, bulk-ESS min over every scalar of ``samples`` (each ``(chains, draws, ...)``)
    and the number of divergent transitions ``diverging (chains, draws)``.

    Non-finite r_hat/ESS (a quantity constant across draws, e.g. a clipped
    tail) are skipped, as ``fleetsieve-bayes diagnose`` does.
    """
    r_max, e_min = 1.0, float("inf")
    worst = ""
    for name, arr in samples.items():
        if name in _DERIVED_CELL_SITES:
            continue
        a = np.asarray(arr, np.float64)
        a = a.reshape(a.shape[0], a.shape[1], -1)
        ds = az.convert_to_dataset({"x": a})
        with np.errstate(divide="ignore", invalid="ignore"):  # a constant scalar: NaN, skipped below
            r = np.asarray(az.rhat(ds)["x"].values, np.float64).ravel()
            e = np.asarray(az.ess(ds, method="bulk")["x"].values, np.float64).ravel()
        r, e = r[np.isfinite(r)], e[np.isfinite(e)]
        if r.size and r.max() > r_max:
            r_max = float(r.max())
            worst = name
        if e.size and e.min() < e_min:
            e_min = float(e.min())
    return {
        "r_hat_max": float(r_max),
        "ess_bulk_min": float(e_min) if np.isfinite(e_min) else None,
        "divergences": int(np.asarray(diverging).sum()),
        "worst_r_hat_site": worst,
    }


def failed_cells(measured: np.ndarray, fit_mask: np.ndarray) -> np.ndarray:
    """bool ``(n_cells,)``: measured, and no metric of the cell in the likelihood
    (a start-up OOM, a run where every request failed); ``measured (n_cells,)``,
    ``fit_mask (n_cells, 4)``."""
    return np.asarray(measured, bool) & ~np.asarray(fit_mask, bool).any(axis=1)


def decision_samples(samples: dict[str, np.ndarray], failed: np.ndarray) -> dict[str, np.ndarray]:
    """What a decision reads from the posterior: ``latent (chains, draws, n_cells - n_failed, 4)``
    without the ``failed`` cells (bool ``(n_cells,)``; their measurement is
    what the decision reads, and their latent metrics — what a TP that does not
    fit would serve — are pinned by no data) and ``noise (chains, draws, 4)``."""
    keep = ~np.asarray(failed, bool)
    return {"latent": np.asarray(samples["latent"])[:, :, keep], "noise": np.asarray(samples["noise"])}


def summarize(idata: Any) -> dict[str, Any]:
    """``{"r_hat_max", "ess_bulk_min", "ess_tail_min", "divergences", "draws", "chains", "method",
    "decision_r_hat_max", "decision_ess_bulk_min", "failed_under_load", "parameters": [...]}``.

    ``failed_under_load``: the cells (``cell`` coordinate) whose failed run the
    model read as overload (:func:`fleetsieve_bayes.model.joint.load_failures`);
    empty for a file without that record.

    ``parameters`` has one entry per scalar parameter: ``{name, r_hat, ess_bulk, ess_tail}``;
    ``r_hat_max`` etc. are over them. ``decision_*`` are over
    :func:`decision_samples` (cells measured as failures are known from the
    ``constant_data`` group's ``measured`` and the observed data; a file
    without it counts every cell).
    """
    post = idata.posterior
    names = [v for v in post.data_vars if v not in _SKIP]
    with np.errstate(divide="ignore", invalid="ignore"):  # a constant scalar: NaN, reported as None
        rhat = az.rhat(idata, var_names=names)
        bulk = az.ess(idata, var_names=names, method="bulk")
        tail = az.ess(idata, var_names=names, method="tail")
    rows: list[dict[str, Any]] = []
    for v in names:
        r = np.atleast_1d(np.asarray(rhat[v].values, dtype=float)).ravel()
        b = np.atleast_1d(np.asarray(bulk[v].values, dtype=float)).ravel()
        t = np.atleast_1d(np.asarray(tail[v].values, dtype=float)).ravel()
        shape = post[v].shape[2:]
        for j in range(r.size):
            label = v if not shape else f"{v}[{','.join(str(i) for i in np.unravel_index(j, shape))}]"
            rows.append({"name": label, "r_hat": _f(r[j]), "ess_bulk": _f(b[j]), "ess_tail": _f(t[j])})
    div = 0
    if "sample_stats" in idata.groups() and "diverging" in idata.sample_stats:
        div = int(np.asarray(idata.sample_stats["diverging"].values).sum())
    finite = lambda key: [r[key] for r in rows if r[key] is not None]  # noqa: E731
    decision = _decision_diagnostics(idata)
    return {
        **decision,
        "r_hat_max": max(finite("r_hat"), default=None),
        "ess_bulk_min": min(finite("ess_bulk"), default=None),
        "ess_tail_min": min(finite("ess_tail"), default=None),
        "divergences": div,
        "chains": int(post.sizes["chain"]),
        "draws": int(post.sizes["draw"]),
        "method": str(idata.posterior.attrs.get("inference_method", "")),
        "failed_under_load": _failed_under_load(idata),
        "parameters": rows,
    }


def _failed_under_load(idata: Any) -> list[int]:
    if "constant_data" not in idata.groups() or "failed_under_load" not in idata.constant_data:
        return []
    return [int(c) for c in np.flatnonzero(np.asarray(idata.constant_data["failed_under_load"].values, bool))]


def _decision_diagnostics(idata: Any) -> dict[str, Any]:
    post = idata.posterior
    if "latent" not in post or "noise" not in post:
        return {"decision_r_hat_max": None, "decision_ess_bulk_min": None}
    n_cells = int(post["latent"].shape[2])
    failed = np.zeros(n_cells, bool)
    if "constant_data" in idata.groups() and "measured" in idata.constant_data and "observed_data" in idata.groups():
        measured = np.asarray(idata.constant_data["measured"].values, bool)
        fit = np.isfinite(np.asarray(idata.observed_data["y"].values, float))
        failed = failed_cells(measured, fit)
    kept = decision_samples({"latent": post["latent"].values, "noise": post["noise"].values}, failed)
    diag = convergence_diagnostics(kept, np.zeros(post["noise"].shape[:2], bool))
    return {"decision_r_hat_max": diag["r_hat_max"], "decision_ess_bulk_min": diag["ess_bulk_min"]}


def _f(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)


def diagnose_file(path: str | Path) -> dict[str, Any]:
    """:func:`summarize` of a ``posterior.nc`` (InputError if missing/corrupt)."""
    return summarize(load_idata(path))


# A chain whose log density sits this many nats below the best chain's, with
# no overlap between the two, is stuck in a minor mode (see minor_mode_chains).
MINOR_MODE_LP_GAP = 10.0


def minor_mode_chains(lp: np.ndarray, gap: float = MINOR_MODE_LP_GAP) -> dict[int, int]:
    """Chains stuck in a minor mode, each mapped to the chain it should restart from.

    The interior-knee model has local modes that a chain started far from the
    data can settle in — e.g. a low smooth-min sharpness with a capacity twice
    the truth, which explains a saturating throughput almost as well. Such a
    chain samples log densities ~20 nats below the others for ever: r_hat
    fails, and sampling longer never fixes it. A mode whose typical log
    density is ``gap`` nats lower carries a negligible share of the posterior
    unless it is ``e^gap`` times wider, which a sharply identified model
    does not allow, so the chain is restarted inside the best chain's mode
    rather than averaged in; the restart count is reported with the
    diagnostics, and a chain that keeps returning there keeps r_hat high.

    Args:
        lp: ``(chains, draws)`` log density of each draw.
        gap: nats between chain means that, with disjoint 10–90 % ranges,
            marks a minor mode.

    Returns:
        ``{stuck chain: donor chain}`` (donors cycle over the chains in the
        best chain's mode); empty when every chain agrees.
    """
    lp = np.asarray(lp, np.float64)
    mean = lp.mean(axis=1)
    lo, hi = np.quantile(lp, 0.1, axis=1), np.quantile(lp, 0.9, axis=1)
    best = int(np.argmax(mean))
    stuck = [c for c in range(lp.shape[0]) if mean[best] - mean[c] > gap and hi[c] < lo[best]]
    good = [c for c in range(lp.shape[0]) if c not in stuck]
    return {c: good[k % len(good)] for k, c in enumerate(stuck)}
