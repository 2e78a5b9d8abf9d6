"""Kubernetes manifests of a plan, checked against the real Kubernetes schemas.

Per class (:func:`manifests`): an ``apps/v1`` Deployment (the certified
replica count, one container whose ``nvidia.com/gpu`` limit is the class's TP
and whose command is the campaign's server template with
``--tensor-parallel-size``, a readiness probe on ``/health``), a ``v1``
Service, and an ``autoscaling/v2`` HorizontalPodAutoscaler on a per-pod
custom metric whose target is the certified load setting:

* a concurrency cell: ``vllm_num_requests_running`` (vLLM's
  ``vllm:num_requests_running``) averaging the cell's concurrency;
* a rate cell: ``vllm_request_success_per_second``
  (``rate(vllm:request_success_total[2m])``) averaging the cell's requests/s.

``prometheus-adapter-rules.yaml`` is a ConfigMap with the prometheus-adapter
rules that serve those two names. The HPA's ``minReplicas`` is 1 and its
``maxReplicas`` the certified replicas plus what the nodes' spare GPUs hold at
the class's TP, so scaling out never takes GPUs from another class.

A catalogued class (docs/contracts.md, "Configurations") carries its
configuration's engine arguments as vLLM flags in the container's command
(after ``--tensor-parallel-size``), and is annotated
``fleetsieve-bayes/config``. A *disaggregated* class is, in its file
(:func:`disaggregated_objects`): a prefill Deployment (the class's replicas ×
its prefill workers, each pod's GPU limit the prefill TP), a decode Deployment
(replicas × decode workers, the decode TP), each with its Service and its own
HorizontalPodAutoscaler (the role's per-pod target, :mod:`.catalogued`), and a
router Deployment (one pod per replica, the plan's router command and image,
``--prefill`` and ``--decode`` the two Services) with its Service, the class's
entry point. Each object's name is the class's with ``-prefill``, ``-decode`` or
``-router`` (the class's part shortened, with six hex digits of its SHA-256,
to fit 63 characters); its pods are labelled ``fleetsieve-bayes/role``. The
workers' pods get ``VLLM_NIXL_SIDE_CHANNEL_HOST`` = the pod's IP with NIXL.

:func:`validate_manifests` checks every object with ``kubernetes-validate``
(bundled JSON schemas of Kubernetes :data:`K8S_VERSION`, strict: an unknown
field is an error).

Names (:func:`class_names`): a class's file stem and ``fleetsieve-bayes/class``
label is :func:`dns_name` of its name, its objects' name the campaign's and
that joined by ``-``. Class names that map to one label (``chat_a`` and
``chat-a``), or to the ConfigMap's stem, are told apart by a suffix of six hex
digits of the SHA-256 of the class's own name, on every class of the clash but
the one (if any) whose name is already that label: the names are distinct,
valid and depend only on the classes' names.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from fleetsieve_bayes.configs import KV_RECOMPUTE
from fleetsieve_bayes.errors import EnvironmentProblem, InputError

__all__ = [
    "K8S_VERSION",
    "manifests",
    "validate_manifests",
    "render_yaml",
    "dns_name",
    "class_names",
    "role_name",
    "disaggregated_objects",
]

K8S_VERSION = "1.31"
CONTAINER_PORT = 8000
_METRIC_RUNNING = "vllm_num_requests_running"
_METRIC_RATE = "vllm_request_success_per_second"
ADAPTER_STEM = "prometheus-adapter-rules"
_LABEL_MAX = 63

ADAPTER_RULES = f"""rules:
- seriesQuery: 'vllm:num_requests_running{{namespace!="",pod!=""}}'
  resources:
    overrides:
      namespace: {{resource: "namespace"}}
      pod: {{resource: "pod"}}
  name:
    as: "{_METRIC_RUNNING}"
  metricsQuery: 'sum(<<.Series>>{{<<.LabelMatchers>>}}) by (<<.GroupBy>>)'
- seriesQuery: 'vllm:request_success_total{{namespace!="",pod!=""}}'
  resources:
    overrides:
      namespace: {{resource: "namespace"}}
      pod: {{resource: "pod"}}
  name:
    as: "{_METRIC_RATE}"
  metricsQuery: 'sum(rate(<<.Series>>{{<<.LabelMatchers>>}}[2m])) by (<<.GroupBy>>)'
"""


def dns_name(text: str) -> str:
    """A DNS-1123 label from ``text`` (lower case, ``[a-z0-9-]``, at most 63 characters)."""
    s = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (s or "x")[:63].rstrip("-")


def _quantity(x: float) -> str:
    """A Kubernetes quantity: an integer, or milli-units."""
    if float(x).is_integer():
        return str(int(x))
    return f"{max(1, round(float(x) * 1000))}m"


def _suffixed(label: str, raw: str) -> str:
    """``label`` with ``-`` and six hex digits of the SHA-256 of ``raw``, within 63 characters."""
    tag = hashlib.sha256(raw.encode("utf-8")).hexdigest()[:6]
    return f"{label[: _LABEL_MAX - len(tag) - 1].rstrip('-') or 'x'}-{tag}"


def class_names(plan: dict[str, Any]) -> dict[str, dict[str, str]]:
    """Per class of ``plan``: ``key`` (its file stem and ``fleetsieve-bayes/class`` label) and
    ``name`` (its Deployment's, Service's and HorizontalPodAutoscaler's name), distinct across
    the classes and DNS-1123 labels (the rule is in the module's docstring).

    Raises:
        InputError: two classes still share a name (named, one line); only for names built
            to collide with another class's suffixed one.
    """
    workloads = [str(c["workload"]) for c in plan["classes"]]
    base = {w: dns_name(w) for w in workloads}
    groups: dict[str, list[str]] = {}
    for w in workloads:
        groups.setdefault(base[w], []).append(w)
    key: dict[str, str] = {}
    for label, members in groups.items():
        clash = len(members) > 1 or label == ADAPTER_STEM
        for w in members:
            key[w] = _suffixed(label, w) if clash and not (w == label and label != ADAPTER_STEM) else label
    prefix = dns_name(str(plan["campaign"]))
    out: dict[str, dict[str, str]] = {}
    for w in workloads:
        k = key[w]
        head = prefix[: max(_LABEL_MAX - len(k) - 1, 0)].rstrip("-")
        out[w] = {"key": k, "name": f"{head}-{k}" if head else k}
    for field in ("key", "name"):
        seen: dict[str, str] = {}
        for w in workloads:
            other = seen.setdefault(out[w][field], w)
            if other != w:
                raise InputError(f"classes {other!r} and {w!r} both map to the Kubernetes name "
                                 f"{out[w][field]!r}: rename one of them")
    return out


def _labels(names: dict[str, str]) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": names["name"],
        "app.kubernetes.io/managed-by": "fleetsieve-bayes",
        "fleetsieve-bayes/class": names["key"],
    }


def _annotations(plan: dict[str, Any], c: dict[str, Any]) -> dict[str, str]:
    cert = plan.get("certificate") or {}
    return {
        "fleetsieve-bayes/certified": "true" if plan["certified"] else "false",
        "fleetsieve-bayes/status": str(plan["status"]),
        "fleetsieve-bayes/campaign-fingerprint": str(cert.get("campaign_fingerprint")),
        "fleetsieve-bayes/class-name": str(c["workload"]),
        "fleetsieve-bayes/cell": f"TP{c['tp']}@{c['load']}" if "config" not in c else f"{c['config']}@{c['load']}",
        **({"fleetsieve-bayes/config": str(c["config"])} if "config" in c else {}),
    }


def _meta(plan: dict[str, Any], names: dict[str, str], c: dict[str, Any]) -> dict[str, Any]:
    m: dict[str, Any] = {"name": names["name"], "labels": _labels(names), "annotations": _annotations(plan, c)}
    if plan.get("namespace"):
        m["namespace"] = plan["namespace"]
    return m


def _argv(plan: dict[str, Any], c: dict[str, Any], role: str | None = None) -> list[str]:
    """A class's (or, with ``role``, a disaggregated class's role's) container command."""
    from fleetsieve_bayes.deploy.launch import worker_command

    s = plan["server"]
    tp = int(c["tp"] if role is None else c["roles"][role]["tp"])
    kv = None
    if role is not None and plan["disaggregation"]["kv_connector"].lower() != KV_RECOMPUTE:
        d = plan["disaggregation"]
        kv = (d["kv_connector"], d["kv_roles"][role])
    return worker_command(s["command"], s["extra_args"], model=s["model"], tp=tp, port=CONTAINER_PORT,
                          engine=sorted((c.get("engine") or {}).items()), kv=kv, ensure_tp=True)


def _class_objects(plan: dict[str, Any], c: dict[str, Any], names: dict[str, str]) -> list[dict[str, Any]]:
    if c.get("roles"):
        return disaggregated_objects(plan, c, names)
    name = names["name"]
    labels = _labels(names)
    selector = {k: labels[k] for k in ("app.kubernetes.io/instance", "fleetsieve-bayes/class")}
    tp = int(c["tp"])
    env = [{"name": k, "value": str(v)} for k, v in sorted(plan["server"]["env"].items())]
    container: dict[str, Any] = {
        "name": "vllm",
        "image": plan["image"],
        "command": _argv(plan, c),
        "ports": [{"name": "http", "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        "resources": {"limits": {"nvidia.com/gpu": str(tp)}, "requests": {"nvidia.com/gpu": str(tp)}},
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 3,
        },
        "startupProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 180,  # large models take many minutes to load
        },
    }
    if env:
        container["env"] = env
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(plan, names, c),
        "spec": {
            "replicas": int(c["replicas"]),
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels, "annotations": {
                    "prometheus.io/scrape": "true", "prometheus.io/port": str(CONTAINER_PORT),
                    "prometheus.io/path": "/metrics"}},
                "spec": {"containers": [container]},
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(plan, names, c),
        "spec": {"selector": selector, "ports": [{"name": "http", "port": CONTAINER_PORT, "targetPort": "http"}]},
    }
    target = c["autoscaler_target"]
    per = target.get("per_replica")
    spare = plan["nodes"] * plan["gpus_per_node"] - int(plan["gpus_used"])
    max_replicas = int(c["replicas"]) + spare // tp
    objs = [deployment, service]
    if per is not None and per > 0:
        metric = _METRIC_RUNNING if c["load_kind"] == "concurrency" else _METRIC_RATE
        objs.append({
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": _meta(plan, names, c),
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                "minReplicas": 1,
                "maxReplicas": max(max_replicas, 1),
                "metrics": [{
                    "type": "Pods",
                    "pods": {"metric": {"name": metric},
                             "target": {"type": "AverageValue", "averageValue": _quantity(per)}},
                }],
            },
        })
    return objs


def role_name(names: dict[str, str], role: str) -> str:
    """A disaggregated class's object name for ``role``: its name and ``-role``, within 63
    characters (shortened, with six hex digits of the SHA-256 of its name, where it is not)."""
    base, tail = names["name"], f"-{role}"
    if len(base) + len(tail) <= _LABEL_MAX:
        return base + tail
    tag = hashlib.sha256(base.encode("utf-8")).hexdigest()[:6]
    head = base[: _LABEL_MAX - len(tail) - len(tag) - 1].rstrip("-") or "x"
    return f"{head}-{tag}{tail}"


def _role_labels(names: dict[str, str], role: str) -> dict[str, str]:
    labels = _labels({"name": role_name(names, role), "key": names["key"]})
    if role == "router":
        labels["app.kubernetes.io/name"] = "fleetsieve-bayes-router"
    labels["app.kubernetes.io/component"] = role
    labels["fleetsieve-bayes/role"] = role
    return labels


def _role_meta(plan: dict[str, Any], names: dict[str, str], c: dict[str, Any], role: str) -> dict[str, Any]:
    m: dict[str, Any] = {"name": role_name(names, role), "labels": _role_labels(names, role),
                         "annotations": {**_annotations(plan, c), "fleetsieve-bayes/role": role}}
    if plan.get("namespace"):
        m["namespace"] = plan["namespace"]
    return m


def _hpa(meta: dict[str, Any], target_name: str, metric_name: str, per: float, max_replicas: int) -> dict[str, Any]:
    """An autoscaling/v2 HorizontalPodAutoscaler of a Deployment on a per-pod custom metric."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta,
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target_name},
            "minReplicas": 1,
            "maxReplicas": max(max_replicas, 1),
            "metrics": [{
                "type": "Pods",
                "pods": {"metric": {"name": metric_name},
                         "target": {"type": "AverageValue", "averageValue": _quantity(per)}},
            }],
        },
    }


def _deployment(plan: dict[str, Any], c: dict[str, Any], names: dict[str, str], role: str,
                container: dict[str, Any], replicas: int, scrape: bool) -> list[dict[str, Any]]:
    """A role's Deployment and Service."""
    labels = _role_labels(names, role)
    selector = {k: labels[k] for k in ("app.kubernetes.io/instance", "fleetsieve-bayes/class", "fleetsieve-bayes/role")}
    template_meta: dict[str, Any] = {"labels": labels}
    if scrape:
        template_meta["annotations"] = {"prometheus.io/scrape": "true", "prometheus.io/port": str(CONTAINER_PORT),
                                        "prometheus.io/path": "/metrics"}
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _role_meta(plan, names, c, role),
        "spec": {
            "replicas": int(replicas),
            "selector": {"matchLabels": selector},
            "template": {"metadata": template_meta, "spec": {"containers": [container]}},
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _role_meta(plan, names, c, role),
        "spec": {"selector": selector, "ports": [{"name": "http", "port": CONTAINER_PORT, "targetPort": "http"}]},
    }
    return [deployment, service]


def _probes(failure_threshold: int) -> dict[str, Any]:
    return {
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10, "failureThreshold": 3},
        "startupProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                         "failureThreshold": failure_threshold},
    }


def disaggregated_objects(plan: dict[str, Any], c: dict[str, Any], names: dict[str, str]) -> list[dict[str, Any]]:
    """A disaggregated class's objects: per role (prefill, decode) a Deployment, a Service and a
    HorizontalPodAutoscaler (where the role has a target), then the router's Deployment and Service."""
    d = plan["disaggregation"]
    spare = plan["nodes"] * plan["gpus_per_node"] - int(plan["gpus_used"])
    nixl = d["kv_connector"] == "NixlConnector"
    objs: list[dict[str, Any]] = []
    for role, r in c["roles"].items():
        tp = int(r["tp"])
        env: list[dict[str, Any]] = [{"name": k, "value": str(v)} for k, v in sorted(plan["server"]["env"].items())]
        if nixl:  # the decode workers reach a prefill worker's KV cache at its pod's address
            env.append({"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        container: dict[str, Any] = {
            "name": "vllm",
            "image": plan["image"],
            "command": _argv(plan, c, role),
            "ports": [{"name": "http", "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
            "resources": {"limits": {"nvidia.com/gpu": str(tp)}, "requests": {"nvidia.com/gpu": str(tp)}},
            **_probes(180),  # large models take many minutes to load
        }
        if env:
            container["env"] = env
        objs += _deployment(plan, c, names, role, container, int(r["pods"]), scrape=True)
        target = r["autoscaler_target"]
        per = target.get("per_replica")
        if per is not None and per > 0:
            metric = _METRIC_RATE if target["metric"].startswith("rate(") else _METRIC_RUNNING
            objs.append(_hpa(_role_meta(plan, names, c, role), role_name(names, role), metric, per,
                             int(r["pods"]) + spare // tp))
    svc = {role: role_name(names, role) for role in c["roles"]}
    from fleetsieve_bayes.deploy.catalogued import router_argv

    router = {
        "name": "router",
        "image": d.get("router_image") or plan["image"],
        "command": router_argv(d["router_command"], CONTAINER_PORT, [f"http://{svc['prefill']}:{CONTAINER_PORT}"],
                               [f"http://{svc['decode']}:{CONTAINER_PORT}"]),
        "ports": [{"name": "http", "containerPort": CONTAINER_PORT, "protocol": "TCP"}],
        **_probes(180),  # its /health answers 200 once every worker's does
    }
    objs += _deployment(plan, c, names, "router", router, int((c.get("router") or {}).get("replicas") or c["replicas"]),
                        scrape=False)
    return objs


def manifests(plan: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    """``(file stem, objects)`` per class, then the prometheus-adapter rules ConfigMap."""
    names = class_names(plan)
    out = [(names[c["workload"]]["key"], _class_objects(plan, c, names[c["workload"]])) for c in plan["classes"]]
    cm: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "fleetsieve-prometheus-adapter-rules",
                     "labels": {"app.kubernetes.io/managed-by": "fleetsieve-bayes"}},
        "data": {"config.yaml": ADAPTER_RULES},
    }
    if plan.get("namespace"):
        cm["metadata"]["namespace"] = plan["namespace"]
    out.append((ADAPTER_STEM, [cm]))
    return out


def validate_manifests(objects: list[dict[str, Any]], version: str = K8S_VERSION) -> None:
    """Check each object against the Kubernetes ``version`` schemas (strict).

    Raises:
        InputError: the first object that fails, its kind, name and the field.
        EnvironmentProblem: ``kubernetes-validate`` is not installed.
    """
    try:
        import kubernetes_validate
    except ImportError:
        raise EnvironmentProblem(
            "validating manifests needs kubernetes-validate (pip install 'fleetsieve-bayes[deploy]')"
        ) from None
    for obj in objects:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = ".".join(str(x) for x in getattr(exc, "path", ())) or "(object)"
            first = str(getattr(exc, "message", exc)).splitlines()[0]
            raise InputError(
                f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}: field {where}: {first} "
                f"(Kubernetes {version} schema)"
            ) from None
        except (kubernetes_validate.SchemaNotFoundError, kubernetes_validate.InvalidSchemaError) as exc:
            raise InputError(f"{obj.get('apiVersion')} {obj.get('kind')}: no Kubernetes {version} schema ({exc})") from None


def render_yaml(objects: list[dict[str, Any]]) -> str:
    """The objects as a multi-document YAML stream (JSON documents when PyYAML is missing)."""
    try:
        import yaml
    except ImportError:
        return "\n---\n".join(json.dumps(o, indent=2) for o in objects) + "\n"
    return "---\n" + "---\n".join(yaml.safe_dump(o, sort_keys=False, default_flow_style=False) for o in objects)
