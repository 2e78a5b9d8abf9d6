"""``fleetsieve-bayes verify PLAN_DIR (--metrics URL[,URL…] | --prometheus URL) --window 5m [--json]``.

A disaggregated class of a catalogued plan is read per role (deploy/verify.py):
``--metrics`` URLs go to roles by the plan's worker placements (or
``CLASS:ROLE=URL``), ``--prometheus`` series by a role label (``--role-label``,
default: the first of ``role``, ``fleetsieve_bayes_role`` that the class's
series carry).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from fleetsieve_bayes.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "verify",
        help="check a deployed fleet's live windows against its plan's SLOs and predictions",
        description="Read what the deployed replicas did over a window — from each replica's "
        "vLLM /metrics (two scrapes WINDOW apart) or from a Prometheus server — and compare, per "
        "class, the offered and served rates, the p99 bounds from the histogram buckets and the "
        "success rate with the SLO and with the plan's predicted interval. Verdict per class: "
        "meets, inconclusive (an SLO inside the p99's bucket), drifted (outside the predicted "
        "interval) or violates.",
    )
    p.add_argument("plan", type=Path, help="plan directory (plan --out) or its plan.json")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--metrics", help="comma-separated /metrics URLs, each CLASS=URL or plain; a disaggregated "
                                        "class's workers go to their roles by the plan's ports, or as CLASS:ROLE=URL")
    src.add_argument("--prometheus", help="Prometheus server base URL (its HTTP API)")
    p.add_argument("--window", default="5m", help="window, e.g. 5m, 30s or seconds (default 5m)")
    p.add_argument("--selector", default='class="{workload}"',
                   help="PromQL label matchers of a class's series, {workload} filled "
                        "(default: class=\"{workload}\", as plan's prometheus.yml labels them)")
    p.add_argument("--role-label", default=None,
                   help="with --prometheus: the label naming a disaggregated class's worker role (prefill, decode); "
                        "default: the first of role (plan's prometheus.yml) and fleetsieve_bayes_role (the k8s pods' "
                        "fleetsieve-bayes/role through a kubernetes_sd labelmap) that its series carry")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds per HTTP request (default 10)")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON report to this file")
    p.add_argument("--json", action="store_true", help="print the JSON report instead of text")
    p.set_defaults(func=main)


def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "—"
    return f"{float(x):.{digits}g}"


def render(report: dict[str, Any]) -> str:
    """The report as text, one block per class."""
    lines = [f"verify {report['campaign']} ({report['source']['kind']}, window {report['source']['window_s']:g} s)"
             + ("" if report["certified"] else "  [plan UNCERTIFIED]") + f": {report['verdict']}"]
    for c in report["classes"]:
        what = c["config"] if "config" in c else f"TP{c['tp']}"
        lines.append(f"  {c['workload']} {what}@{c['load']} ×{c['replicas_planned']} "
                     f"({c['replicas_seen']} seen): {c['verdict']}")
        lines.append(f"    offered {_fmt(c['offered_rps'])} req/s, served {_fmt(c['served_rps'])} req/s "
                     f"({_fmt(c['served_rps_per_replica'])} per replica; certified load offers "
                     f"{_fmt(c['certified_offered_rps_per_replica'])})")
        for key, label in (("ttft_p99_s", "TTFT p99"), ("completion_p99_s", "completion p99")):
            m = c["metrics"][key]
            pred = m.get("predicted") or [None, None]
            lines.append(f"    {label} in [{_fmt(m['lo'])}, {_fmt(m['hi'])}] s (~{_fmt(m['interpolated'])}; "
                         f"{m['count']:g} requests)  SLO {_fmt(m['slo'])}: {m.get('p99_vs_slo', '—')}  "
                         f"predicted [{_fmt(pred[0])}, {_fmt(pred[1])}]: {m.get('vs_predicted', '—')}")
        h = c["metrics"].get("http_request_p99_s")
        if h:
            lines.append(f"    HTTP request p99 in [{_fmt(h['lo'])}, {_fmt(h['hi'])}] s (the server's front end included)")
        s = c["metrics"]["success_rate"]
        pred = s.get("predicted") or [None, None]
        lines.append(f"    success {_fmt(s['value'], 4)} (CI [{_fmt(s['interval'][0], 4)}, {_fmt(s['interval'][1], 4)}]) "
                     f"SLO {_fmt(s['slo'])}: {s.get('vs_slo', '—')}  predicted [{_fmt(pred[0], 4)}, "
                     f"{_fmt(pred[1], 4)}]: {s.get('vs_predicted', '—')}")
        if c.get("roles"):
            lines += _role_lines(c)
        for r in c["reasons"]:
            lines.append(f"    - {r}")
    lines.append("  (p99s are vLLM's server-side timings, from the engine's arrival: a client's TTFT is longer "
                 "by the HTTP front end's overhead)")
    if report["unread_classes"]:
        lines.append(f"  not read: {', '.join(report['unread_classes'])}")
    return "\n".join(lines)


def _bucket(m: dict[str, Any] | None) -> str:
    if not m or not m.get("count"):
        return "—"
    return f"[{_fmt(m['lo'])}, {_fmt(m['hi'])}] s"


def _role_lines(c: dict[str, Any]) -> list[str]:
    """A disaggregated class's roles: what each role's workers read, their queues, and the drifting role."""
    out = []
    for role, e in c["roles"].items():
        q = e.get("num_requests_waiting")
        queue = "—" if q is None else f"{_fmt(q['start'])} → {_fmt(q['end'])}"
        timing = (f"TTFT p99 in {_bucket(e['ttft_p99_s'])}" if role == "prefill" else
                  f"completion p99 in {_bucket(e['completion_p99_s'])}, inter-token p99 in {_bucket(e['itl_p99_s'])}")
        drift = f"; drifts: {', '.join(e['drift'])}" if e["drift"] else ""
        out.append(f"    {role}: {e['workers_seen']} of {_fmt(e['workers_planned'])} workers seen, {timing}, "
                   f"waiting {queue}{drift}")
    out.append(f"    router: {c['router']['note'] if c.get('router') else '—'}")
    out.append(f"    drifting role: {c['role'] or 'none'}")
    return out


def _prometheus_selectors(args: argparse.Namespace, plan: dict[str, Any], selectors: dict[str, str]
                          ) -> tuple[dict[Any, str], dict[str, Any]]:
    """Every class's selector, a disaggregated class's one per role (its selector and the role label);
    and what the report's ``source`` adds for them (nothing without one)."""
    from fleetsieve_bayes.deploy.verify import ROLES, role_label

    keys: dict[Any, str] = {}
    by_role: dict[str, dict[str, str]] = {}
    for c in plan["classes"]:
        w = c["workload"]
        if not c.get("roles"):
            keys[w] = selectors[w]
            continue
        label = args.role_label or role_label(args.prometheus, selectors[w], timeout=args.timeout)
        if label is None:  # no series at all: not read, as a class of one role
            continue
        by_role[w] = {r: f'{selectors[w]},{label}="{r}"' for r in ROLES}
        keys.update({(w, r): sel for r, sel in by_role[w].items()})
    return keys, ({"role_selectors": by_role} if by_role else {})


def main(args: argparse.Namespace) -> int:
    from fleetsieve_bayes.deploy.plan import read_plan
    from fleetsieve_bayes.deploy.verify import (
        ROLES,
        assign_roles,
        assign_urls,
        class_readings,
        parse_window,
        read_direct,
        read_prometheus,
        verify_report,
    )

    plan = read_plan(args.plan)
    window = parse_window(args.window)
    if args.metrics is not None:
        items = str(args.metrics).split(",")
        urls = assign_urls(plan, items)
        roles = assign_roles(plan, items)
        # A disaggregated class is read as its roles' workers, all in the one window.
        keys: dict[Any, list[str]] = {w: us for w, us in urls.items() if w not in roles}
        keys.update({(w, r): by[r] for w, by in roles.items() for r in ROLES})
        raw = read_direct(keys, window, timeout=args.timeout)
        source = {"kind": "metrics", "urls": urls, "window_s": window, **({"roles": roles} if roles else {})}
    else:
        if "{workload}" not in args.selector:
            raise InputError("--selector: must contain {workload}")
        selectors = {c["workload"]: args.selector.replace("{workload}", c["workload"]) for c in plan["classes"]}
        keys_p, extra = _prometheus_selectors(args, plan, selectors)
        if not keys_p:
            raise InputError(f"{args.prometheus}: no vllm:* series for any class "
                             f"({', '.join('{' + s + '}' for s in selectors.values())})")
        raw = read_prometheus(args.prometheus, keys_p, window, timeout=args.timeout, skip_absent=True)
        source = {"kind": "prometheus", "url": args.prometheus, "selectors": selectors, "window_s": window, **extra}
    readings, by_role = class_readings(plan, raw)
    report = verify_report(plan, readings, source, by_role)
    text = json.dumps(report, indent=2, allow_nan=False)
    if args.out is not None:
        from fleetsieve_bayes.atomic import atomic_write_text

        atomic_write_text(args.out, text + "\n")
    print(text if args.json else render(report), file=sys.stdout)
    return 0
