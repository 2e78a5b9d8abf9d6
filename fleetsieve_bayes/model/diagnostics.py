"""MCMC diagnostics of a stored posterior: r_hat, bulk/tail ESS, divergences.

Reads the InferenceData written by
:func:`fleetsieve_bayes.model.inference.save_posterior`. Per-cell latent sites
(``latent``, ``capacity``) are left out: they are deterministic functions of the
parameters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import arviz as az
import numpy as np

from fleetsieve_bayes.model.storage import load_idata

__all__ = ["summarize", "diagnose_file"]

_SKIP = ("latent", "capacity")


def summarize(idata: Any) -> dict[str, Any]:
    """``{"r_hat_max", "ess_bulk_min", "ess_tail_min", "divergences", "draws", "chains", "method", "parameters": [...]}``.

    ``parameters`` has one entry per scalar parameter: ``{name, r_hat, ess_bulk, ess_tail}``.
    """
    post = idata.posterior
    names = [v for v in post.data_vars if v not in _SKIP]
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
    return {
        "r_hat_max": max(finite("r_hat"), default=None),
        "ess_bulk_min": min(finite("ess_bulk"), default=None),
        "ess_tail_min": min(finite("ess_tail"), default=None),
        "divergences": div,
        "chains": int(post.sizes["chain"]),
        "draws": int(post.sizes["draw"]),
        "method": str(idata.posterior.attrs.get("inference_method", "")),
        "parameters": rows,
    }


def _f(x: float) -> float | None:
    return None if not np.isfinite(x) else float(x)


def diagnose_file(path: str | Path) -> dict[str, Any]:
    """:func:`summarize` of a ``posterior.nc`` (InputError if missing/corrupt)."""
    return summarize(load_idata(path))
