"""From a certified campaign to a running fleet and back.

* :mod:`.packing` — exact placement of replicas (a TP-t replica on t GPUs of one node);
* :mod:`.plan` — ``plan.json``, per-node launch scripts, Prometheus scrape config;
* :mod:`.catalogued` — a catalogued allocation's configurations: engine arguments as vLLM
  flags, disaggregated replicas as prefill and decode workers behind a router;
* :mod:`.k8s` — Deployment / Service / HorizontalPodAutoscaler per class, schema-validated;
* :mod:`.metrics` — vLLM's ``/metrics``: parsing, window differences, p99 bucket bounds;
* :mod:`.verify` — live windows (direct scrapes or Prometheus) judged against the plan;
* :mod:`.production` — verify reports as production observations for a re-plan.
"""

from __future__ import annotations

from fleetsieve_bayes.deploy.packing import pack
from fleetsieve_bayes.deploy.plan import build_plan, read_plan, write_plan

__all__ = ["pack", "build_plan", "read_plan", "write_plan"]
