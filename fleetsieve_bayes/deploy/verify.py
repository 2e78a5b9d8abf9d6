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

A disaggregated class of a catalogued plan (``classes[].roles``) is read per
role: its prefill workers and its decode workers are two readings
(:func:`assign_roles` matches ``--metrics`` URLs to roles by the plan's
placements; with Prometheus each role is the class's selector and a role
label, :func:`role_label`). :func:`combine_roles` makes the class's reading
of them: TTFT from the prefill workers, completion, success and the rates
from the decode workers (a request whose prefill failed never reaches a
decode worker, so the prefill failures are added to the finished ones), the
inter-token latency and the queues per role. The router exposes no
``/metrics``: its hop is in no reading (:data:`ROUTER_NOTE`). The class's
verdict names the role that drifts from the prediction (TTFT: prefill;
completion: decode; success: the role with the lower success rate).
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from fleetsieve_bayes.deploy.metrics import (
    E2E,
    ITL,
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
    "assign_roles",
    "role_label",
    "combine_roles",
    "class_readings",
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
# The roles of a disaggregated class's workers (deploy/catalogued.py's ROLES).
ROLES: tuple[str, ...] = ("prefill", "decode")
# Prometheus labels that may carry a worker's role: plan's launch/prometheus.yml labels
# `role`; the k8s pods' label `fleetsieve-bayes/role` becomes `fleetsieve_bayes_role`
# under the usual kubernetes_sd `labelmap: __meta_kubernetes_pod_label_(.+)`.
ROLE_LABELS: tuple[str, ...] = ("role", "fleetsieve_bayes_role")
ROUTER_NOTE = ("the router exposes no /metrics: its hop (the prefill request, then the decode request) "
               "is in no reading, so a client's TTFT and completion are longer by it")
# Which of a disaggregated class's metrics each role's workers give.
ROLE_READS: dict[str, tuple[str, ...]] = {
    "prefill": ("ttft_p99_s",),
    "decode": ("completion_p99_s", "itl_p99_s", "success_rate", "offered_rps", "served_rps"),
}


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


def _assign(plan: dict[str, Any], items: Sequence[str]) -> list[tuple[str, str, str | None]]:
    """``(class, URL, role or None)`` per ``--metrics`` item, named items first (docs: :func:`assign_urls`)."""
    classes = [c["workload"] for c in plan["classes"]]
    disaggregated = {c["workload"] for c in plan["classes"] if c.get("roles")}
    out: list[tuple[str, str, str | None]] = []
    plain: list[str] = []
    for item in items:
        item = item.strip()
        if not item:
            continue
        head, sep, rest = item.partition("=")
        if sep and "://" not in head:
            role: str | None = None
            if head not in classes and ":" in head:
                w, _, r = head.rpartition(":")
                if w in classes and r in ROLES:
                    if w not in disaggregated:
                        raise InputError(f"--metrics: class {w!r} is not disaggregated (no {r} workers); "
                                         f"give its URLs as {w}=URL")
                    head, role = w, r
            if head not in classes:
                raise InputError(f"--metrics: class {head!r} is not in the plan ({', '.join(classes)})")
            out.append((head, rest, role))
        else:
            plain.append(item)
    if plain:
        if len(classes) == 1:
            out.extend((classes[0], u, None) for u in plain)
        elif len(plain) == len(plan["placements"]):
            for p, url in zip(plan["placements"], plain, strict=True):
                r = p.get("role")
                out.append((p["workload"], url, r if r in ROLES else None))
        else:
            raise InputError(
                f"--metrics: {len(plain)} plain URL(s) for {len(plan['placements'])} planned replicas of "
                f"{len(classes)} classes; name each one's class as CLASS=URL"
            )
    return out


def assign_urls(plan: dict[str, Any], items: Sequence[str]) -> dict[str, list[str]]:
    """Class → its replicas' ``/metrics`` URLs, from ``CLASS=URL`` items or plain URLs.

    Plain URLs go to the plan's only class, or, when there is one per
    placement, to the placements in the plan's order. A disaggregated class's
    URL may name its role, ``CLASS:prefill=URL`` or ``CLASS:decode=URL``
    (:func:`assign_roles`).

    Raises:
        InputError: an unknown class, or plain URLs that cannot be assigned.
    """
    out: dict[str, list[str]] = {}
    for w, url, _ in _assign(plan, items):
        out.setdefault(w, []).append(url)
    if not out:
        raise InputError("--metrics: no URL given")
    return out


def _netloc(url: str) -> tuple[str, int | None]:
    parts = urllib.parse.urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    return parts.netloc.lower(), port


def _role_of_url(plan: dict[str, Any], w: str, url: str) -> str:
    """The role of a disaggregated class's worker at ``url``: the placement at its host and port,
    else the only role of the class's workers on its port."""
    workers = [p for p in plan["placements"] if p["workload"] == w and p.get("role") in ROLES]
    netloc, port = _netloc(url)
    exact = {_netloc(str(p.get("metrics_url", "")))[0]: p["role"] for p in workers}
    if netloc in exact:
        return exact[netloc]
    on_port = sorted({p["role"] for p in workers if p.get("port") == port})
    if len(on_port) == 1:
        return on_port[0]
    ports = "; ".join(f"{r} on {', '.join(map(str, sorted({p['port'] for p in workers if p['role'] == r})))}"
                      for r in ROLES)
    if on_port:
        raise InputError(f"--metrics: {url} (class {w}): port {port} is a prefill worker's on one node and a decode "
                         f"worker's on another; name its role as {w}:prefill=URL or {w}:decode=URL")
    routers = [r for r in plan.get("routers") or [] if r.get("workload") == w]
    if any(_netloc(str(r.get("url", "")))[0] == netloc or r.get("port") == port for r in routers):
        raise InputError(f"--metrics: {url} is class {w}'s router, which exposes no /metrics; give its prefill and "
                         f"decode workers' /metrics ({ports})")
    raise InputError(f"--metrics: {url} (class {w}, disaggregated): no worker of the plan listens on port {port} "
                     f"({ports}); name its role as {w}:prefill=URL or {w}:decode=URL")


def assign_roles(plan: dict[str, Any], items: Sequence[str]) -> dict[str, dict[str, list[str]]]:
    """Disaggregated class → role → its workers' ``/metrics`` URLs (classes without roles are left out).

    A URL's role is the one its item names (``CLASS:ROLE=URL``), else its
    placement's (plain URLs one per placement), else the role of the plan's
    worker placement at its host and port, else the only role of the class's
    workers on its port (the plan's hosts may be names the URLs do not use).

    Raises:
        InputError: a URL that is the class's router (which exposes no ``/metrics``),
            one whose port is no worker's of the class or both roles' (name its role),
            or a class read with no worker of one role.
    """
    by_name = {c["workload"]: c for c in plan["classes"]}
    out: dict[str, dict[str, list[str]]] = {}
    for w, url, role in _assign(plan, items):
        if not by_name[w].get("roles"):
            continue
        r = role or _role_of_url(plan, w, url)
        out.setdefault(w, {x: [] for x in ROLES})[r].append(url)
    for w, by in out.items():
        for r in ROLES:
            if not by[r]:
                ports = sorted({p["port"] for p in plan["placements"] if p["workload"] == w and p.get("role") == r})
                raise InputError(f"--metrics: class {w} is disaggregated, but none of its URLs is a {r} worker's "
                                 f"(the plan's {r} workers listen on port(s) {', '.join(map(str, ports)) or '—'}); "
                                 "give both roles' workers")
    return out


def _label(key: Hashable) -> str:
    """A reading's key in messages: ``class chat``, or ``class summ, prefill workers``."""
    if isinstance(key, tuple):
        return f"class {key[0]}, {key[1]} workers"
    return f"class {key}"


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
    urls: Mapping[Any, list[str]],
    window_s: float,
    *,
    timeout: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
    during: Callable[[], None] | None = None,
) -> dict[Any, WindowReading]:
    """Scrape every URL, wait ``window_s`` (or run ``during``), scrape again; a reading per key
    (a class, or ``(class, role)`` for a disaggregated class's workers of one role).

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
    second: dict[Any, list[Scrape]] = {}
    for w, us in urls.items():
        second[w] = []
        for u in us:
            try:
                second[w].append(scrape(u, timeout))
            except EnvironmentProblem:
                raise EnvironmentProblem(
                    f"{u} ({_label(w)}): stopped answering mid-window (the replica died?)") from None
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
    selectors: Mapping[Any, str],
    window_s: float,
    *,
    timeout: float = 10.0,
    at: float | None = None,
    skip_absent: bool = False,
) -> dict[Any, WindowReading]:
    """A reading per class from a Prometheus server, over the ``window_s`` ending at ``at`` (now).

    Args:
        selectors: class → PromQL label matchers without braces, e.g. ``class="chat"``; a key
            ``(class, role)`` reads a disaggregated class's workers of one role (and their
            inter-token latency).
        skip_absent: leave out a class with no ``vllm:`` series (else an error);
            it is an error all the same when no class has any.

    Raises:
        EnvironmentProblem: unreachable; a counter reset or a target down in the window.
        InputError: not a Prometheus API; the class's series lack required metrics.
    """
    w = _prom_duration(window_s)
    out: dict[Any, WindowReading] = {}
    for cls, sel in selectors.items():
        def q(promql: str, _sel: str = sel) -> list[dict[str, Any]]:
            return _prom_query(base, promql.replace("SEL", _sel), timeout, at)

        present = [r["metric"].get("__name__", "") for r in q('group by (__name__) ({__name__=~"vllm:.+",SEL})')]
        if not present:
            if skip_absent:
                continue
            raise InputError(f"{base}: no vllm:* series for {_label(cls)} ({{{sel}}}) in Prometheus")
        names, missing = resolve_names(present)
        if missing:
            raise InputError(f"{base}: {_label(cls)} ({{{sel}}}) lacks {', '.join(missing)}")
        down = [r["metric"].get("instance", "?") for r in q("up{SEL} == 0")]
        if down:
            raise EnvironmentProblem(f"{base}: {_label(cls)}: target(s) {', '.join(down)} down (a replica died?)")
        resets = _scalar(q(f"sum(resets({names[SUCCESS]}{{SEL}}[{w}]))"))
        resets += _scalar(q(f"sum(changes(process_start_time_seconds{{SEL}}[{w}]))"))
        if resets > 0:
            raise EnvironmentProblem(
                f"{base}: {_label(cls)}: {names[SUCCESS]} reset in the last {w} (a replica restarted?); "
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
        gauges: dict[str, tuple[float, float]] = {}
        for g in (RUNNING, WAITING):
            if g in names:
                now = _scalar(q(f"sum({names[g]}{{SEL}})"))
                then = _scalar(q(f"sum({names[g]}{{SEL}} offset {w})"))
                gauges[g] = (then, now)
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
            itl_p99=bound(names[ITL]) if isinstance(cls, tuple) and ITL in names else None,
            waiting=gauges.get(WAITING),
            running=gauges[RUNNING][1] if RUNNING in gauges else None,
        )
    if not out:
        raise InputError(f"{base}: no vllm:* series for any class ({', '.join('{' + s + '}' for s in selectors.values())})")
    return out


def role_label(base: str, selector: str, *, timeout: float = 10.0, at: float | None = None,
               labels: Sequence[str] = ROLE_LABELS) -> str | None:
    """The Prometheus label naming the role of a disaggregated class's workers: the first of
    ``labels`` whose values on the class's ``vllm:`` series include ``prefill`` or ``decode``.

    Returns:
        The label, or None when the class has no ``vllm:`` series at all (it is not read).

    Raises:
        InputError: the class has series, but no label of ``labels`` names their roles.
    """
    def q(promql: str) -> list[dict[str, Any]]:
        return _prom_query(base, promql.replace("SEL", selector), timeout, at)

    roles = "|".join(ROLES)
    for label in labels:
        if q(f'count by ({label}) ({{__name__=~"vllm:.+",SEL,{label}=~"{roles}"}})'):
            return label
    if not q('group by (__name__) ({__name__=~"vllm:.+",SEL})'):
        return None
    raise InputError(f"{base}: the series of {{{selector}}} (a disaggregated class) carry no role label "
                     f"({', '.join(labels)}) naming prefill or decode; label them by role (plan's "
                     "launch/prometheus.yml labels `role`) or pass --role-label")


# --- disaggregated classes ----------------------------------------------------


def combine_roles(c: dict[str, Any], by_role: Mapping[str, WindowReading]) -> WindowReading:
    """A disaggregated class's reading from its prefill and decode workers' readings.

    TTFT is the prefill workers' (the prompt's first token is computed there);
    completion, the success counts, the rates, the KV cache and the inter-token
    latency are the decode workers'; a request whose prefill failed never reaches
    a decode worker, so the prefill failures count as finished, not served.
    ``replicas`` is the replicas whose every worker was read (each role's workers
    seen over its workers per replica, the smaller).
    """
    pre, dec = by_role["prefill"], by_role["decode"]
    failed_prefill = max(pre.finished - pre.served, 0.0)
    finished = dec.finished + failed_prefill
    window = max(dec.window_s, 1e-9)
    roles = c.get("roles") or {}
    seen = min(r.replicas // max(int((roles.get(k) or {}).get("workers") or 1), 1)
               for k, r in (("prefill", pre), ("decode", dec)))
    return WindowReading(
        window_s=dec.window_s,
        replicas=seen,
        finished=finished,
        served=dec.served,
        offered_rps=dec.offered_rps + failed_prefill / window,
        served_rps=dec.served_rps,
        success_rate=(dec.served / finished) if finished > 0 else None,
        ttft_p99=pre.ttft_p99,
        completion_p99=dec.completion_p99,
        kv_cache_usage=dec.kv_cache_usage,
        names=dec.names,
        http_p99=None,  # a worker's HTTP time is one hop, not the client's request
        itl_p99=dec.itl_p99,
        waiting=dec.waiting,
        running=dec.running,
    )


def class_readings(plan: dict[str, Any], raw: Mapping[Any, WindowReading]
                   ) -> tuple[dict[str, WindowReading], dict[str, dict[str, WindowReading]]]:
    """Readings keyed by class (a disaggregated class's combined by :func:`combine_roles`), and
    each disaggregated class's readings by role, from readings keyed by class or ``(class, role)``.

    Raises:
        InputError: a disaggregated class read for one role and not the other.
    """
    readings = {k: v for k, v in raw.items() if not isinstance(k, tuple)}
    roles: dict[str, dict[str, WindowReading]] = {}
    for k, v in raw.items():
        if isinstance(k, tuple):
            roles.setdefault(k[0], {})[k[1]] = v
    by_name = {c["workload"]: c for c in plan["classes"]}
    for w, by in roles.items():
        missing = [r for r in ROLES if r not in by]
        if missing:
            raise InputError(f"class {w}: its {', '.join(r for r in ROLES if r in by)} workers were read but no "
                             f"{' or '.join(missing)} worker: a disaggregated class is read from both roles")
        readings[w] = combine_roles(by_name[w], by)
    return readings, roles


def _bound_json(b: QuantileBound | None) -> dict[str, Any] | None:
    if b is None:
        return None
    return {"lo": _num(b.lo), "hi": _num(b.hi), "interpolated": _num(b.interpolated), "count": b.count}


def _role_entries(c: dict[str, Any], metrics: dict[str, Any], by_role: Mapping[str, WindowReading]
                  ) -> tuple[dict[str, Any], str | None]:
    """``classes[].roles`` of the verify JSON and the drifting role (``prefill``, ``decode``, ``both`` or None)."""
    drift: dict[str, list[str]] = {r: [] for r in ROLES}
    for key, role in (("ttft_p99_s", "prefill"), ("completion_p99_s", "decode")):
        if metrics[key].get("vs_predicted") in ("above", "below"):
            drift[role].append(key)
    if metrics["success_rate"].get("vs_predicted") in ("above", "below"):
        # The role whose own success rate is the lower one (the one that lost the requests).
        rates = {r: (by_role[r].success_rate if by_role[r].success_rate is not None else 1.0) for r in ROLES}
        drift[min(ROLES, key=lambda r: (rates[r], r != "decode"))].append("success_rate")
    plan_roles = c.get("roles") or {}
    out: dict[str, Any] = {}
    for r in ROLES:
        x = by_role[r]
        out[r] = {
            "workers_planned": (plan_roles.get(r) or {}).get("pods"),
            "workers_seen": x.replicas,
            "window_s": x.window_s,
            "finished": x.finished,
            "served": x.served,
            "success_rate": x.success_rate,
            "served_rps": x.served_rps,
            "ttft_p99_s": _bound_json(x.ttft_p99),
            "completion_p99_s": _bound_json(x.completion_p99),
            "itl_p99_s": _bound_json(x.itl_p99),
            "num_requests_waiting": None if x.waiting is None else {"start": x.waiting[0], "end": x.waiting[1]},
            "num_requests_running": x.running,
            "kv_cache_usage": x.kv_cache_usage,
            "metric_names": x.names,
            "reads": list(ROLE_READS[r]),
            "drift": drift[r],
        }
    drifting = [r for r in ROLES if drift[r]]
    return out, (None if not drifting else drifting[0] if len(drifting) == 1 else "both")


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


def judge(c: dict[str, Any], r: WindowReading, roles: Mapping[str, WindowReading] | None = None) -> dict[str, Any]:
    """One class of the verify report: the reading against the SLO and the predicted interval.

    A class of a catalogued plan (with ``config``) gains ``config``, ``gpus_per_replica``,
    ``role``, ``roles`` and ``router``; with ``roles`` (a disaggregated class's readings by
    role, ``r`` their :func:`combine_roles`) they describe each role and name the drifting one.
    """
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
    out = {
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
    if "config" in c:  # a catalogued plan's class (without a catalogue: nothing added)
        out.update(_catalogued_fields(c, metrics, roles))
    return out


def _catalogued_fields(c: dict[str, Any], metrics: dict[str, Any], roles: Mapping[str, WindowReading] | None
                       ) -> dict[str, Any]:
    """What a catalogued plan's class adds to its verify entry: its configuration, and for a
    disaggregated one its roles, the drifting role and the router (which exposes nothing)."""
    role_entries, role = (None, None) if roles is None else _role_entries(c, metrics, roles)
    router = c.get("router")
    return {
        "config": c["config"],
        "gpus_per_replica": c.get("gpus_per_replica"),
        "role": role,
        "roles": role_entries,
        "router": None if not router else {"replicas": router.get("replicas"), "metrics": None, "note": ROUTER_NOTE},
    }


_ORDER = ("meets", "inconclusive", "drifted", "violates")


def verify_report(plan: dict[str, Any], readings: dict[str, WindowReading], source: dict[str, Any],
                  roles: Mapping[str, Mapping[str, WindowReading]] | None = None) -> dict[str, Any]:
    """The verify JSON (docs/contracts.md, "verify JSON"): one judged entry per class read.

    ``roles``: a disaggregated class's readings by role (:func:`class_readings`), its
    ``readings`` entry their :func:`combine_roles`.
    """
    from fleetsieve_bayes.campaign.directory import finite_or_none

    roles = roles or {}
    classes = [judge(c, readings[c["workload"]], roles.get(c["workload"]))
               for c in plan["classes"] if c["workload"] in readings]
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
