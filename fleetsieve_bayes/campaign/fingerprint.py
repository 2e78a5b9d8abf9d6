"""What a campaign's decisions depend on, and what changed between two runs.

A campaign directory may only be resumed by the very campaign that started it:
the journal header keeps the campaign's validated settings (:func:`campaign_inputs`)
and a digest of every other decision input (prior card and inference preset
content, replay and seed tables, seed, strategy). A resume that differs in
anything stops with one line naming what changed (:func:`mismatch`).

``run --reuse-measurements OLD`` starts a *new* decision from OLD's
measurements; that is sound only when the cells and what a measurement of them
returns are unchanged, i.e. when only demands, SLOs, floors, the GPU budget or
the stopping rule differ (:func:`reuse_refusal`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from fleetsieve_bayes.campaign.config import Campaign
from fleetsieve_bayes.settings import CERTIFY_INFERENCE, UNCERTIFIED_ANSWER

__all__ = ["campaign_inputs", "campaign_digest", "file_digest", "object_digest", "fingerprint", "mismatch", "reuse_refusal", "diff_paths"]


def file_digest(path: Path | None) -> str | None:
    """SHA-256 of a file's bytes (None for no file)."""
    if path is None:
        return None
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def object_digest(obj: Any) -> str:
    """SHA-256 of a JSON-able value (keys sorted; other values by ``str``)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


_digest = object_digest


def campaign_inputs(campaign: Campaign) -> dict[str, Any]:
    """The validated campaign settings as plain JSON (what the header keeps and diffs)."""
    m = campaign.measurement
    return {
        "name": campaign.name,
        "fleet": _fleet_inputs(campaign),
        "model": {
            "family": campaign.family,
            "inference": campaign.inference,
            "repeatability": campaign.repeatability,
            "tail_margin": campaign.tail_margin,
            "success_margin": campaign.success_margin,
            "knee_guard": campaign.knee_guard,
            # Only when set: a directory started before the key existed resumes unchanged.
            **({"certify_inference": campaign.certify_inference}
               if campaign.certify_inference != CERTIFY_INFERENCE else {}),
        },
        "measurement": {
            "backend": m.backend,
            # delay_s only slows a replay down (rehearsals); it changes no decision.
            **{k: (str(m.table) if k == "table" else v) for k, v in sorted(m.options.items()) if k != "delay_s"},
            "seed_tables": [str(p) for p in m.seed_tables],
        },
        "stopping": {
            "epsilon": campaign.epsilon,
            "credible_level": campaign.credible_level,
            "max_rounds": campaign.max_rounds,
            "risk": campaign.risk,
            "slo_attainment": campaign.slo_attainment,
            "max_windows_per_cell": campaign.max_windows_per_cell,
            # Only when set: a directory started before the key existed resumes unchanged.
            **({"uncertified_answer": campaign.uncertified_answer}
               if campaign.uncertified_answer != UNCERTIFIED_ANSWER else {}),
            # The profiling budget: only when set, likewise.
            **{k: getattr(campaign, k) for k in ("max_gpu_seconds", "max_wall_s")
               if getattr(campaign, k, None) is not None},
        },
        "workloads": {
            w.name: w.to_json()
            for w in campaign.workloads
        },
        # The catalogue of configurations: only when declared, likewise.
        **({"configs": [c.to_json() for c in campaign.configs]} if getattr(campaign, "configs", None) else {}),
    }


def _fleet_inputs(campaign: Campaign) -> dict[str, Any]:
    """``[fleet]``: the budget, and with ``[[fleet.pools]]`` each pool and the dollar cap."""
    out: dict[str, Any] = {"gpus": campaign.gpus}
    if campaign.pools:
        out["pools"] = [
            {"gpu": p.gpu, "count": p.count, "usd_per_gpu_hour": p.usd_per_gpu_hour, "nodes": list(p.nodes),
             "gpus_per_node": p.gpus_per_node}
            for p in campaign.pools
        ]
        out["usd_per_hour_max"] = campaign.usd_per_hour_max
    return out


def fingerprint(
    campaign: Campaign,
    *,
    card_file: Path | None,
    preset: Any,
    strategy: str,
    seed: int,
) -> dict[str, str]:
    """Digest of every decision input, by name."""
    out = {
        "campaign": campaign_digest(campaign),
        "prior_card": file_digest(card_file) or "",
        "inference": _preset_digest(preset),
        "table": file_digest(campaign.measurement.table) or "",
        "seed_tables": _digest([file_digest(p) for p in campaign.measurement.seed_tables]),
        "seed": str(seed),
        "strategy": strategy,
    }
    if campaign.certify_inference != CERTIFY_INFERENCE:
        from fleetsieve_bayes.model.inference import load_preset

        out["certify_inference"] = _preset_digest(load_preset(campaign.certify_inference))
    return out


def campaign_digest(campaign: Campaign) -> str:
    """The fingerprint's ``campaign`` entry: the digest of the settings, paths aside."""
    return _digest(_without_paths(campaign_inputs(campaign)))


def _preset_digest(preset: Any) -> str:
    """Digest of an inference preset's settings (its name aside)."""
    fields = preset._asdict() if hasattr(preset, "_asdict") else preset
    return _digest({k: v for k, v in dict(fields).items() if k != "name"})


# Settings that name a file: what matters is its content, digested on its own
# (a campaign moved to another folder, or naming a card by path instead of by
# name, is the same campaign).
_PATH_KEYS = (
    ("model", "family"), ("model", "inference"), ("model", "certify_inference"),
    ("measurement", "table"), ("measurement", "seed_tables"))


def _without_paths(inputs: dict[str, Any]) -> dict[str, Any]:
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in inputs.items()}
    for section, key in _PATH_KEYS:
        if isinstance(out.get(section), dict):
            out[section].pop(key, None)
    return out


def diff_paths(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted paths where two JSON values differ, with both values (``a.b: 1 → 2``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in list(old) + [k for k in new if k not in old]:
            p = f"{prefix}.{k}" if prefix else str(k)
            if k not in new:
                out.append(f"{p} removed")
            elif k not in old:
                out.append(f"{p} added")
            else:
                out.extend(diff_paths(old[k], new[k], p))
        return out
    if old != new:
        return [f"{prefix}: {_short(old)} → {_short(new)}"]
    return []


def _short(v: Any) -> str:
    s = json.dumps(v, default=str)
    return s if len(s) <= 60 else s[:57] + "..."


_LABELS = {
    "campaign": "campaign settings",
    "prior_card": "prior card content",
    "inference": "inference preset",
    "certify_inference": "certifying inference preset",
    "table": "replay table content",
    "seed_tables": "seed table content",
    "seed": "seed",
    "strategy": "strategy",
}


def mismatch(
    old_fp: dict[str, str] | None,
    new_fp: dict[str, str],
    old_inputs: dict[str, Any] | None,
    new_inputs: dict[str, Any],
    *,
    old_seed: int | None = None,
    old_strategy: str | None = None,
) -> str | None:
    """None when two fingerprints agree, else a short phrase naming what changed."""
    if old_fp is None:
        return "the journal was written by an older version without a fingerprint of its inputs"
    changed = []
    for key, label in _LABELS.items():
        if old_fp.get(key) == new_fp.get(key):
            continue
        if key == "campaign" and old_inputs is not None:
            fields = diff_paths(_without_paths(old_inputs), _without_paths(new_inputs))
            changed.append(f"campaign ({'; '.join(fields[:3])}{'; …' if len(fields) > 3 else ''})" if fields else label)
        elif key == "seed":
            changed.append(f"seed ({old_seed} → {new_fp['seed']})")
        elif key == "strategy":
            changed.append(f"strategy ({old_strategy} → {new_fp['strategy']})")
        else:
            changed.append(label)
    return ", ".join(changed) if changed else None


# What a re-plan may change while reusing measurements: the demand side and the
# stopping rule, never what a measurement of a cell returns.
# The interval rules (margins, knee guard) change how measurements are read,
# not what a measurement returns: a new decision may reuse the old cells.
_REPLANNABLE = ("name", "fleet.", "stopping.", "model.tail_margin", "model.success_margin", "model.knee_guard")
_REPLANNABLE_WORKLOAD = ("demand_rps", "critical", "floor", "slo")


def reuse_refusal(
    old_fp: dict[str, str] | None,
    new_fp: dict[str, str],
    old_inputs: dict[str, Any] | None,
    new_inputs: dict[str, Any],
) -> str | None:
    """None when OLD's measurements can seed the new campaign, else why not."""
    if old_fp is None or old_inputs is None:
        return "it was written by an older version that did not record its inputs"
    for key in ("prior_card", "inference", "table", "seed_tables"):
        if old_fp.get(key) != new_fp.get(key):
            return f"its {_LABELS[key]} differs"
    bad = []
    for path in diff_paths(_without_paths(old_inputs), _without_paths(new_inputs)):
        name = path.split(":")[0].split(" ")[0]
        if name.startswith(_REPLANNABLE):
            continue
        parts = name.split(".")
        if (
            parts[0] == "workloads"
            and len(parts) >= 3
            and parts[2] in _REPLANNABLE_WORKLOAD
        ):
            continue
        bad.append(path)
    if bad:
        return f"more than demands/SLOs/budget/stopping changed ({'; '.join(bad[:3])})"
    return None
