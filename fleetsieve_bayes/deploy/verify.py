"""Verify a deployed fleet against its plan: live windows from vLLM's /metrics or a Prometheus server.

Two sources give the same :class:`~.metrics.WindowReading` per class:

* :func:`read_direct` scrapes each replica's ``/metrics`` twice, ``window_s``
  apart, and differences the buckets and counters (:func:`.metrics.reading`);
* :func:`read_prometheus` asks a Prometheus server, over its HTTP API, for
  the raw samples of ``…_bucket{sel}[W]`` (the bucket bound, from each
  series' last sample minus its first, summed by ``le``: ``increase()``
  extrapolates every series on its own, and a bucket whose first sample is
  small is stretched less than ``+Inf``, which moves the rank by a bucket),
  ``histogram_quantile(0.99, sum by (le) (rate(…_bucket{sel}[W])))`` (its
  interpolated value), the success counter's increase by
  ``finished_reason``, ``resets()`` and ``up``.

:func:`judge` compares a class's reading with its SLO and with the plan's
predicted interval. Per metric: where the SLO lies against the p99's bucket
interval (``below``: the whole bucket is within the SLO; ``above``: the whole
bucket is beyond it; ``inside``: the bucket straddles it, the reading cannot
tell), and where the bucket lies against the predicted interval. Verdict:
``violates`` when a metric certainly misses its SLO; else ``drifted`` when a
metric's reading lies outside its predicted interval (a tail bucket disjoint
from the interval; success: the Clopper–Pearson interval of the window's
success count disjoint from it); else ``inconclusive`` when a bucket
straddles an SLO; else ``meets``.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from fleetsieve_bayes.deploy.metrics import (
    E2E,
    KV_USAGE,
    REQUIRED,
    RUNNING,
    SUCCESS,
    SUCCESS_REASONS,
    TTFT,
    WAITING,
    QuantileBound,
    Scrape,
    WindowReading,
    parse_scrape,
    quantile_bounds,
    reading,
    resolve_names,
)
from fleetsieve_bayes.errors import EnvironmentProblem, InputError

__all__ = [
    "VERIFY_VERSION",
    "parse_window",
    "assign_urls",
    "scrape",
    "read_direct",
    "read_prometheus",
    "judge",
    "verify_report",
]

VERIFY_VERSION = 1
# The central level of the Clopper–Pearson interval of a window's success rate.
SUCCESS_LEVEL = 0.9
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_window(text: str) -> float:
    """``"5m"``, ``"30s"``, ``"1h"`` or plain seconds → seconds (> 0).

    Raises:
        InputError: anything else.
    """
    t = str(text).strip()
    try:
        x = float(t[:-1]) * _UNITS[t[-1]] if t and t[-1] in _UNITS else float(t)
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or x <= 0:
        raise InputError(f"--window: expected a duration like 5m, 30s or 300, got {text!r}")
    return x


def _prom_duration(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


def assign_urls(plan: dict[str, Any], items: Sequence[str]) -> dict[str, list[str]]:
    """Class → its replicas' ``/metrics`` URLs, from ``CLASS=URL`` items or plain URLs.

    Plain URLs go to the plan's only class, or, when there is one per
    placement, to the placements in the plan's order.

    Raises:
        InputError: an unknown class, or plain URLs that cannot be assigned.
    """
    classes = [c["workload"] for c in plan["classes"]]
    out: dict[str, list[str]] = {}
    plain: list[str] = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        head, sep, rest = item.partition("=")
        if sep and "://" not in head:
            if head not in classes:
                raise InputError(f"--metrics: class {head!r} is not in the plan ({', '.join(classes)})")
            out.setdefault(head, []).append(rest)
        else:
            plain.append(item)
    if plain:
        if len(classes) == 1:
            out.setdefault(classes[0], []).extend(plain)
        elif len(plain) == len(plan["placements"]):
            for p, url in zip(plan["placements"], plain, strict=True):
                out.setdefault(p["workload"], []).append(url)
        else:
            raise InputError(
                f"--metrics: {len(plain)} plain URL(s) for {len(plan['placements'])} planned replicas of "
                f"{len(classes)} classes; name each one's class as CLASS=URL"
            )
    if not out:
        raise InputError("--metrics: no URL given")
    return out


def _http_get(url: str, timeout: float) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:  # noqa: S310 - user-given URL
            return int(resp.status), resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), ""
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise EnvironmentProblem(f"{url}: unreachable ({reason})") from None


def scrape(url: str, timeout: float = 10.0, clock: Callable[[], float] = time.monotonic) -> Scrape:
    """One read of ``url``.

    Raises:
        EnvironmentProblem: unreachable.
        InputError: an HTTP error status, or text that is not Prometheus' format.
    """
    status, text = _http_get(url, timeout)
    if status != 200:
        raise InputError(f"{url}: answered HTTP {status}, not a /metrics page")
    return parse_scrape(text, url, clock())


def read_direct(
    urls: dict[str, list[str]],
    window_s: float,
    *,
    timeout: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    during: Callable[[], None] | None = None,
) -> dict[str, WindowReading]:
    """Scrape every URL, wait ``window_s`` (or run ``during``), scrape again; a reading per class.

    Raises:
        EnvironmentProblem: a URL unreachable, or one that stopped answering
            (a replica that died) or restarted mid-window.
        InputError: a URL that is not a vLLM ``/metrics``.
    """
    first = {w: [scrape(u, timeout) for u in us] for w, us in urls.items()}
    for ss in first.values():  # check the names now, not after the window
        reading(ss, ss)
    if during is not None:
        during()
    else:
        sleep(window_s)
    second: dict[str, list[Scrape]] = {}
    for w, us in urls.items():
        second[w] = []
        for u in us:
            try:
                second[w].append(scrape(u, timeout))
            except EnvironmentProblem:
                raise EnvironmentProblem(
                    f"{u} (class {w}): stopped answering mid-window (the replica died?)") from None
    return {w: reading(first[w], second[w]) for w in urls}


# --- Prometheus ---------------------------------------------------------------


def _prom_query(base: str, promql: str, timeout: float, at: float | None) -> list[dict[str, Any]]:
    params = {"query": promql}
    if at is not None:
        params["time"] = f"{at:.3f}"
    url = base.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode(params)
    status, text = _http_get(url, timeout)
    try:
        body = json.loads(text) if text else {}
    except ValueError:
        body = {}
    if status != 200 or body.get("status") != "success":
        what = body.get("error") or f"HTTP {status}"
        if status in (400, 422) and body:
            raise InputError(f"{base}: query {promql!r} refused: {what}")
        raise InputError(f"{base}: not a Prometheus HTTP API ({what})")
    data = body.get("data") or {}
    if data.get("resultType") == "scalar":
        return [{"metric": {}, "value": data.get("result")}]
    return list(data.get("result") or [])


def counter_increase(values: Sequence[float]) -> float:
    """A counter's increase over its raw samples ``(n_samples,)``, in time order, without extrapolation.

    A drop is a reset: the counter restarted from zero, so the sample after it
    counts in full (Prometheus' rule for ``increase``, less its stretching to
    the window's edges).
    """
    total = 0.0
    for before, after in zip(values, values[1:], strict=False):
        total += after - before if after >= before else after
    return total


def _scalar(rows: list[dict[str, Any]]) -> float:
    if not rows:
        return 0.0
    return float(rows[0]["value"][1])


def read_prometheus(
    base: str,
    selectors: dict[str, str],
    window_s: float,
    *,
    timeout: float = 10.0,
    at: float | None = None,
    skip_absent: bool = False,
) -> dict[str, WindowReading]:
    """A reading per class from a Prometheus server, over the ``window_s`` ending at ``at`` (now).

    Args:
        selectors: class → PromQL label matchers without braces, e.g. ``class="chat"``.
        skip_absent: leave out a class with no ``vllm:`` series (else an error);
            it is an error all the same when no class has any.

    Raises:
        EnvironmentProblem: unreachable; a counter reset or a target down in the window.
        InputError: not a Prometheus API; the class's series lack required metrics.
    """
    w = _prom_duration(window_s)
    out: dict[str, WindowReading] = {}
    for cls, sel in selectors.items():
        def q(promql: str, _sel: str = sel) -> list[dict[str, Any]]:
            return _prom_query(base, promql.replace("SEL", _sel), timeout, at)

        present = [r["metric"].get("__name__", "") for r in q('group by (__name__) ({__name__=~"vllm:.+",SEL})')]
        if not present:
            if skip_absent:
                continue
            raise InputError(f"{base}: no vllm:* series for class {cls} ({{{sel}}}) in Prometheus")
        names, missing = resolve_names(present)
        if missing:
            raise InputError(f"{base}: class {cls} ({{{sel}}}) lacks {', '.join(missing)}")
        down = [r["metric"].get("instance", "?") for r in q("up{SEL} == 0")]
        if down:
            raise EnvironmentProblem(f"{base}: class {cls}: target(s) {', '.join(down)} down (a replica died?)")
        resets = _scalar(q(f"sum(resets({names[SUCCESS]}{{SEL}}[{w}]))"))
        resets += _scalar(q(f"sum(changes(process_start_time_seconds{{SEL}}[{w}]))"))
        if resets > 0:
            raise EnvironmentProblem(
                f"{base}: class {cls}: {names[SUCCESS]} reset in the last {w} (a replica restarted?); "
                "verify again over a window without a restart")

        def bound(name: str) -> QuantileBound:
            by_le: dict[float, float] = {}
            for r in q(f"{name}_bucket{{SEL}}[{w}]"):
                le = float(r["metric"]["le"].replace("+Inf", "inf"))
                by_le[le] = by_le.get(le, 0.0) + counter_increase([float(v) for _, v in r.get("values") or []])
            pairs = sorted(by_le.items())
            b = quantile_bounds([p[0] for p in pairs], [p[1] for p in pairs])
            hq = q(f"histogram_quantile(0.99, sum by (le) (rate({name}_bucket{{SEL}}[{w}])))")
            interp = _scalar(hq) if hq else math.nan
            return b._replace(interpolated=interp if math.isfinite(interp) else b.interpolated)

        succ = names[SUCCESS]
        reasons = "|".join(sorted(SUCCESS_REASONS))
        finished = _scalar(q(f"sum(increase({succ}{{SEL}}[{w}]))"))
        # Each series is extrapolated on its own, so the part can exceed the whole by a hair.
        served = min(_scalar(q(f'sum(increase({succ}{{SEL,finished_reason=~"{reasons}"}}[{w}]))')), finished)
        inflight = 0.0
        for g in (RUNNING, WAITING):
            if g in names:
                now = _scalar(q(f"sum({names[g]}{{SEL}})"))
                then = _scalar(q(f"sum({names[g]}{{SEL}} offset {w})"))
                inflight += now - then
        replicas = int(_scalar(q(f"count({names[RUNNING]}{{SEL}})")))
        kv = _scalar(q(f"avg({names[KV_USAGE]}{{SEL}})")) if KV_USAGE in names else None
        out[cls] = WindowReading(
            window_s=window_s,
            replicas=replicas,
            finished=finished,
            served=served,
            offered_rps=max(finished + inflight, 0.0) / window_s,
            served_rps=served / window_s,
            success_rate=(served / finished) if finished > 0 else None,
            ttft_p99=bound(names[TTFT]),
            completion_p99=bound(names[E2E]),
            kv_cache_usage=kv,
            names=names,
        )
    if not out:
        raise InputError(f"{base}: no vllm:* series for any class ({', '.join('{' + s + '}' for s in selectors.values())})")
    return out


# --- judging ------------------------------------------------------------------


def _side(lo: float, hi: float, limit: float) -> str:
    """Where the interval ``[lo, hi]`` lies against ``limit``: below it, above it, or across it."""
    if hi <= limit:
        return "below"
    if lo > limit:
        return "above"
    return "inside"


def _clopper_pearson(k: float, n: float, level: float = SUCCESS_LEVEL) -> tuple[float, float]:
    from scipy.stats import beta

    k_i, n_i = int(round(k)), int(round(n))
    if n_i <= 0:
        return 0.0, 1.0
    a = (1 - level) / 2
    lo = 0.0 if k_i <= 0 else float(beta.ppf(a, k_i, n_i - k_i + 1))
    hi = 1.0 if k_i >= n_i else float(beta.ppf(1 - a, k_i + 1, n_i - k_i))
    return lo, hi


def _num(x: Any) -> float | None:
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else float(x)


def judge(c: dict[str, Any], r: WindowReading) -> dict[str, Any]:
    """One class of the verify report: the reading against the SLO and the predicted interval."""
    slo = c.get("slo") or {}
    pred = c.get("predicted") or {}
    reps = max(int(c["replicas"]), 1)
    metrics: dict[str, Any] = {}
    violations: list[str] = []
    drift: list[str] = []
    straddles: list[str] = []
    for key, b, limit_key in (("ttft_p99_s", r.ttft_p99, "ttft_p99_s"), ("completion_p99_s", r.completion_p99, "completion_p99_s")):
        limit = slo.get(limit_key)
        p = (pred.get(key) or {}).get("interval")
        entry: dict[str, Any] = {"lo": _num(b.lo), "hi": _num(b.hi), "interpolated": _num(b.interpolated),
                                 "count": b.count, "slo": limit, "predicted": p}
        if b.count > 0:
            if limit is not None:
                # Where the p99 lies against the SLO: within (bucket ≤ SLO), beyond, or unknown.
                side = _side(b.lo, b.hi, float(limit))
                entry["p99_vs_slo"] = {"below": "within", "above": "beyond", "inside": "bucket straddles SLO"}[side]
                if side == "above":
                    violations.append(f"{key} p99 in [{b.lo:g}, {b.hi:g}] s > SLO {limit:g} s")
                elif side == "inside":
                    straddles.append(f"{key} SLO {limit:g} s inside the p99's bucket [{b.lo:g}, {b.hi:g}] s")
            if p and p[0] is not None and p[1] is not None:
                if b.lo > p[1]:
                    entry["vs_predicted"] = "above"
                    drift.append(f"{key} p99 in [{b.lo:g}, {b.hi:g}] s above predicted [{p[0]:.3g}, {p[1]:.3g}] s")
                elif b.hi < p[0]:
                    entry["vs_predicted"] = "below"
                    drift.append(f"{key} p99 in [{b.lo:g}, {b.hi:g}] s below predicted [{p[0]:.3g}, {p[1]:.3g}] s")
                else:
                    entry["vs_predicted"] = "overlaps"
        metrics[key] = entry
    s_lo, s_hi = _clopper_pearson(r.served, r.finished)
    p = (pred.get("success_rate") or {}).get("interval")
    s_entry: dict[str, Any] = {"value": r.success_rate, "interval": [s_lo, s_hi], "served": r.served,
                               "finished": r.finished, "slo": slo.get("success_min"), "predicted": p}
    if r.success_rate is not None:
        smin = slo.get("success_min")
        if smin is not None:
            s_entry["vs_slo"] = "within" if r.success_rate >= smin else "beyond"
            if r.success_rate < smin:
                violations.append(f"success {r.success_rate:.4f} < SLO {smin:g}")
        if p and p[0] is not None and p[1] is not None:
            if s_hi < p[0]:
                s_entry["vs_predicted"] = "below"
                drift.append(f"success {r.success_rate:.4f} (CI [{s_lo:.4f}, {s_hi:.4f}]) below predicted [{p[0]:.4f}, {p[1]:.4f}]")
            elif s_lo > p[1]:
                s_entry["vs_predicted"] = "above"
                drift.append(f"success {r.success_rate:.4f} (CI [{s_lo:.4f}, {s_hi:.4f}]) above predicted [{p[0]:.4f}, {p[1]:.4f}]")
            else:
                s_entry["vs_predicted"] = "overlaps"
    metrics["success_rate"] = s_entry
    if r.http_p99 is not None and r.http_p99.count > 0:
        # Client-facing: the HTTP server's whole-request duration, front end included (informational).
        h = r.http_p99
        metrics["http_request_p99_s"] = {"lo": _num(h.lo), "hi": _num(h.hi), "interpolated": _num(h.interpolated),
                                         "count": h.count}
    tp_pred = (pred.get("throughput_rps") or {}).get("interval")
    metrics["throughput_rps"] = {"served_per_replica": r.served_rps / reps, "predicted": tp_pred}
    if r.finished <= 0:
        verdict, reasons = "inconclusive", ["no request finished in the window"]
    elif violations:
        verdict, reasons = "violates", violations
    elif drift:
        verdict, reasons = "drifted", drift
    elif straddles:
        verdict, reasons = "inconclusive", straddles
    else:
        verdict, reasons = "meets", []
    certified_offered = c.get("offered_rps_per_replica")
    return {
        "workload": c["workload"],
        "tp": c["tp"],
        "load": c["load"],
        "replicas_planned": c["replicas"],
        "replicas_seen": r.replicas,
        "window_s": r.window_s,
        "offered_rps": r.offered_rps,
        "served_rps": r.served_rps,
        "offered_rps_per_replica": r.offered_rps / reps,
        "served_rps_per_replica": r.served_rps / reps,
        "certified_offered_rps_per_replica": certified_offered,
        "kv_cache_usage": r.kv_cache_usage,
        "metric_names": r.names,
        "metrics": metrics,
        "verdict": verdict,
        "reasons": reasons,
    }


_ORDER = ("meets", "inconclusive", "drifted", "violates")


def verify_report(plan: dict[str, Any], readings: dict[str, WindowReading], source: dict[str, Any]) -> dict[str, Any]:
    """The verify JSON (docs/contracts.md, "verify JSON"): one judged entry per class read."""
    from fleetsieve_bayes.campaign.directory import finite_or_none

    classes = [judge(c, readings[c["workload"]]) for c in plan["classes"] if c["workload"] in readings]
    missing = [c["workload"] for c in plan["classes"] if c["workload"] not in readings]
    worst = max((c["verdict"] for c in classes), key=_ORDER.index, default="inconclusive")
    return finite_or_none({
        "version": VERIFY_VERSION,
        "campaign": plan["campaign"],
        "campaign_dir": plan.get("campaign_dir"),
        "certified": plan["certified"],
        "certificate": plan["certificate"],
        "source": source,
        "finished_at": time.time(),
        "classes": classes,
        "unread_classes": missing,
        "verdict": worst,
        "required_metrics": list(REQUIRED),
        # vLLM's histograms start at the engine's arrival, after the HTTP front end.
        "timing": "server-side",
    })
