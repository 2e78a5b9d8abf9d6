"""Plans of catalogued allocations: configurations, their engine arguments and disaggregated roles.

A campaign with a ``[[configs]]`` catalogue (docs/contracts.md,
"Configurations") allocates each class a *configuration*: an aggregated one
(one engine on ``tp`` GPUs, with engine arguments) or a disaggregated one
(``prefill.workers`` prefill engines and ``decode.workers`` decode engines,
each on its role's ``tp`` GPUs). :func:`.plan.build_plan` plans it with this
module:

* :func:`catalogue_of` reads the catalogue from the journal header;
* :func:`replica_workers` is one replica's workers (``engine``, or
  ``prefill`` / ``decode`` with their TPs), which :func:`.packing.pack_groups`
  places: each worker on ``tp`` GPUs of one node, a replica's workers on one
  node where it fits (``split_replicas`` lets a replica that does not fit, or
  that no whole packing holds, spread over nodes);
* :func:`worker_placements` gives every worker its port, environment and
  command (the template, the engine arguments as vLLM flags, and for a role
  its ``--kv-transfer-config``), and every disaggregated replica its router
  (:data:`DEFAULT_ROUTER_COMMAND` ``--host 0.0.0.0 --port P --prefill URL…
  --decode URL…``), which sends each request to a prefill worker with
  ``max_tokens = 1``, then to a decode worker;
* :func:`role_entries` is a disaggregated class's roles in ``plan.json``: per
  role its TP, workers per replica, pods (workers × replicas), GPUs, kv_role and
  autoscaler target per pod.

With NIXL (the default connector, :data:`DEFAULT_KV_CONNECTOR`, as vLLM's
docs/features/disagg_prefill.md and nixl_connector_usage.md use it) each
worker of a launch script also gets ``VLLM_NIXL_SIDE_CHANNEL_HOST`` (its node's
host, so that a decode worker on another node reaches it) and its own
``VLLM_NIXL_SIDE_CHANNEL_PORT`` (:data:`NIXL_SIDE_CHANNEL_BASE` plus its first
GPU's id: NIXL listens on that port plus the TP rank, so the workers of a node
never share one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetsieve_bayes.configs import KV_RECOMPUTE, ServingConfig, config_index, parse_catalogue
from fleetsieve_bayes.deploy.launch import KV_ROLES, worker_command
from fleetsieve_bayes.deploy.packing import GroupPacking
from fleetsieve_bayes.errors import InputError

__all__ = [
    "DEFAULT_KV_CONNECTOR",
    "DEFAULT_ROUTER_COMMAND",
    "NIXL_SIDE_CHANNEL_BASE",
    "ROLES",
    "catalogue_of",
    "allocated_config",
    "replica_workers",
    "describe_workers",
    "kv_roles",
    "role_entries",
    "worker_placements",
    "router_argv",
]

DEFAULT_KV_CONNECTOR = "NixlConnector"
DEFAULT_ROUTER_COMMAND: tuple[str, ...] = ("python", "-m", "fleetsieve_bayes.backends.router")
NIXL_SIDE_CHANNEL_BASE = 5600
ROLES: tuple[str, ...] = ("prefill", "decode")
_RATE_METRIC = "rate(vllm:request_success_total)"


def catalogue_of(inputs: dict[str, Any] | None, source: str) -> tuple[ServingConfig, ...] | None:
    """The catalogue the journal header's ``inputs["configs"]`` records (each entry's
    ``to_json()``), None for a campaign without one.

    Raises:
        InputError: a recorded entry that is not a configuration (named, one line).
    """
    raw = (inputs or {}).get("configs")
    if not raw:
        return None
    if not isinstance(raw, list):
        raise InputError(f"{source}: the journal header's configs must be a list, got {type(raw).__name__}")
    entries = [{k: v for k, v in e.items() if k != "gpus"} if isinstance(e, dict) else e for e in raw]
    return parse_catalogue(entries, source)


def allocated_config(workload: str, entry: dict[str, Any], catalogue: Sequence[ServingConfig] | None,
                     source: str) -> ServingConfig:
    """The configuration an allocation entry gives a class: its ``config`` in the catalogue,
    else (an entry without one) the aggregated TP it gives.

    Raises:
        InputError: a configuration the catalogue does not name, or an entry with neither.
    """
    name = entry.get("config")
    if name is not None and not catalogue:
        raise InputError(f"{source}: class {workload}: the allocation names config {name!r}, but the journal "
                         "header records no [[configs]]")
    if name is not None and catalogue:
        lookup = config_index(catalogue)
        if str(name).lower() not in lookup:
            raise InputError(f"{source}: class {workload}: config {name!r} is not in the campaign's [[configs]]")
        return catalogue[lookup[str(name).lower()]]
    if entry.get("tp") is None:
        raise InputError(f"{source}: class {workload}: allocation entry names no config and no tp: {entry!r}"[:300])
    return ServingConfig(name=f"TP{int(entry['tp'])}", tp=int(entry["tp"]))


def replica_workers(config: ServingConfig) -> tuple[tuple[str, int], ...]:
    """One replica's workers ``(role, tp)``: ``(("engine", tp),)``, or the prefill workers then the decode ones."""
    if not config.disaggregated:
        assert config.tp is not None
        return (("engine", int(config.tp)),)
    assert config.prefill is not None and config.decode is not None
    return (*((("prefill", config.prefill.tp),) * config.prefill.workers),
            *((("decode", config.decode.tp),) * config.decode.workers))


def describe_workers(config: ServingConfig) -> str:
    """``TP4`` or ``2 prefill TP2 + 1 decode TP4``."""
    if not config.disaggregated:
        return f"TP{config.tp}"
    assert config.prefill is not None and config.decode is not None
    return (f"{config.prefill.workers} prefill TP{config.prefill.tp} + "
            f"{config.decode.workers} decode TP{config.decode.tp}")


def kv_roles(kv_both: bool) -> dict[str, str]:
    """The ``kv_role`` of each role's workers: producer and consumer, or ``kv_both`` for both."""
    return {r: "kv_both" for r in ROLES} if kv_both else dict(KV_ROLES)


def role_entries(config: ServingConfig, replicas: int, target: dict[str, Any], load_kind: str,
                 offered: float | None, roles: dict[str, str]) -> dict[str, dict[str, Any]]:
    """A disaggregated class's roles in ``plan.json``.

    Each role's autoscaler target is per pod of the role: the decode pods share the
    class's per-replica target (its concurrency, or requests/s) over the replica's decode
    workers; the prefill pods see each request once, so their target is the cell's
    offered requests/s over the prefill workers (null where the cell has no measured
    offered rate: no autoscaler for the role).
    """
    out: dict[str, dict[str, Any]] = {}
    per = target.get("per_replica")
    for role in ROLES:
        r = getattr(config, role)
        if role == "decode" or load_kind == "rate":
            t = {**target, "per_replica": None if per is None else float(per) / r.workers}
        else:
            t = {"metric": _RATE_METRIC, "per_replica": None if offered is None else float(offered) / r.workers,
                 "unit": "requests/s"}
        out[role] = {"tp": r.tp, "workers": r.workers, "pods": r.workers * int(replicas),
                     "gpus": r.gpus * int(replicas), "kv_role": roles[role], "autoscaler_target": t}
    return out


def router_argv(command: Sequence[str], port: int, prefill: Sequence[str], decode: Sequence[str]) -> list[str]:
    """The router's argument list: ``command --host 0.0.0.0 --port P --prefill URL… --decode URL…``."""
    return [*command, "--host", "0.0.0.0", "--port", str(port), "--prefill", *prefill, "--decode", *decode]


def worker_placements(
    packing: GroupPacking,
    configs: dict[str, ServingConfig],
    server: dict[str, Any],
    hosts: Sequence[str],
    disagg: dict[str, Any],
    base_port: int,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every worker's ``plan.json`` placement (ports from ``base_port`` on each node, in GPU
    order) and every disaggregated replica's router (on its first prefill worker's node,
    on the next port there).

    ``configs``: each class's configuration; ``disagg``: the plan's ``disaggregation``
    settings (``kv_connector``, ``kv_roles``, ``router_command``).
    """
    port_next = [base_port] * packing.nodes
    out: list[dict[str, Any]] = []
    nixl = disagg["kv_connector"] == DEFAULT_KV_CONNECTOR
    for p in sorted(packing.placements, key=lambda p: (p.node, p.gpus[0])):
        port = port_next[p.node]
        port_next[p.node] += 1
        cfg = configs[p.workload]
        recompute = disagg["kv_connector"].lower() == KV_RECOMPUTE  # no KV transfer: no connector flags
        kv = None if p.role == "engine" or recompute else (disagg["kv_connector"], disagg["kv_roles"][p.role])
        argv = worker_command(server["command"], server["extra_args"], model=server["model"], tp=p.tp, port=port,
                              engine=cfg.engine, kv=kv)
        env = {**server["env"], "CUDA_VISIBLE_DEVICES": ",".join(map(str, p.gpus))}
        if kv is not None and nixl:
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = hosts[p.node]
            env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(NIXL_SIDE_CHANNEL_BASE + p.gpus[0])
        out.append({
            "workload": p.workload, "index": p.index, "tp": p.tp, "node": p.node, "gpus": list(p.gpus),
            "port": port, "metrics_url": f"http://{hosts[p.node]}:{port}/metrics", "env": env, "argv": argv,
            "config": cfg.name, "role": p.role, "worker": p.worker,
        })
    routers: list[dict[str, Any]] = []
    replicas: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for q in out:
        if q["role"] != "engine":
            replicas.setdefault((q["workload"], q["index"]), []).append(q)
    order = {w: i for i, w in enumerate(dict.fromkeys(p.workload for p in packing.placements))}
    for (w, i), workers in sorted(replicas.items(), key=lambda kv: (order[kv[0][0]], kv[0][1])):
        urls = {r: [f"http://{hosts[q['node']]}:{q['port']}"
                    for q in sorted((q for q in workers if q["role"] == r), key=lambda q: q["worker"])] for r in ROLES}
        node = min((q for q in workers if q["role"] == "prefill"), key=lambda q: q["worker"])["node"]
        port = port_next[node]
        port_next[node] += 1
        routers.append({
            "workload": w, "index": i, "config": configs[w].name, "node": node, "port": port,
            "url": f"http://{hosts[node]}:{port}", "nodes": sorted({q["node"] for q in workers}),
            "argv": router_argv(disagg["router_command"], port, urls["prefill"], urls["decode"]),
        })
    return out, routers
