"""Reading a campaign directory: the one reader behind ``status``, ``report`` and the plots.

:func:`load_campaign_dir` reads the journal (typed records; a running or
killed campaign keeps it complete up to its last record) and ``result.json``
when the campaign finished, validates both, and says whether a ``run`` holds
the directory right now. :func:`read_measurements`, :func:`read_bounds` and
:func:`read_posterior` read the derived files. Nothing here imports JAX or
matplotlib, so ``status`` stays fast.

SLOs and demands come from, in order: an explicit campaign file, the journal
header's ``workloads``, else they are unknown (figures then draw no SLO lines
and count every cell as feasible).
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd

from fleetsieve_bayes.campaign.journal import (
    JOURNAL_NAME,
    LOCK_NAME,
    Header,
    MeasurementRecord,
    RoundRecord,
    held_budget,
    read_records,
    unique_rounds,
)
from fleetsieve_bayes.errors import InputError

__all__ = [
    "FINISHED",
    "RUNNING",
    "STOPPED",
    "CampaignView",
    "load_campaign_dir",
    "read_result",
    "fleet_words",
    "is_locked",
    "read_measurements",
    "read_bounds",
    "read_posterior",
]

FINISHED, RUNNING, STOPPED = "finished", "running", "stopped"
RESULT_NAME = "result.json"


class CampaignView(NamedTuple):
    """What a campaign directory says, read without JAX."""

    directory: Path
    header: Header
    measurements: list[MeasurementRecord]  # in order
    rounds: list[RoundRecord]  # one per round number, in order
    result: dict[str, Any] | None  # result.json (validated), None while running / when killed
    state: str  # finished | running | stopped (killed or interrupted, no result.json)
    workloads: tuple[str, ...]
    slos: dict[str, dict[str, Any]]  # workload → {success_min, ttft_p99_s, completion_p99_s}
    demand: dict[str, float]  # workload → req/s (empty when unknown)
    epsilon: float | None
    gpus: int | None
    slo_source: str  # where the SLOs came from (for the reader)
    # The profiling budget it last ran under ({max_gpu_seconds, max_wall_s}, None: no limit).
    budget: dict[str, float | None] | None = None

    @property
    def n_candidates(self) -> int:
        return len(self.header.cells)

    @property
    def gpu_seconds(self) -> float:
        return float(sum(r.gpu_seconds for r in self.measurements))

    @property
    def spent_gpu_seconds(self) -> float:
        """GPU-seconds against the budget: result.json's (cancelled cells included) when
        finished, else the measured windows'."""
        if self.result is not None and _is_number(self.result.get("gpu_seconds")):
            return float(self.result["gpu_seconds"])
        return self.gpu_seconds

    def budget_line(self) -> str | None:
        """``GPU-seconds 9,600 of 9,600 budget`` (and the wall clock's), None without a budget."""
        b = self.budget or {}
        parts = []
        if b.get("max_gpu_seconds") is not None:
            parts.append(f"GPU-seconds {self.spent_gpu_seconds:,.0f} of {float(b['max_gpu_seconds']):,.0f}")
        if b.get("max_wall_s") is not None:
            wall = (self.result or {}).get("profiling_wall_s")
            spent = "?" if not _is_number(wall) else f"{float(wall):,.0f}"
            parts.append(f"profiling wall {spent} s of {float(b['max_wall_s']):,.0f} s")
        if not parts:
            return None
        stopped = bool(((self.result or {}).get("budget") or {}).get("stopped"))
        return "budget: " + ", ".join(parts) + (" — stopped by the budget" if stopped else "")

    @property
    def alternatives(self) -> list[dict[str, Any]]:
        """result.json's ranked alternative fleets (empty while running, or when it ranks none)."""
        return list((self.result or {}).get("alternatives") or [])

    def alternative_rows(self) -> list[dict[str, str]]:
        """The ranking as text, one row per alternative: ``rank``, ``fleet`` (``chat TP4@C96 ×2,
        code TP4@C96 ×2``), ``p_epsilon_optimal``, ``p_slo_met``, ``gpus``, ``usd_per_hour``
        (empty where unpriced) and ``predicted`` (the cells it rests on that are only predicted)."""
        rows = []
        for e in self.alternatives:
            usd = e.get("usd_per_hour")
            rows.append({
                "rank": str(e.get("rank")),
                "fleet": fleet_words(e.get("allocation"), self.workloads),
                "p_epsilon_optimal": _prob(e.get("p_epsilon_optimal")),
                "p_slo_met": _prob(e.get("p_slo_met")),
                "gpus": str(e.get("gpus")),
                "usd_per_hour": "" if not _is_number(usd) else f"{float(usd):,.2f}",
                "predicted": ", ".join(f"{c['workload']} TP{c['tp']}@{c['load']}" for c in e.get("predicted_cells") or [])
                or "none (all measured)",
            })
        return rows

    def alternatives_title(self) -> str:
        """``Alternatives (ranked by P(ε-optimal) on 6,400 certifying draws)``."""
        d = (self.result or {}).get("alternatives_draws") or {}
        if not _is_number(d.get("draws")):
            return "Alternatives (ranked by P(ε-optimal))"
        which = f" {d['posterior']}" if d.get("posterior") else ""
        return f"Alternatives (ranked by P(ε-optimal) on {int(d['draws']):,}{which} draws)"

    @property
    def last_round(self) -> RoundRecord | None:
        return self.rounds[-1] if self.rounds else None

    @property
    def status(self) -> str:
        """The campaign's status: result.json's, else the last round's certificate, else 'initial design'."""
        if self.result is not None:
            return str(self.result["status"])
        if self.rounds:
            return self.rounds[-1].certificate
        return "initial design"

    @property
    def decided_allocation(self) -> dict[str, Any] | None:
        """The allocation to explain: result.json's, else the last round's conservative one."""
        if self.result is not None:
            return self.result.get("allocation")
        last = self.last_round
        return None if last is None else last.conservative.allocation


def fleet_words(alloc: dict[str, Any] | None, workloads: tuple[str, ...] = ()) -> str:
    """An allocation in words: ``chat TP4@C96 ×2, code TP4@C96 ×2`` (a pool's GPU type after
    its cell; a class given nothing: ``code none``); ``infeasible`` for None."""
    if alloc is None:
        return "infeasible"
    parts = []
    for w in list(workloads) + [w for w in alloc if w not in workloads]:
        a = alloc.get(w)
        if a is None:
            continue
        on = f" {a['gpu']}" if a.get("gpu") else ""
        parts.append(f"{w} TP{a['tp']}@{a['load']} ×{a['replicas']}{on}" if a.get("replicas") else f"{w} none")
    return ", ".join(parts)


def _prob(x: Any) -> str:
    return "—" if not _is_number(x) else f"{float(x):.3f}"


def is_locked(directory: Path) -> bool:
    """Whether a ``run`` currently holds the directory (flock dies with its process)."""
    lock = directory / LOCK_NAME
    if not lock.exists():
        return False
    try:
        fd = os.open(lock, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # closing releases our shared lock, if we got it
    return False


def _is_number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float))


def read_result(path: Path) -> dict[str, Any]:
    """Read and validate ``result.json`` (the shape ``run`` writes).

    Raises:
        InputError: unreadable, not JSON, or a field of the wrong shape (named).
    """
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, OSError) as exc:
        raise InputError(f"{path}: cannot read result ({exc})") from None
    if not isinstance(result, dict):
        raise InputError(f"{path}: expected a JSON object, got {type(result).__name__}")

    def bad(field: str, want: str) -> InputError:
        return InputError(f"{path}: field {field!r} must be {want}, got {result.get(field)!r}"[:300])

    if not isinstance(result.get("status"), str):
        raise bad("status", "a string")
    if "gpu_seconds" in result and not _is_number(result["gpu_seconds"]):
        raise bad("gpu_seconds", "a number")
    if "measured" in result:
        m = result["measured"]
        if not isinstance(m, list) or not all(
            isinstance(c, dict) and {"workload", "load"} <= set(c) and ({"tp", "config"} & set(c)) for c in m
        ):
            raise bad("measured", "a list of {workload, tp or config, load}")
    alloc = result.get("allocation")
    if alloc is not None:
        if not isinstance(alloc, dict):
            raise bad("allocation", "an object {workload: {tp, load, replicas}} or null")
        for w, e in alloc.items():
            if not isinstance(e, dict) or not _is_number(e.get("replicas", 0)) or (
                e.get("tp") is not None and not _is_number(e.get("tp"))
            ):
                raise InputError(f"{path}: field 'allocation.{w}' must be {{tp, load, replicas}}, got {e!r}"[:300])
    alts = result.get("alternatives")
    if alts is not None:
        if not isinstance(alts, list):
            raise bad("alternatives", "a list or null")
        for i, e in enumerate(alts):
            if not isinstance(e, dict) or not isinstance(e.get("allocation"), dict) or not _is_number(e.get("rank")):
                raise InputError(f"{path}: field 'alternatives[{i}]' must be {{rank, allocation, ...}}, got {e!r}"[:300])
    for field in ("objective", "certificate", "timings"):
        if result.get(field) is not None and not isinstance(result[field], dict):
            raise bad(field, "an object or null")
    return result


def _slos_from_campaign(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, float], float, int]:
    from fleetsieve_bayes.campaign.config import load_campaign

    c = load_campaign(path)
    slos = {
        w.name: {"success_min": w.slo.success_min, "ttft_p99_s": w.slo.ttft_p99_s, "completion_p99_s": w.slo.completion_p99_s}
        for w in c.workloads
    }
    return slos, {w.name: w.demand_rps for w in c.workloads}, c.epsilon, c.gpus


def _slos_from_header(header: Header) -> tuple[dict[str, dict[str, Any]], dict[str, float]]:
    slos: dict[str, dict[str, Any]] = {}
    demand: dict[str, float] = {}
    for w in header.workloads:
        if "name" not in w:
            continue
        s = w.get("slo") if isinstance(w.get("slo"), dict) else {}
        slos[str(w["name"])] = {k: s.get(k) for k in ("success_min", "ttft_p99_s", "completion_p99_s")}
        if _is_number(w.get("demand_rps")):
            demand[str(w["name"])] = float(w["demand_rps"])
    return slos, demand


def load_campaign_dir(directory: str | Path, *, campaign_file: str | Path | None = None) -> CampaignView:
    """Read a campaign directory (running, killed or finished).

    Raises:
        InputError: no journal, a journal without a header, a corrupt or
            incomplete journal record, a malformed ``result.json``, or a bad
            campaign file.
    """
    d = Path(directory)
    if not d.is_dir():
        what = "a file" if d.exists() else "no such directory"
        raise InputError(f"{d}: not a campaign directory ({what})")
    jpath = d / JOURNAL_NAME
    if not jpath.is_file():
        raise InputError(f"{d}: not a campaign directory (no {JOURNAL_NAME})")
    records, _ = read_records(jpath)
    header = next((r for r in records if isinstance(r, Header)), None)
    if header is None:
        raise InputError(f"{jpath}: no header record (is the campaign still starting?)")
    rpath = d / RESULT_NAME
    result = read_result(rpath) if rpath.is_file() else None
    state = RUNNING if is_locked(d) else (FINISHED if result is not None else STOPPED)

    epsilon = header.epsilon
    if epsilon is None and result is not None and _is_number(result.get("epsilon")):
        epsilon = float(result["epsilon"])
    gpus = header.gpus
    if campaign_file is not None:
        slos, demand, epsilon, gpus = _slos_from_campaign(Path(campaign_file))
        source = f"campaign file {campaign_file}"
    else:
        slos, demand = _slos_from_header(header)
        source = "journal header" if slos else "unknown (pass --campaign FILE to draw SLO lines)"
    workloads = tuple(dict.fromkeys([c.workload for c in header.cells] or list(slos)))
    return CampaignView(
        directory=d,
        header=header,
        measurements=[r for r in records if isinstance(r, MeasurementRecord)],
        rounds=unique_rounds(r for r in records if isinstance(r, RoundRecord)),
        result=result,
        state=state,
        workloads=workloads,
        slos=slos,
        demand=demand,
        epsilon=epsilon,
        gpus=gpus,
        slo_source=source,
        budget=held_budget(records),
    )


def read_measurements(view: CampaignView) -> pd.DataFrame:
    """``measurements.csv`` (validated), else the journal's rows (a campaign killed before writing
    it): every window, each with its ``replicate``."""
    from fleetsieve_bayes.campaign.windows import window_rows
    from fleetsieve_bayes.table import COLUMNS, read_table, validate_table

    path = view.directory / "measurements.csv"
    if path.is_file():
        return read_table(path)
    rows = window_rows(view.measurements)
    if not rows:
        return pd.DataFrame(columns=list(COLUMNS))
    return validate_table(pd.DataFrame(rows), source=f"{view.directory / JOURNAL_NAME}")


def read_bounds(view: CampaignView, measurements: pd.DataFrame) -> pd.DataFrame:
    """``bounds.csv``; before the first round, the measured cells collapsed to their (first
    window's) values.

    Raises:
        InputError: the file lacks a column of :data:`fleetsieve_bayes.table.BOUNDS_COLUMNS`.
    """
    from fleetsieve_bayes.table import BOUNDS_COLUMNS

    path = view.directory / "bounds.csv"
    if path.is_file():
        try:
            b = pd.read_csv(path)
            missing = [c for c in BOUNDS_COLUMNS if c not in b.columns]
            if missing:
                raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
            b["workload"] = b["workload"].astype(str)
            b["load"] = b["load"].astype(str)
            # A catalogued campaign's bounds name each config; tp is empty for a disaggregated one.
            b["tp"] = b["tp"].astype("Int64") if "config" in b.columns else b["tp"].astype(int)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - any parser failure is bad input
            raise InputError(f"{path}: cannot parse bounds ({exc})".splitlines()[0]) from None
        b["measured"] = b["measured"].map(lambda v: str(v).strip().lower() in ("true", "1", "yes"))
        for c in BOUNDS_COLUMNS[4:]:
            b[c] = pd.to_numeric(b[c], errors="coerce")
        return b
    from fleetsieve_bayes.table import first_windows

    m = first_windows(measurements)
    return pd.DataFrame(
        {
            "workload": m["workload"].astype(str),
            "tp": m["tp"].astype(int),
            "load": m["load"].astype(str),
            "measured": True,
            "throughput_lo": m["throughput_rps"],
            "throughput_hi": m["throughput_rps"],
            "ttft_p99_lo": m["ttft_p99_s"],
            "ttft_p99_hi": m["ttft_p99_s"],
            "completion_p99_lo": m["completion_p99_s"],
            "completion_p99_hi": m["completion_p99_s"],
            "success_lo": m["success_rate"],
            "success_hi": m["success_rate"],
        }
    )


def read_posterior(view: CampaignView) -> Any | None:
    """``posterior.nc`` as ArviZ InferenceData, or ``None`` if there is none yet."""
    path = view.directory / "posterior.nc"
    if not path.is_file():
        return None
    import warnings

    from fleetsieve_bayes.arviz_import import import_arviz

    az = import_arviz()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # ArviZ's notice about its next major version
        try:
            return az.from_netcdf(str(path))
        except Exception as exc:  # noqa: BLE001 - any reader failure is bad input
            raise InputError(f"{path}: cannot read posterior ({type(exc).__name__}: {exc})".splitlines()[0]) from None


def finite_or_none(x: Any) -> Any:
    """``x`` with every non-finite float replaced by None (JSON has no Infinity/NaN)."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: finite_or_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [finite_or_none(v) for v in x]
    return x
