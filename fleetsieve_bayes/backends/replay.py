"""The replay backend: reveals cells from a fully measured table."""

from __future__ import annotations

import time
from typing import Any

from fleetsieve_bayes.allocation.problem import grid_from_table
from fleetsieve_bayes.backends import Backend
from fleetsieve_bayes.campaign.config import Campaign
from fleetsieve_bayes.table import read_table


def make_replay_backend(campaign: Campaign) -> Backend:
    """Candidate cells are the table's cells for the campaign's workloads; measuring one returns its row."""
    path = campaign.measurement.table
    assert path is not None  # validated with the campaign
    df = read_table(path)
    grid = grid_from_table(df, campaign.workload_names, source=str(path))
    rows = {
        (r["workload"], int(r["tp"]), str(r["load"])): {k: _plain(v) for k, v in r.items()}
        for r in df.to_dict(orient="records")
    }

    delay_s = float(campaign.measurement.options.get("delay_s", 0.0))
    # A compressed clock: each cell really takes ``duration_s × time_scale``
    # wall seconds (exercises concurrent measurement without hardware).
    time_scale = float(campaign.measurement.options.get("time_scale", 0.0))

    def measure(cell: int) -> dict[str, Any]:
        row = dict(rows[grid.key(cell)])
        wait = delay_s + time_scale * float(row["duration_s"])
        if wait:
            time.sleep(wait)
        return row

    return Backend(
        grid=grid,
        measure=measure,
        close=lambda: None,
        expected_duration_s=grid.duration_s,
        preflight=lambda cell: None,
    )


def _plain(v: Any) -> Any:
    """numpy/pandas scalars → Python scalars, so rows serialise to JSON."""
    if hasattr(v, "item"):
        return v.item()
    return v
