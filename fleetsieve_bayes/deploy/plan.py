"""From a campaign directory to a deployment plan: ``plan.json``, per-node launch scripts, manifests.

:func:`build_plan` reads a campaign directory (journal header, ``result.json``,
``bounds.csv``, ``posterior.nc``), takes its allocation, packs the replicas
onto ``nodes × gpus_per_node`` GPUs exactly (:mod:`.packing`) and returns the
plan as a JSON-able dict (docs/contracts.md, "plan.json"). :func:`write_plan`
writes it with the artefacts of the requested formats:

* ``launch``: ``launch/node_<n>.sh`` — one ``vllm serve`` per replica, each
  with its ``CUDA_VISIBLE_DEVICES`` and port, from the campaign's server
  template (``[measurement] command`` / ``extra_args`` / ``env``; the
  default ``vllm serve`` template for a replayed campaign);
* ``k8s``: ``k8s/<class>.yaml`` — Deployment, Service and an autoscaling/v2
  HorizontalPodAutoscaler per class, and ``k8s/prometheus-adapter-rules.yaml``
  (the custom-metric rules the autoscalers read); see :mod:`.k8s`.

A catalogued campaign's allocation names each class's configuration
(docs/contracts.md, "Configurations"): its engine arguments become vLLM flags
of every worker, and a disaggregated configuration is planned as prefill and
decode workers (each on its role's TP GPUs of one node; a replica's workers on
one node where it fits) behind a router per replica; see :mod:`.catalogued`.
Without a catalogue everything is written as before.

The operating point of a class is its certified cell. Its load setting is a
*concurrency* (the label ``C<N>`` of a replayed grid: N requests in flight
per replica) or a *rate* (the vLLM backend's arrival multipliers: the cell's
offered requests/s per replica); the autoscaler's per-replica target is that
setting.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fleetsieve_bayes.campaign.directory import CampaignView, finite_or_none, load_campaign_dir
from fleetsieve_bayes.configs import ServingConfig
from fleetsieve_bayes.deploy.catalogued import (
    DEFAULT_KV_CONNECTOR,
    DEFAULT_ROUTER_COMMAND,
    allocated_config,
    catalogue_of,
    describe_workers,
    kv_roles,
    replica_workers,
    role_entries,
    worker_placements,
)
from fleetsieve_bayes.deploy.launch import replica_command
from fleetsieve_bayes.deploy.packing import (
    GroupPacking,
    Packing,
    first_unfit,
    first_unfit_groups,
    pack,
    pack_groups,
)
from fleetsieve_bayes.errors import InputError

__all__ = [
    "PLAN_NAME",
    "PLAN_VERSION",
    "FORMATS",
    "build_plan",
    "write_plan",
    "read_plan",
    "uncertified_note",
    "load_kind",
    "replica_command",
    "DEFAULT_KV_CONNECTOR",
    "DEFAULT_ROUTER_COMMAND",
]

PLAN_NAME = "plan.json"
PLAN_VERSION = 1
FORMATS: tuple[str, ...] = ("launch", "k8s")
DEFAULT_TEMPLATE: tuple[str, ...] = (
    "vllm", "serve", "{model}", "--tensor-parallel-size", "{tp}", "--port", "{port}", "--seed", "0",
)
BASE_PORT = 8000
# The four outcome metrics, named as in the measurement table (docs/contracts.md).
_METRICS = ("throughput_rps", "ttft_p99_s", "completion_p99_s", "success_rate")
_BOUND_COLS = {
    "throughput_rps": ("throughput_lo", "throughput_hi"),
    "ttft_p99_s": ("ttft_p99_lo", "ttft_p99_hi"),
    "completion_p99_s": ("completion_p99_lo", "completion_p99_hi"),
    "success_rate": ("success_lo", "success_hi"),
}
_CONCURRENCY_LABEL = re.compile(r"^[Cc](\d+)$")


def load_kind(label: str, backend: str) -> tuple[str, float | None]:
    """``("concurrency", N)`` for a replayed ``C<N>`` label, else ``("rate", None)``.

    The vLLM backend's labels are ordinal names of arrival multipliers, so its
    cells are rate cells whatever they are called.
    """
    m = _CONCURRENCY_LABEL.match(label)
    if m and backend != "vllm":
        return "concurrency", float(m.group(1))
    return "rate", None


def _server_template(view: CampaignView, model: str | None) -> dict[str, Any]:
    """The campaign's server command, arguments, environment and model (header ``inputs``)."""
    m = ((view.header.inputs or {}).get("measurement") or {})
    backend = str(m.get("backend") or "replay")
    template = list(m.get("command") or DEFAULT_TEMPLATE)
    extra = list(m.get("extra_args") or [])
    env = {str(k): str(v) for k, v in (m.get("env") or {}).items()}
    chosen = model or m.get("model")
    source = "--model" if model else "[measurement] model"
    if chosen and not model and view.header.campaign_file:
        # As the vLLM backend does: a path relative to the campaign file that exists there.
        p = Path(view.header.campaign_file).parent / str(chosen)
        if p.exists():
            chosen = str(p.resolve())
    if not chosen:
        chosen = str(((view.header.inputs or {}).get("model") or {}).get("family") or "MODEL")
        source = "prior card name (pass --model to name the served model)"
    served = m.get("served_model_name") or chosen
    return {"backend": backend, "command": template, "extra_args": extra, "env": env,
            "model": str(chosen), "model_source": source, "served_model_name": str(served)}


def _catalogued_bounds(view: CampaignView) -> Any:
    """A catalogued campaign's ``bounds.csv`` (its ``tp`` is empty for a disaggregated
    configuration; its cells are named by ``config``), else what :func:`read_bounds` gives.

    Raises:
        InputError: a ``bounds.csv`` without the columns a catalogued campaign writes.
    """
    import pandas as pd

    from fleetsieve_bayes.campaign.directory import read_bounds, read_measurements
    from fleetsieve_bayes.table import BOUNDS_COLUMNS

    path = view.directory / "bounds.csv"
    if not path.is_file():
        return read_bounds(view, read_measurements(view))
    try:
        b = pd.read_csv(path, dtype={"workload": str, "load": str, "config": str})
    except Exception as exc:  # noqa: BLE001 - any parser failure is bad input
        raise InputError(f"{path}: cannot parse bounds ({exc})".splitlines()[0]) from None
    missing = [c for c in (*BOUNDS_COLUMNS, "config") if c not in b.columns and c != "tp"]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}")
    b["measured"] = b["measured"].map(lambda v: str(v).strip().lower() in ("true", "1", "yes"))
    for c in BOUNDS_COLUMNS[4:]:
        b[c] = pd.to_numeric(b[c], errors="coerce")
    return b


def _predictions(view: CampaignView, catalogued: bool = False) -> dict[tuple[str, Any, str], dict[str, Any]]:
    """Per cell: each metric's posterior-predictive median and interval, and bounds.csv's interval.

    A cell is ``(workload, tp, load)``, or ``(workload, config, load)`` in a catalogued campaign.
    """
    from fleetsieve_bayes.campaign.directory import read_bounds, read_measurements, read_posterior

    out: dict[tuple[str, Any, str], dict[str, Any]] = {}
    bounds = _catalogued_bounds(view) if catalogued else read_bounds(view, read_measurements(view))
    for _, b in bounds.iterrows():
        conf = str(b["config"]) if catalogued else int(b["tp"])
        key = (str(b["workload"]), conf, str(b["load"]))
        out[key] = {"measured": bool(b["measured"]),
                    "bounds": {m: [float(b[lo]), float(b[hi])] for m, (lo, hi) in _BOUND_COLS.items()}}
    idata = read_posterior(view)
    level = float(view.header.credible_level or 0.9)
    pp = getattr(idata, "posterior_predictive", None) if idata is not None else None
    if pp is not None and "y" in pp:
        import numpy as np

        y = np.asarray(pp["y"].values, dtype=float)  # (chains, draws, n_cells, 4)
        y = y.reshape(-1, *y.shape[2:])
        qs = np.quantile(y, [(1 - level) / 2, 0.5, (1 + level) / 2], axis=0)  # (3, n_cells, 4)
        for i, c in enumerate(view.header.cells):
            if i >= y.shape[1]:
                break
            entry = out.setdefault((c.workload, c.config, c.load), {"measured": False, "bounds": {}})
            entry["predicted"] = {
                m: {"median": float(qs[1, i, k]), "interval": [float(qs[0, i, k]), float(qs[2, i, k])]}
                for k, m in enumerate(_METRICS)
            }
            entry["predicted_source"] = "posterior.nc posterior_predictive"
    for entry in out.values():
        if "predicted" not in entry:  # no posterior yet: the interval is the certificate's bounds
            entry["predicted"] = {
                m: {"median": 0.5 * (lo + hi) if math.isfinite(lo + hi) else hi, "interval": [lo, hi]}
                for m, (lo, hi) in entry["bounds"].items()
            }
            entry["predicted_source"] = "bounds.csv"
    return out


def _planned_allocation(view: CampaignView, alternative: int | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The allocation to plan: result.json's (else the last round's optimistic one), or its
    ranked alternative ``alternative`` (1-based) with that alternative's entry.

    Raises:
        InputError: no alternatives, ``alternative`` out of range, or no allocation with replicas.
    """
    alt = None
    if alternative is not None:
        ranked = (view.result or {}).get("alternatives")
        if not ranked:
            raise InputError(f"{view.directory}: result.json ranks no alternatives (a campaign that has not "
                             "finished, ran with [stopping] alternatives = 0, or predates them); plan it without --alternative")
        if not 1 <= alternative <= len(ranked):
            raise InputError(f"--alternative {alternative}: {view.directory} ranks {len(ranked)} alternative(s); "
                             f"choose 1 to {len(ranked)}")
        alt = ranked[alternative - 1]
        alloc = alt.get("allocation")
    else:
        alloc = view.decided_allocation
        if not alloc:
            last = view.last_round
            alloc = None if last is None else last.optimistic.allocation
    if not alloc or not any(int((a or {}).get("replicas") or 0) for a in alloc.values()):
        raise InputError(f"{view.directory}: campaign ({view.status}) has no allocation with replicas to deploy")
    return alloc, alt


def uncertified_note(plan: dict[str, Any]) -> str:
    """Why a plan is not certified, in one line (empty for a certified plan)."""
    if plan["certified"]:
        return ""
    alt = plan.get("alternative")
    if alt:
        return (f"alternative {alt['rank']} of campaign {plan['campaign']} ({plan['status']}), not its certified "
                f"allocation: P(ε-optimal) {float(alt['p_epsilon_optimal']):.3f}")
    return f"planned with --allow-uncertified from a campaign that is {plan['status']}; its SLOs are not certified"


def _file_digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def _pack_classes(
    classes_in: list[tuple[str, int, int]], nodes: int, gpus_per_node: int
) -> tuple[Packing, int]:
    """The exact packing of ``(workload, tp, replicas)`` onto the nodes, and the GPUs it uses.

    Raises:
        InputError: a class whose replicas do not fit (named, one line).
    """
    for w, tp, _ in classes_in:
        if tp > gpus_per_node:
            raise InputError(f"class {w}: a TP{tp} replica does not fit a node of {gpus_per_node} GPUs")
    total = sum(tp * n for _, tp, n in classes_in)
    replicas = [(w, tp) for w, tp, n in classes_in for _ in range(n)]
    packing = pack(replicas, nodes, gpus_per_node)
    if packing is None:
        bad = first_unfit(classes_in, nodes, gpus_per_node) or classes_in[-1][0]
        tp_n = next((tp, n) for w, tp, n in classes_in if w == bad)
        raise InputError(
            f"class {bad}: its {tp_n[1]} TP{tp_n[0]} replica(s) do not fit {nodes} node(s) × "
            f"{gpus_per_node} GPUs after the classes before it (the fleet needs {total} GPUs)"
        )
    return packing, total


def _class_entries(
    view: CampaignView,
    alloc: dict[str, Any],
    classes_in: list[tuple[str, int, int]],
    server: dict[str, Any],
    preds: dict[tuple[str, int, str], dict[str, Any]],
) -> list[dict[str, Any]]:
    """Each class's operating point in ``plan.json``: its cell, replicas, SLO, predictions and target."""
    slos = view.slos
    classes = []
    for w, tp, n in classes_in:
        load = str(alloc[w]["load"])
        kind, conc = load_kind(load, server["backend"])
        cell = preds.get((w, tp, load), {"measured": False, "bounds": {}, "predicted": {}})
        row = next((r.row for r in view.measurements if (r.cell.workload, r.cell.tp, r.cell.load) == (w, tp, load)), None)
        offered = None if row is None else float(row["offered_rps"])
        classes.append({
            "workload": w,
            "tp": tp,
            "load": load,
            "load_kind": kind,
            "concurrency_per_replica": conc,
            "offered_rps_per_replica": offered,
            "replicas": n,
            "gpus": tp * n,
            "demand_rps": view.demand.get(w),
            "slo": slos.get(w, {}),
            "measured": bool(cell.get("measured")),
            "measured_row": row,
            "predicted": cell.get("predicted", {}),
            "predicted_source": cell.get("predicted_source"),
            "bounds": cell.get("bounds", {}),
            "autoscaler_target": _target(kind, conc, offered),
        })
    return classes


def _pack_catalogued(
    classes_in: list[tuple[str, ServingConfig, int]], nodes: int, gpus_per_node: int, split: bool
) -> tuple[GroupPacking, int]:
    """The exact packing of each class's replicas of its configuration, worker by worker, and the
    GPUs it uses (:func:`.packing.pack_groups`).

    Raises:
        InputError: a class whose workers or replicas do not fit (named, one line).
    """
    g = gpus_per_node
    for w, cfg, _ in classes_in:
        for role, t in dict.fromkeys(replica_workers(cfg)):
            if t > g:
                what = f"a TP{t} replica ({cfg.name})" if role == "engine" else f"a TP{t} {role} worker of {cfg.name}"
                raise InputError(f"class {w}: {what} does not fit a node of {g} GPUs")
        if not split and cfg.gpus > g:
            raise InputError(f"class {w}: a replica of {cfg.name} ({describe_workers(cfg)}, {cfg.gpus} GPUs) does not "
                             f"fit a node of {g} GPUs; pass --split-replicas to place its workers on several nodes")
    total = sum(cfg.gpus * n for _, cfg, n in classes_in)
    groups = [(w, replica_workers(cfg)) for w, cfg, n in classes_in for _ in range(n)]
    packing = pack_groups(groups, nodes, g, split=split)
    if packing is None:
        per_class = [(w, replica_workers(cfg), n) for w, cfg, n in classes_in]
        bad = first_unfit_groups(per_class, nodes, g, split=split) or classes_in[-1][0]
        cfg, n = next((cfg, n) for w, cfg, n in classes_in if w == bad)
        hint = ("; --split-replicas places a replica's workers on several nodes, and then they fit"
                if not split and pack_groups(groups, nodes, g, split=True) is not None else "")
        raise InputError(
            f"class {bad}: its {n} {cfg.name} replica(s) ({describe_workers(cfg)}, {cfg.gpus} GPUs each) do not fit "
            f"{nodes} node(s) × {g} GPUs after the classes before it (the fleet needs {total} GPUs){hint}"
        )
    return packing, total


def _catalogued_classes(
    view: CampaignView,
    alloc: dict[str, Any],
    classes_in: list[tuple[str, ServingConfig, int]],
    server: dict[str, Any],
    preds: dict[tuple[str, Any, str], dict[str, Any]],
    roles: dict[str, str],
) -> list[dict[str, Any]]:
    """Each class's operating point in a catalogued ``plan.json``: the keys of a plain class,
    with ``tp`` the aggregated TP (null for a disaggregated configuration), then ``config``,
    ``gpus_per_replica``, ``engine``, ``roles`` and ``router`` (null for an aggregated one)."""
    slos = view.slos
    classes = []
    for w, cfg, n in classes_in:
        load = str(alloc[w]["load"])
        kind, conc = load_kind(load, server["backend"])
        cell = preds.get((w, cfg.name, load), {"measured": False, "bounds": {}, "predicted": {}})
        row = next((r.row for r in view.measurements
                    if (r.cell.workload, str(r.cell.config), r.cell.load) == (w, cfg.name, load)), None)
        offered = None if row is None else float(row["offered_rps"])
        target = _target(kind, conc, offered)
        classes.append({
            "workload": w,
            "tp": cfg.tp,
            "load": load,
            "load_kind": kind,
            "concurrency_per_replica": conc,
            "offered_rps_per_replica": offered,
            "replicas": n,
            "gpus": cfg.gpus * n,
            "demand_rps": view.demand.get(w),
            "slo": slos.get(w, {}),
            "measured": bool(cell.get("measured")),
            "measured_row": row,
            "predicted": cell.get("predicted", {}),
            "predicted_source": cell.get("predicted_source"),
            "bounds": cell.get("bounds", {}),
            "autoscaler_target": target,
            "config": cfg.name,
            "gpus_per_replica": cfg.gpus,
            "engine": cfg.engine_args,
            "roles": role_entries(cfg, n, target, kind, offered, roles) if cfg.disaggregated else None,
            "router": {"replicas": n} if cfg.disaggregated else None,
        })
    return classes


def _plain_fleet(
    view: CampaignView, alloc: dict[str, Any], server: dict[str, Any], shape: tuple[int, int], hosts: Sequence[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, str]:
    """An allocation without configurations: its classes, replica placements, GPUs and packing method."""
    preds = _predictions(view)
    classes_in = [(w, int(a["tp"]), int(a.get("replicas") or 0)) for w, a in alloc.items() if int(a.get("replicas") or 0)]
    packing, total = _pack_classes(classes_in, *shape)
    return _class_entries(view, alloc, classes_in, server, preds), _placements(packing, server, hosts), total, packing.method


def _catalogued_fleet(
    view: CampaignView,
    alloc: dict[str, Any],
    catalogue: tuple[ServingConfig, ...] | None,
    server: dict[str, Any],
    shape: tuple[int, int],
    hosts: Sequence[str],
    disagg: dict[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int, str, dict[str, Any]]:
    """A catalogued allocation's classes, worker placements, GPUs, packing method and the
    plan's ``disaggregation`` and ``routers`` (``disagg``: the settings, completed here with
    ``spread_replicas``).

    Raises:
        InputError: an empty connector or router command; what :func:`_pack_catalogued` and
            :func:`.catalogued.allocated_config` refuse.
    """
    if not disagg["kv_connector"]:
        raise InputError("--kv-connector: name a vLLM KV connector (default NixlConnector)")
    if not disagg["router_command"]:
        raise InputError("--router-command: name the router's command")
    source = str(view.directory / "journal.jsonl")
    preds = _predictions(view, catalogued=True)
    cat_in = [(w, allocated_config(w, a, catalogue, source), int(a.get("replicas") or 0))
              for w, a in alloc.items() if int(a.get("replicas") or 0)]
    packing, total = _pack_catalogued(cat_in, *shape, bool(disagg["split_replicas"]))
    disagg = {**disagg, "spread_replicas": [{"workload": w, "index": i} for w, i in packing.split]}
    classes = _catalogued_classes(view, alloc, cat_in, server, preds, disagg["kv_roles"])
    placements, routers = worker_placements(packing, {w: cfg for w, cfg, _ in cat_in}, server, hosts, disagg, BASE_PORT)
    return classes, placements, total, packing.method, {"disaggregation": disagg, "routers": routers}


def build_plan(
    directory: str | Path,
    nodes: int,
    gpus_per_node: int,
    *,
    allow_uncertified: bool = False,
    model: str | None = None,
    image: str = "vllm/vllm-openai:latest",
    namespace: str | None = None,
    hosts: Sequence[str] | None = None,
    alternative: int | None = None,
    kv_connector: str = DEFAULT_KV_CONNECTOR,
    kv_both: bool = False,
    router_command: Sequence[str] = DEFAULT_ROUTER_COMMAND,
    router_image: str | None = None,
    split_replicas: bool = False,
) -> dict[str, Any]:
    """The deployment plan of a campaign directory (the ``plan.json`` object).

    Args:
        directory: a campaign directory (``run --out``).
        nodes: nodes of the deployment (≥ 1).
        gpus_per_node: GPUs per node (≥ 1).
        allow_uncertified: plan an uncertified or infeasible campaign's
            allocation anyway (marked ``certified: false`` everywhere).
        model: the model the replicas serve (default: the campaign's
            ``[measurement] model``, else the prior card's name).
        image: container image of the manifests.
        namespace: Kubernetes namespace of the manifests (none: the default).
        hosts: host name of each node, for ``launch/prometheus.yml`` and the
            replicas' URLs (default ``node-0``, ``node-1``, …).
        alternative: plan result.json's ranked alternative of this rank (1: the
            top-ranked) instead of its allocation; ``certified`` only where it is the
            certified allocation itself.
        kv_connector, kv_both, router_command, router_image, split_replicas: a
            catalogued campaign's disaggregated configurations: the workers' KV
            connector, ``kv_both`` for every worker's ``kv_role`` (else producer and
            consumer), the router's command and image (default ``image``), and
            whether a replica may spread over nodes (:func:`_catalogued_fleet`).

    Raises:
        InputError: not a campaign directory; uncertified without
            ``allow_uncertified``; no allocation; an alternative the directory does
            not rank; a class whose replicas (or workers) do not fit the nodes (named,
            one line); an allocation naming a configuration the catalogue lacks.
    """
    if nodes < 1 or gpus_per_node < 1:
        raise InputError(f"--nodes and --gpus-per-node must be >= 1, got {nodes} and {gpus_per_node}")
    hosts = list(hosts) if hosts else [f"node-{n}" for n in range(nodes)]
    if len(hosts) != nodes:
        raise InputError(f"--hosts: {len(hosts)} host name(s) for {nodes} node(s)")
    view = load_campaign_dir(directory)
    status = view.status
    certified = status == "certified-feasible" and view.result is not None
    if not certified and not allow_uncertified:
        why = "still running" if view.state == "running" else ("has no result.json" if view.result is None else status)
        raise InputError(f"{view.directory}: campaign is {why}, not certified-feasible; "
                         "refusing to plan it (pass --allow-uncertified to plan it anyway, marked uncertified)")
    alloc, alt = _planned_allocation(view, alternative)
    if alt is not None:
        certified = certified and alloc == (view.result or {}).get("allocation")

    server = _server_template(view, model)
    catalogue = catalogue_of(view.header.inputs, str(view.directory / "journal.jsonl"))
    extra: dict[str, Any] = {}
    if catalogue is None and not any("config" in (a or {}) for a in alloc.values()):
        classes, placements, total, method = _plain_fleet(view, alloc, server, (nodes, gpus_per_node), hosts)
    else:
        disagg = {"kv_connector": str(kv_connector).strip(), "kv_roles": kv_roles(kv_both),
                  "router_command": [str(x) for x in router_command], "router_image": router_image or image,
                  "split_replicas": bool(split_replicas)}
        classes, placements, total, method, extra = _catalogued_fleet(
            view, alloc, catalogue, server, (nodes, gpus_per_node), hosts, disagg)
    h = view.header
    plan = {
        "version": PLAN_VERSION,
        "certified": certified,
        "status": status,
        "campaign": h.campaign,
        "campaign_dir": str(view.directory.resolve()),
        "certificate": _certificate(view, status),
        # The ranked alternative planned (``plan --alternative K``), else null.
        "alternative": None if alt is None else {
            k: alt[k] for k in ("rank", "p_epsilon_optimal", "p_slo_met", "gpus", "usd_per_hour",
                                "measured_cells", "predicted_cells") if k in alt
        },
        "credible_level": h.credible_level,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "hosts": hosts,
        "gpus_used": total,
        "packing_method": method,
        "server": server,
        "image": image,
        "namespace": namespace,
        "classes": classes,
        "placements": placements,
        **extra,
    }
    return finite_or_none(plan)


def _certificate(view: CampaignView, status: str) -> dict[str, Any]:
    """``plan.json``'s ``certificate``: the status, the journal header's digests, result.json's
    digest and its certificate's reason and probabilities."""
    h = view.header
    cert = (view.result or {}).get("certificate") or {}
    return {
        "status": status,
        "fingerprint": h.fingerprint,
        "campaign_fingerprint": (h.fingerprint or {}).get("campaign"),
        "result_sha256": _file_digest(view.directory / "result.json"),
        "reason": cert.get("reason"),
        "p_slo_met": cert.get("p_slo_met"),
        "p_epsilon_optimal": cert.get("p_epsilon_optimal"),
    }


def _target(kind: str, conc: float | None, offered: float | None) -> dict[str, Any]:
    if kind == "concurrency":
        return {"metric": "vllm:num_requests_running", "per_replica": conc, "unit": "requests in flight"}
    return {"metric": "rate(vllm:request_success_total)", "per_replica": offered, "unit": "requests/s"}


def _placements(packing: Packing, server: dict[str, Any], hosts: Sequence[str]) -> list[dict[str, Any]]:
    port_next = [BASE_PORT] * packing.nodes
    out = []
    for p in sorted(packing.placements, key=lambda p: (p.node, p.gpus[0])):
        port = port_next[p.node]
        port_next[p.node] += 1
        argv = replica_command(server["command"], server["extra_args"], model=server["model"], tp=p.tp, port=port)
        out.append({
            "workload": p.workload, "index": p.index, "tp": p.tp, "node": p.node, "gpus": list(p.gpus),
            "port": port, "metrics_url": f"http://{hosts[p.node]}:{port}/metrics", "env": {**server["env"], "CUDA_VISIBLE_DEVICES": ",".join(map(str, p.gpus))},
            "argv": argv,
        })
    return out


def _launch_script(plan: dict[str, Any], node: int) -> str:
    mark = "" if plan["certified"] else f"# UNCERTIFIED: {uncertified_note(plan)}.\n"
    lines = [
        "#!/usr/bin/env bash",
        f"# Node {node} of {plan['nodes']} ({plan['gpus_per_node']} GPUs): replicas of campaign "
        f"{plan['campaign']}, written by `fleetsieve-bayes plan`.",
        mark.rstrip("\n") if mark else None,
        "# Each replica runs in the background; its log goes to logs/<class>_<index>.log.",
        ("# A disaggregated replica's workers log to logs/<class>_<index>_<role><worker>.log, its router "
         "to logs/<class>_<index>_router.log.") if plan.get("routers") else None,
        "set -euo pipefail",
        'cd "$(dirname "$0")"',
        "mkdir -p logs",
        "pids=()",
    ]
    for p in plan["placements"]:
        if p["node"] != node:
            continue
        env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in p["env"].items())
        cmd = " ".join(shlex.quote(a) for a in p["argv"])
        log = f"logs/{p['workload']}_{p['index']}.log"
        what = f"TP{p['tp']} on GPUs {p['gpus']}, port {p['port']}"
        if p.get("role") not in (None, "engine"):  # a worker of a disaggregated replica
            log = f"logs/{p['workload']}_{p['index']}_{p['role']}{p['worker']}.log"
            what = f"{p['role']} worker {p['worker']}, {what}"
        if "config" in p:
            lines.append(f"# {p['workload']} replica {p['index']} ({p['config']}): {what}")
        else:
            lines.append(f"# {p['workload']} replica {p['index']}: {what}")
        lines.append(f"env {env} {cmd} > {shlex.quote(log)} 2>&1 &")
        lines.append("pids+=($!)")
    for r in plan.get("routers") or []:
        if r["node"] != node:
            continue
        cmd = " ".join(shlex.quote(a) for a in r["argv"])
        log = f"logs/{r['workload']}_{r['index']}_router.log"
        lines.append(f"# {r['workload']} replica {r['index']} ({r['config']}): router on port {r['port']}: each "
                     "request to a prefill worker (max_tokens = 1), then to a decode worker")
        lines.append(f"{cmd} > {shlex.quote(log)} 2>&1 &")
        lines.append("pids+=($!)")
    lines += ['trap \'kill "${pids[@]}" 2>/dev/null\' INT TERM', 'wait "${pids[@]}"', ""]
    return "\n".join(x for x in lines if x is not None)


def _prometheus_config(plan: dict[str, Any], scrape_interval_s: float = 5.0) -> str:
    """A Prometheus config scraping every replica, labelled ``class`` (what verify selects on)."""
    lines = [
        "# Prometheus scrape configuration of the launch plan, written by `fleetsieve-bayes plan`.",
        "# `fleetsieve-bayes verify PLAN --prometheus URL` selects each class by its `class` label.",
        "global:",
        f"  scrape_interval: {scrape_interval_s:g}s",
        "scrape_configs:",
    ]
    for c in plan["classes"]:
        targets = [p["metrics_url"].split("/")[2] for p in plan["placements"] if p["workload"] == c["workload"]]
        lines += [
            f"  - job_name: {json.dumps('vllm-' + c['workload'])}",
            "    metrics_path: /metrics",
            "    static_configs:",
        ]
        if not c.get("roles"):
            lines += [
                f"      - targets: {json.dumps(targets)}",
                "        labels:",
                f"          class: {json.dumps(c['workload'])}",
            ]
            continue
        for role in c["roles"]:  # a disaggregated class: its workers, labelled by role
            targets = [p["metrics_url"].split("/")[2] for p in plan["placements"]
                       if p["workload"] == c["workload"] and p.get("role") == role]
            lines += [
                f"      - targets: {json.dumps(targets)}",
                "        labels:",
                f"          class: {json.dumps(c['workload'])}",
                f"          role: {json.dumps(role)}",
            ]
    return "\n".join(lines) + "\n"


def write_plan(plan: dict[str, Any], out: str | Path, formats: Sequence[str] = FORMATS) -> list[Path]:
    """Write ``plan.json`` and the artefacts of ``formats`` under ``out``; returns the files written.

    Raises:
        InputError: an unknown format; manifests that fail the Kubernetes schemas.
    """
    from fleetsieve_bayes.atomic import atomic_write_text

    bad = [f for f in formats if f not in FORMATS]
    if bad:
        raise InputError(f"--format: unknown format {bad[0]!r} (choose from {', '.join(FORMATS)})")
    d = Path(out)
    d.mkdir(parents=True, exist_ok=True)
    written = []
    if "launch" in formats:
        (d / "launch").mkdir(exist_ok=True)
        for n in range(plan["nodes"]):
            p = d / "launch" / f"node_{n}.sh"
            atomic_write_text(p, _launch_script(plan, n))
            p.chmod(0o755)
            written.append(p)
        p = d / "launch" / "prometheus.yml"
        atomic_write_text(p, _prometheus_config(plan))
        written.append(p)
    if "k8s" in formats:
        from fleetsieve_bayes.deploy.k8s import manifests, render_yaml, validate_manifests

        docs = manifests(plan)
        validate_manifests([doc for _, group in docs for doc in group])
        (d / "k8s").mkdir(exist_ok=True)
        note = uncertified_note(plan) if plan.get("alternative") else f"campaign {plan['campaign']} is {plan['status']}"
        head = "" if plan["certified"] else f"# UNCERTIFIED: {note}.\n"
        for name, group in docs:
            p = d / "k8s" / f"{name}.yaml"
            atomic_write_text(p, head + render_yaml(group))
            written.append(p)
    p = d / PLAN_NAME
    atomic_write_text(p, json.dumps(plan, indent=2, allow_nan=False) + "\n")
    written.append(p)
    return written


def read_plan(path: str | Path) -> dict[str, Any]:
    """Read and check ``plan.json`` (a plan directory or the file itself).

    Raises:
        InputError: missing, not JSON, a newer version, or a field of the wrong shape (named).
    """
    p = Path(path)
    if p.is_dir():
        p = p / PLAN_NAME
    try:
        plan = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{p}: cannot read plan ({exc.strerror or exc})") from None
    except ValueError as exc:
        raise InputError(f"{p}: not JSON ({exc})") from None
    if not isinstance(plan, dict):
        raise InputError(f"{p}: expected a JSON object")
    if plan.get("version") != PLAN_VERSION:
        raise InputError(f"{p}: field 'version' must be {PLAN_VERSION}, got {plan.get('version')!r}")
    for key, typ in (("classes", list), ("placements", list), ("certified", bool), ("certificate", dict)):
        if not isinstance(plan.get(key), typ):
            raise InputError(f"{p}: field {key!r} must be a {typ.__name__}, got {plan.get(key)!r}"[:300])
    for i, c in enumerate(plan["classes"]):
        for key in ("workload", "tp", "load", "replicas", "load_kind", "predicted", "slo"):
            if not isinstance(c, dict) or key not in c:
                raise InputError(f"{p}: field 'classes[{i}].{key}' is missing")
    return plan
