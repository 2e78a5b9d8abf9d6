"""The replay backend: reveals cells from a fully measured table.

Campaign keys (``[measurement]``, with ``backend = "replay"``): ``table`` (a
measurement table, relative to the campaign file; required), ``delay_s``
(wall seconds each replayed measurement takes, to watch progress or rehearse
interruptions; default 0) and ``time_scale`` (a compressed clock: each cell
also takes ``duration_s × time_scale`` wall seconds; default 0).

A table with a ``replicate`` column may hold several windows of a cell: the
k-th measurement of a cell (``replicate = k``) replays its row with
``replicate = k``. A cell has as many windows as rows
(:attr:`~fleetsieve_bayes.backends.Backend.windows_available`); asking for one
more is an :class:`~fleetsieve_bayes.errors.InputError` naming the cell and the
table — never a crash, never a row used twice.
"""

from __future__ import annotations

import time
from typing import Any

from fleetsieve_bayes.allocation.problem import grid_from_table, row_pools
from fleetsieve_bayes.backends.base import Backend
from fleetsieve_bayes.campaign.config import Campaign
from fleetsieve_bayes.configs import table_for_campaign
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import read_table, replicates

REPLAY_KEYS: frozenset[str] = frozenset({"table", "delay_s", "time_scale"})


def validate_replay_options(campaign: Campaign) -> None:
    """Check ``[measurement]`` for ``backend = "replay"``: one line naming the file and key."""
    import difflib
    import math

    opts = campaign.measurement.options

    def fail(key: str, msg: str) -> InputError:
        return InputError(f"{campaign.path}: [measurement] {key}: {msg}")

    for key in opts:
        if key not in REPLAY_KEYS:
            close = difflib.get_close_matches(key, sorted(REPLAY_KEYS), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise fail(key, f"unknown key {key!r}{hint}; allowed: {', '.join(sorted(REPLAY_KEYS))}")
    if "table" not in opts:
        raise fail("table", "missing (the replay backend needs a measured table)")
    if not isinstance(opts["table"], str) or not opts["table"].strip():
        raise fail("table", f"expected a non-empty string, got {opts['table']!r}")
    table = campaign.measurement.table
    assert table is not None
    if table.is_dir():
        raise fail("table", f"{table} is a directory, not a table file")
    if not table.is_file():
        raise fail("table", f"file not found: {table}")
    for key in ("delay_s", "time_scale"):
        if key in opts:
            v = opts[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(float(v)) or v < 0:
                raise fail(key, f"must be a finite number >= 0, got {v!r}")


def make_replay_backend(campaign: Campaign) -> Backend:
    """Candidate cells are the table's cells for the campaign's workloads; the k-th
    measurement of a cell returns its replicate-k row."""
    path = campaign.measurement.table
    assert path is not None  # validated with the campaign
    df = read_table(path)
    configs = campaign.configs
    df = table_for_campaign(df, configs, str(path), str(campaign.path))  # catalogued: tp is each replica's GPUs
    # Several [[fleet.pools]]: one table holds every GPU type, a cell is keyed by its GPU too.
    pools = campaign.pool_names if campaign.pool_names and len(campaign.pool_names) > 1 else None
    grid = grid_from_table(df, campaign.workload_names, source=str(path), pools=pools, configs=configs)
    df = df[df["workload"].isin(campaign.workload_names)]
    gpu = [()] * len(df) if pools is None else [(pools[j],) for j in row_pools(df, pools, str(path))]
    windows: dict[tuple[Any, ...], dict[int, dict[str, Any]]] = {}
    for r, rep, g in zip(df.to_dict(orient="records"), replicates(df).tolist(), gpu, strict=True):
        conf = r["config"] if configs is not None else int(r["tp"])
        windows.setdefault((r["workload"], conf, str(r["load"]), *g), {})[rep] = {
            k: _plain(v) for k, v in r.items()
        }

    delay_s = float(campaign.measurement.options.get("delay_s", 0.0))
    # A compressed clock: each cell really takes ``duration_s × time_scale``
    # wall seconds (exercises concurrent measurement without hardware).
    time_scale = float(campaign.measurement.options.get("time_scale", 0.0))

    def available(cell: int) -> int:
        return len(windows[grid.key(cell)])

    def measure(cell: int, replicate: int = 0) -> dict[str, Any]:
        rows = windows[grid.key(cell)]
        if replicate not in rows:
            raise InputError(
                f"{path}: cell {grid.describe(cell)}: window {replicate + 1} (replicate {replicate}) was asked for "
                f"but the table holds {len(rows)} window(s) of it; a replayed cell cannot be measured again "
                f"once its rows are used up"
            )
        row = dict(rows[replicate])
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
        windows_available=available,
    )


def _plain(v: Any) -> Any:
    """numpy/pandas scalars → Python scalars, so rows serialise to JSON."""
    if hasattr(v, "item"):
        return v.item()
    return v
