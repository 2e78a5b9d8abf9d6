"""``fleetsieve-bayes plan``: plan.json, launch scripts and manifests validated against the Kubernetes schemas."""

from __future__ import annotations

import copy
import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from campaign_dirs import CERTIFIED_ALLOCATION, Runs, copy_run, journal

from fleetsieve_bayes.campaign.journal import HEADER_VERSION, Header, open_journal, read_records
from fleetsieve_bayes.cli import main as cli_main
from fleetsieve_bayes.deploy.k8s import class_names, manifests, validate_manifests
from fleetsieve_bayes.deploy.plan import build_plan, load_kind, read_plan, write_plan
from fleetsieve_bayes.errors import InputError


@pytest.fixture(scope="module")
def campaign(shipped_runs: Runs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shipped campaign at "point" as `run` wrote it (certified)."""
    return copy_run(shipped_runs.certified, tmp_path_factory.mktemp("campaign"))


@pytest.fixture(scope="module")
def planned(campaign: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("plan")
    plan = build_plan(campaign, 2, 8)
    write_plan(plan, out)
    return out, plan


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_packs_the_certified_fleet_onto_two_nodes(planned: tuple[Path, dict[str, Any]]) -> None:
    out, plan = planned
    assert plan["certified"] is True and plan["status"] == "certified-feasible"
    assert plan["gpus_used"] == 16 and plan["packing_method"] == "ffd"
    per_class = {c["workload"]: (c["tp"], c["load"], c["replicas"]) for c in plan["classes"]}
    assert per_class == {w: (a["tp"], a["load"], a["replicas"]) for w, a in CERTIFIED_ALLOCATION.items()}
    result = json.loads((Path(plan["campaign_dir"]) / "result.json").read_text())
    assert plan["certificate"]["fingerprint"] == json.loads((Path(plan["campaign_dir"]) / "journal.jsonl").read_text().splitlines()[0])["fingerprint"]
    assert plan["certificate"]["reason"] == result["certificate"]["reason"]
    assert {c["workload"]: c["predicted_source"] for c in plan["classes"]} == {"chat": "posterior.nc posterior_predictive", "code": "posterior.nc posterior_predictive"}
    used = [0, 0]
    seen: set[tuple[int, int]] = set()
    for p in plan["placements"]:
        used[p["node"]] += p["tp"]
        assert p["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, p["gpus"]))
        assert {(p["node"], g) for g in p["gpus"]}.isdisjoint(seen)
        seen |= {(p["node"], g) for g in p["gpus"]}
        argv = p["argv"]
        assert argv[argv.index("--tensor-parallel-size") + 1] == str(p["tp"])
        assert argv[argv.index("--port") + 1] == str(p["port"])
    assert used == [8, 8]
    ports = [(p["node"], p["port"]) for p in plan["placements"]]
    assert len(set(ports)) == len(ports)
    assert sorted(p["workload"] for p in plan["placements"]) == ["chat", "chat", "code", "code"]


def test_launch_scripts_are_bash_and_name_each_replica(planned: tuple[Path, dict[str, Any]]) -> None:
    out, plan = planned
    for n in range(2):
        script = out / "launch" / f"node_{n}.sh"
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
        text = script.read_text()
        for p in (p for p in plan["placements"] if p["node"] == n):
            assert f"env CUDA_VISIBLE_DEVICES={','.join(map(str, p['gpus']))} vllm serve" in text
            assert f"--tensor-parallel-size {p['tp']} --port {p['port']}" in text
        assert text.count("vllm serve") == sum(1 for p in plan["placements"] if p["node"] == n)
        assert "UNCERTIFIED" not in text


def test_manifests_on_disk_pass_the_kubernetes_schemas(planned: tuple[Path, dict[str, Any]]) -> None:
    out, plan = planned
    files = sorted((out / "k8s").glob("*.yaml"))
    assert [f.name for f in files] == ["chat.yaml", "code.yaml", "prometheus-adapter-rules.yaml"]
    docs = [d for f in files for d in _docs(f)]
    validate_manifests(docs)  # the files as written, read back
    chat = _docs(out / "k8s" / "chat.yaml")
    kinds = [d["kind"] for d in chat]
    assert kinds == ["Deployment", "Service", "HorizontalPodAutoscaler"]
    dep, _svc, hpa = chat
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert dep["spec"]["replicas"] == 2
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert c["command"][c["command"].index("--tensor-parallel-size") + 1] == "4"
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    metric = hpa["spec"]["metrics"][0]["pods"]
    assert metric["metric"]["name"] == "vllm_num_requests_running"
    assert metric["target"] == {"type": "AverageValue", "averageValue": "96"}  # the certified C96
    assert hpa["spec"]["maxReplicas"] == 2  # no spare GPUs on 2 × 8
    assert dep["metadata"]["annotations"]["fleetsieve-bayes/certified"] == "true"


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("spec", "template", "spec", "containers", 0, "bogusField"), 1, "bogusField"),
        (("spec", "replicas"), "two", "spec.replicas"),
        (("spec", "template", "spec", "containers", 0, "readinessProbe", "httpGet", "pathh"), "/health", "pathh"),
    ],
)
def test_an_invalid_field_fails_validation(planned: tuple[Path, dict[str, Any]], path: tuple, value: Any, field: str) -> None:
    _, plan = planned
    docs = [d for _, group in manifests(plan) for d in group]
    bad = copy.deepcopy(docs)
    node: Any = bad[0]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(InputError, match=field.split(".")[-1]) as exc:
        validate_manifests(bad)
    assert "Deployment" in str(exc.value) and "\n" not in str(exc.value)


def test_spare_gpus_raise_the_autoscaler_ceiling(campaign: Path) -> None:
    plan = build_plan(campaign, 3, 8)
    hpa = [d for _, g in manifests(plan) for d in g if d["kind"] == "HorizontalPodAutoscaler"]
    assert [h["spec"]["maxReplicas"] for h in hpa] == [4, 4]  # 8 spare GPUs hold two more TP4 replicas


def test_a_fleet_that_does_not_fit_names_the_class(campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["plan", str(campaign), "--nodes", "1", "--gpus-per-node", "8", "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "class code" in err and "16 GPUs" in err
    rc = cli_main(["plan", str(campaign), "--nodes", "4", "--gpus-per-node", "2", "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "class chat: a TP4 replica does not fit a node of 2 GPUs" in err
    assert not (tmp_path / "p").exists()


def test_uncertified_is_refused_then_marked_everywhere(shipped_runs: Runs, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = copy_run(shipped_runs.killed, tmp_path / "c")  # killed after round 2: no result.json
    out = tmp_path / "p"
    rc = cli_main(["plan", str(d), "--nodes", "2", "--gpus-per-node", "8", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "has no result.json" in err and "--allow-uncertified" in err and not out.exists()
    rc = cli_main(["plan", str(d), "--nodes", "2", "--gpus-per-node", "8", "--out", str(out), "--allow-uncertified"])
    assert rc == 0, capsys.readouterr().err
    plan = read_plan(out)
    assert plan["certified"] is False and plan["status"] == "undecided"
    last = [r for r in journal(d) if r["type"] == "round"][-1]
    conservative = {w: a for w, a in last["conservative"]["allocation"].items() if a["replicas"]}  # the last round's
    assert {c["workload"]: {"tp": c["tp"], "load": c["load"], "replicas": c["replicas"]} for c in plan["classes"]} == conservative
    assert plan["certificate"]["result_sha256"] is None
    for script in (out / "launch").glob("*.sh"):
        assert "UNCERTIFIED" in script.read_text()
    for f in (out / "k8s").glob("*.yaml"):
        assert f.read_text().startswith("# UNCERTIFIED")
        for doc in _docs(f):
            if doc["kind"] != "ConfigMap":
                assert doc["metadata"]["annotations"]["fleetsieve-bayes/certified"] == "false"


VLLM_INPUTS = {"backend": "vllm", "model": "/models/m", "served_model_name": "m",
               "command": ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}",
                           "--tensor-parallel-size", "{tp}", "--port", "{port}"],
               "extra_args": ["--max-num-seqs", "256"], "env": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}}


def _with_vllm_inputs(src: Path, d: Path) -> Path:
    """``src``'s campaign as if its [measurement] had been the vLLM backend: the journal written
    again, by the package's journal writer, with the header's ``inputs.measurement`` replaced
    (a real vLLM campaign needs servers; tests/test_vllm_campaign.py runs them)."""
    records, _ = read_records(src / "journal.jsonl")
    copy_run(src, d)
    (d / "journal.jsonl").unlink()
    j = open_journal(d)
    for r in records:
        j.append(r._replace(inputs={**(r.inputs or {}), "measurement": VLLM_INPUTS}) if isinstance(r, Header) else r)
    j.close()
    return d


def test_vllm_template_rate_cells_and_formats(shipped_runs: Runs, tmp_path: Path) -> None:
    d = _with_vllm_inputs(shipped_runs.certified, tmp_path / "c")
    assert json.loads((d / "journal.jsonl").read_text().splitlines()[0])["version"] == HEADER_VERSION
    plan = build_plan(d, 2, 8)
    p0 = plan["placements"][0]
    assert p0["argv"][:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert p0["argv"][-2:] == ["--max-num-seqs", "256"] and "/models/m" in p0["argv"]
    assert p0["env"]["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    chat = next(c for c in plan["classes"] if c["workload"] == "chat")
    assert chat["load_kind"] == "rate"  # the vLLM backend's labels are arrival multipliers
    row = next(r["row"] for r in journal(d) if r["type"] == "measurement" and r["cell"] == {"workload": "chat", "tp": chat["tp"], "load": chat["load"]})
    assert chat["autoscaler_target"]["per_replica"] == chat["offered_rps_per_replica"] == row["offered_rps"] == 6.6  # the grid's chat TP4@C96
    hpa = next(o for _, g in manifests(plan) for o in g if o["kind"] == "HorizontalPodAutoscaler")
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "vllm_request_success_per_second"
    assert hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "6600m"
    write_plan(plan, tmp_path / "only-launch", ["launch"])
    assert not (tmp_path / "only-launch" / "k8s").exists() and (tmp_path / "only-launch" / "plan.json").is_file()
    with pytest.raises(InputError, match="unknown format 'helm'"):
        write_plan(plan, tmp_path / "x", ["helm"])


def test_load_kind() -> None:
    assert load_kind("C96", "replay") == ("concurrency", 96.0)
    assert load_kind("C96", "vllm") == ("rate", None)
    assert load_kind("x4", "replay") == ("rate", None)


def test_read_plan_errors(tmp_path: Path, planned: tuple[Path, dict[str, Any]]) -> None:
    with pytest.raises(InputError, match="cannot read plan"):
        read_plan(tmp_path)
    (tmp_path / "plan.json").write_text("{")
    with pytest.raises(InputError, match="not JSON"):
        read_plan(tmp_path)
    plan = json.loads((planned[0] / "plan.json").read_text())
    del plan["classes"][0]["predicted"]
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    with pytest.raises(InputError, match=r"classes\[0\]\.predicted"):
        read_plan(tmp_path)


def test_report_shows_the_packing_and_live_windows(campaign: Path, planned: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    from fleetsieve_bayes.deploy.metrics import QuantileBound, WindowReading
    from fleetsieve_bayes.deploy.verify import verify_report
    from fleetsieve_bayes.reporting.report import write_report

    out, plan = planned
    live = {"chat": WindowReading(300.0, 2, 1000, 1000, 3.3, 3.3, 1.0, QuantileBound(2.5, 5.0, 3.0, 1000),
                                  QuantileBound(10.0, 15.0, 12.0, 1000), 0.4, {})}
    report = verify_report(plan, live, {"kind": "metrics", "window_s": 300.0})
    (tmp_path / "v.json").write_text(json.dumps(report))
    path, rep = write_report(campaign, tmp_path / "r.html", plan=out, verify=tmp_path / "v.json")
    text = path.read_text()
    assert "<h2>Deployment</h2>" in text and 'id="fig-packing"' in text and 'id="fig-live"' in text
    placed = rep.figures["fig-packing"].data["placements"]
    assert sorted(placed.groupby("node")["tp"].sum().tolist()) == [8, 8]
    win = rep.figures["fig-live"].data["windows"]
    chat_ttft = win[(win["workload"] == "chat") & (win["metric"] == "ttft_p99_s")].iloc[0]
    assert (chat_ttft["live_lo"], chat_ttft["live_hi"], chat_ttft["slo"]) == (2.5, 5.0, 2.0)
    assert chat_ttft["verdict"] == "violates"
    with pytest.raises(InputError, match="--verify needs --plan"):
        write_report(campaign, tmp_path / "r2.html", verify=tmp_path / "v.json")


PLAN_ARGS = ["--nodes", "2", "--gpus-per-node", "8"]


def test_defaults_name_nodes_image_and_model(planned: tuple[Path, dict[str, Any]]) -> None:
    """Without --hosts, --namespace, --image, --model: what each option's test changes."""
    out, plan = planned
    assert plan["hosts"] == ["node-0", "node-1"] and plan["namespace"] is None
    assert plan["image"] == "vllm/vllm-openai:latest"
    # A replayed campaign names no model: the prior card's name stands in, and says so.
    assert plan["server"]["model"] == "dense-31b-fp8-h100" and plan["server"]["model_source"].startswith("prior card name")
    docs = [d for f in sorted((out / "k8s").glob("*.yaml")) for d in _docs(f)]
    assert all("namespace" not in d["metadata"] for d in docs)
    prom = yaml.safe_load((out / "launch" / "prometheus.yml").read_text())
    assert sorted(t for job in prom["scrape_configs"] for t in job["static_configs"][0]["targets"]) == [
        "node-0:8000", "node-0:8001", "node-1:8000", "node-1:8001"]


def test_hosts_namespace_image_and_model_reach_every_file(campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "p"
    hosts = ["gpu-a.example.org", "gpu-b.example.org"]
    rc = cli_main(["plan", str(campaign), *PLAN_ARGS, "--out", str(out), "--hosts", " gpu-a.example.org, gpu-b.example.org",
                   "--namespace", "llm-prod", "--image", "registry.example.org/vllm-openai:v0.8.5", "--model", "/models/m 31b"])
    assert rc == 0, capsys.readouterr().err
    plan = read_plan(out)
    assert plan["hosts"] == hosts and plan["namespace"] == "llm-prod"
    assert plan["image"] == "registry.example.org/vllm-openai:v0.8.5"
    assert plan["server"]["model"] == "/models/m 31b" and plan["server"]["model_source"] == "--model"
    # --hosts: each replica's metrics URL, and the Prometheus scrape targets, on its node's host.
    for p in plan["placements"]:
        assert p["metrics_url"] == f"http://{hosts[p['node']]}:{p['port']}/metrics"
        assert p["argv"][2] == "/models/m 31b"  # vllm serve {model}
    prom = yaml.safe_load((out / "launch" / "prometheus.yml").read_text())
    got = {job["static_configs"][0]["labels"]["class"]: sorted(job["static_configs"][0]["targets"]) for job in prom["scrape_configs"]}
    want: dict[str, list[str]] = {}
    for p in plan["placements"]:
        want.setdefault(p["workload"], []).append(f"{hosts[p['node']]}:{p['port']}")
    assert got == {w: sorted(t) for w, t in want.items()} and "node-0" not in str(got)
    # --model: every replica's command line, shell-quoted, in the launch scripts.
    for n in range(2):
        text = (out / "launch" / f"node_{n}.sh").read_text()
        assert text.count("vllm serve '/models/m 31b' --tensor-parallel-size") == sum(p["node"] == n for p in plan["placements"])
    # --namespace, --image, --model: in every Kubernetes object.
    docs = [d for f in sorted((out / "k8s").glob("*.yaml")) for d in _docs(f)]
    validate_manifests(docs)
    assert [d["metadata"]["namespace"] for d in docs] == ["llm-prod"] * len(docs) and len(docs) == 7
    for dep in (d for d in docs if d["kind"] == "Deployment"):
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert c["image"] == "registry.example.org/vllm-openai:v0.8.5"
        assert c["command"][:3] == ["vllm", "serve", "/models/m 31b"]


def test_hosts_must_name_each_node(campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli_main(["plan", str(campaign), *PLAN_ARGS, "--out", str(tmp_path / "p"), "--hosts", "only-one"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.endswith("--hosts: 1 host name(s) for 2 node(s)") and len(err.splitlines()) == 1
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize(("fmt", "dirs"), [("launch", ["launch"]), ("k8s", ["k8s"]), (" k8s , launch ", ["k8s", "launch"])])
def test_format_writes_only_the_named_artefacts(campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                fmt: str, dirs: list[str]) -> None:
    out = tmp_path / "p"
    assert cli_main(["plan", str(campaign), *PLAN_ARGS, "--out", str(out), "--format", fmt]) == 0
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    want = {"launch": ["launch/node_0.sh", "launch/node_1.sh", "launch/prometheus.yml"],
            "k8s": ["k8s/chat.yaml", "k8s/code.yaml", "k8s/prometheus-adapter-rules.yaml"]}
    assert files == sorted(["plan.json", *(f for d in dirs for f in want[d])])
    assert f"wrote {len(files)} files" in capsys.readouterr().out


@pytest.mark.parametrize(("fmt", "message"), [(" , ", "--format: name at least one of launch, k8s"),
                                              ("launch,helm", "--format: unknown format 'helm' (choose from launch, k8s)")])
def test_a_bad_format_is_refused_before_anything_is_written(campaign: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            fmt: str, message: str) -> None:
    assert cli_main(["plan", str(campaign), *PLAN_ARGS, "--out", str(tmp_path / "p"), "--format", fmt]) == 2
    assert capsys.readouterr().err.strip().endswith(message)
    assert not (tmp_path / "p").exists()


def _renamed(plan: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """``plan`` with its classes renamed (``names``: old → new), in the order of ``names``."""
    p = copy.deepcopy(plan)
    p["classes"] = sorted(p["classes"], key=lambda c: list(names).index(c["workload"]))
    for entry in (*p["classes"], *p["placements"]):
        entry["workload"] = names[entry["workload"]]
    return p


def _tag(name: str) -> str:
    return hashlib.sha256(name.encode()).hexdigest()[:6]


def test_class_names_that_map_to_one_kubernetes_name_get_distinct_valid_names(planned: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    """chat_a and chat-a are both the DNS label chat-a: chat-a keeps it, chat_a gets a suffix of its own."""
    plan = _renamed(planned[1], {"chat": "chat_a", "code": "chat-a"})
    out = tmp_path / "p"
    write_plan(plan, out)
    stem = f"chat-a-{_tag('chat_a')}"
    assert sorted(f.name for f in (out / "k8s").glob("*.yaml")) == sorted(["chat-a.yaml", f"{stem}.yaml", "prometheus-adapter-rules.yaml"])
    docs = {f.stem: _docs(f) for f in (out / "k8s").glob("*.yaml")}
    validate_manifests([d for group in docs.values() for d in group])
    for file_stem, cls in ((stem, "chat_a"), ("chat-a", "chat-a")):
        dep, svc, hpa = docs[file_stem]
        name = f"h100-31b-fp8-{file_stem}"
        assert dep["metadata"]["name"] == svc["metadata"]["name"] == hpa["metadata"]["name"] == name
        assert hpa["spec"]["scaleTargetRef"]["name"] == name
        assert dep["metadata"]["annotations"]["fleetsieve-bayes/class-name"] == cls
        assert dep["metadata"]["labels"]["fleetsieve-bayes/class"] == file_stem
        c = next(c for c in plan["classes"] if c["workload"] == cls)
        assert dep["spec"]["replicas"] == c["replicas"]
        # Each Service and Deployment selects its own class's pods, and not the other's.
        other = docs["chat-a" if file_stem == stem else stem][0]["spec"]["template"]["metadata"]["labels"]
        own = dep["spec"]["template"]["metadata"]["labels"]
        for selector in (svc["spec"]["selector"], dep["spec"]["selector"]["matchLabels"]):
            assert all(own.get(k) == v for k, v in selector.items())
            assert not all(other.get(k) == v for k, v in selector.items())
    # Stable: the names depend on the classes' names, not on their order.
    swapped = _renamed(planned[1], {"code": "chat-a", "chat": "chat_a"})
    assert class_names(swapped) == class_names(plan)
    write_plan(swapped, tmp_path / "q", ["k8s"])
    assert (tmp_path / "q" / "k8s" / f"{stem}.yaml").read_text() == (out / "k8s" / f"{stem}.yaml").read_text()


def test_kubernetes_names_of_clashing_long_and_reserved_class_names() -> None:
    label = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    long_a, long_b = "a" * 70 + "x", "a" * 70 + "y"  # one label once cut to 63 characters
    names = class_names({"campaign": "c" * 40, "classes": [{"workload": w} for w in (long_a, long_b, "Chat", "chat", "prometheus-adapter-rules")]})
    assert names[long_a]["key"] == "a" * 56 + "-" + _tag(long_a) and names[long_b]["key"] == "a" * 56 + "-" + _tag(long_b)
    assert names["chat"]["key"] == "chat" and names["Chat"]["key"] == f"chat-{_tag('Chat')}"
    assert names["prometheus-adapter-rules"]["key"] == f"prometheus-adapter-rules-{_tag('prometheus-adapter-rules')}"
    for field in ("key", "name"):
        values = [n[field] for n in names.values()]
        assert len(set(values)) == len(values) and all(label.match(v) and len(v) <= 63 for v in values), values
    assert names["chat"]["name"] == "c" * 40 + "-chat"
    # A class named like another's suffixed name: refused, both named, one line.
    taken = f"chat-a-{_tag('chat_a')}"
    with pytest.raises(InputError, match=f"classes 'chat_a' and '{taken}' both map to the Kubernetes name '{taken}'"):
        class_names({"campaign": "c", "classes": [{"workload": "chat_a"}, {"workload": "chat-a"}, {"workload": taken}]})


def test_plan_of_the_shipped_campaign(campaign: Path, tmp_path: Path) -> None:
    """The shipped H100 campaign at "point", as `run` wrote it: `plan` on the command line packs its
    certified fleet onto 2 × 8 GPUs, manifests valid."""
    result = json.loads((campaign / "result.json").read_text())
    assert result["status"] == "certified-feasible"
    assert cli_main(["plan", str(campaign), "--nodes", "2", "--gpus-per-node", "8", "--out", str(tmp_path / "plan")]) == 0
    plan = read_plan(tmp_path / "plan")
    got = {c["workload"]: {"tp": c["tp"], "load": c["load"], "replicas": c["replicas"]} for c in plan["classes"]}
    assert got == {w: a for w, a in result["allocation"].items() if a["replicas"]}
    assert len(plan["placements"]) == sum(a["replicas"] for a in result["allocation"].values())
    assert plan["certificate"]["result_sha256"] == hashlib.sha256((campaign / "result.json").read_bytes()).hexdigest()
    validate_manifests([d for f in sorted((tmp_path / "plan" / "k8s").glob("*.yaml")) for d in _docs(f)])
