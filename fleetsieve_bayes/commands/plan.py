"""``fleetsieve-bayes plan DIR --nodes N --gpus-per-node G --out PLAN_DIR``: deployable artefacts."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from fleetsieve_bayes.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="turn a certified campaign into launch scripts, Kubernetes manifests and plan.json",
        description="Pack the certified fleet's replicas onto nodes exactly and write plan.json "
        "(per class: the operating point, its posterior predictions and the certificate), "
        "launch/node_N.sh (vllm serve per replica with CUDA_VISIBLE_DEVICES and a port) and "
        "k8s/*.yaml (Deployment, Service and HorizontalPodAutoscaler per class, validated "
        "against the Kubernetes schemas).",
    )
    p.add_argument("directory", type=Path, help="campaign directory (run --out)")
    p.add_argument("--nodes", type=int, required=True, help="nodes of the deployment")
    p.add_argument("--gpus-per-node", type=int, required=True, help="GPUs on each node")
    p.add_argument("--out", type=Path, required=True, help="plan directory to write")
    p.add_argument("--format", default="launch,k8s",
                   help="comma-separated artefacts: launch, k8s (default both; plan.json always)")
    p.add_argument("--model", default=None,
                   help="model the replicas serve (default: the campaign's [measurement] model)")
    p.add_argument("--image", default="vllm/vllm-openai:latest", help="container image of the manifests")
    p.add_argument("--hosts", default=None,
                   help="comma-separated host name of each node (default node-0, node-1, …)")
    p.add_argument("--namespace", default=None, help="Kubernetes namespace of the manifests")
    p.add_argument("--alternative", type=int, default=None, metavar="K",
                   help="plan result.json's K-th ranked alternative fleet (1: the top-ranked) instead of its allocation")
    p.add_argument("--allow-uncertified", action="store_true",
                   help="plan an uncertified or infeasible campaign's allocation, marked as such everywhere")
    g = p.add_argument_group("configurations (a campaign with a [[configs]] catalogue)")
    g.add_argument("--kv-connector", default="NixlConnector",
                   help="vLLM KV connector of a disaggregated configuration's workers (default NixlConnector; "
                   "none: no KV transfer, the decode workers recompute the prompt)")
    g.add_argument("--kv-both", action="store_true",
                   help="kv_role kv_both for every disaggregated worker (default: kv_producer for prefill, "
                   "kv_consumer for decode)")
    g.add_argument("--router-command", default="python -m fleetsieve_bayes.backends.router",
                   help="command of a disaggregated replica's router; --host, --port, --prefill URL… and "
                   "--decode URL… follow (default: %(default)s)")
    g.add_argument("--router-image", default=None,
                   help="container image of the routers' Deployments (default: --image; the router command must run in it)")
    g.add_argument("--split-replicas", action="store_true",
                   help="let a disaggregated replica that does not fit one node place its workers on several nodes")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from fleetsieve_bayes.deploy.plan import build_plan, write_plan

    formats = [f.strip() for f in str(args.format).split(",") if f.strip()]
    if not formats:
        raise InputError("--format: name at least one of launch, k8s")
    try:
        router = shlex.split(str(args.router_command))
    except ValueError as exc:
        raise InputError(f"--router-command: {exc}") from None
    plan = build_plan(args.directory, args.nodes, args.gpus_per_node, allow_uncertified=args.allow_uncertified,
                      model=args.model, image=args.image, namespace=args.namespace, alternative=args.alternative,
                      hosts=None if args.hosts is None else [h.strip() for h in args.hosts.split(",")],
                      kv_connector=args.kv_connector, kv_both=args.kv_both, router_command=router,
                      router_image=args.router_image, split_replicas=args.split_replicas)
    written = write_plan(plan, args.out, formats)
    mark = "" if plan["certified"] else "  [UNCERTIFIED]"
    alt = plan.get("alternative")
    if alt:
        mark += f"  [alternative {alt['rank']}, P(ε-optimal) {float(alt['p_epsilon_optimal']):.3f}]"
    print(f"plan: {args.out} ({plan['status']}{mark}): {plan['gpus_used']} of "
          f"{plan['nodes'] * plan['gpus_per_node']} GPUs on {plan['nodes']} node(s), packing {plan['packing_method']}")
    for c in plan["classes"]:
        t = c["autoscaler_target"]
        cell = f"TP{c['tp']}@{c['load']}" if "config" not in c else f"{c['config']}@{c['load']}"
        print(f"  {c['workload']}: {cell} ×{c['replicas']}  "
              f"autoscaler target {t['per_replica']} {t['unit']} per replica")
    per_node: dict[int, list[str]] = {}
    for p in plan["placements"]:
        role = "" if p.get("role") in (None, "engine") else f"/{p['role']}{p['worker']}"
        per_node.setdefault(p["node"], []).append(
            f"{p['workload']}#{p['index']}{role}(GPUs {p['gpus'][0]}-{p['gpus'][-1]})")
    for r in plan.get("routers") or []:
        per_node.setdefault(r["node"], []).append(f"{r['workload']}#{r['index']}/router(:{r['port']})")
    for n in range(plan["nodes"]):
        print(f"  node {n}: " + (", ".join(per_node.get(n, [])) or "empty"))
    spread = (plan.get("disaggregation") or {}).get("spread_replicas") or []
    if spread:
        print("  replicas on several nodes (--split-replicas): "
              + ", ".join(f"{s['workload']}#{s['index']}" for s in spread))
    print(f"  wrote {len(written)} files")
    return 0
