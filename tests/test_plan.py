"""``fleetsieve-bayes plan``: plan.json, launch scripts and manifests validated against the Kubernetes schemas."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_report import FINAL, build_campaign_dir

from fleetsieve_bayes.cli import main as cli_main
from fleetsieve_bayes.deploy.k8s import manifests, validate_manifests
from fleetsieve_bayes.deploy.plan import build_plan, load_kind, read_plan, write_plan
from fleetsieve_bayes.errors import InputError


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("campaign")
    build_campaign_dir(d, posterior=False)
    return d


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
    assert per_class == {w: (a["tp"], a["load"], a["replicas"]) for w, a in FINAL.items()}
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


def test_uncertified_is_refused_then_marked_everywhere(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "c"
    build_campaign_dir(d, finished=False, posterior=False, n_rounds=2)
    out = tmp_path / "p"
    rc = cli_main(["plan", str(d), "--nodes", "2", "--gpus-per-node", "8", "--out", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "--allow-uncertified" in err and not out.exists()
    rc = cli_main(["plan", str(d), "--nodes", "2", "--gpus-per-node", "8", "--out", str(out), "--allow-uncertified"])
    assert rc == 0, capsys.readouterr().err
    plan = read_plan(out)
    assert plan["certified"] is False and plan["status"] == "undecided"
    for script in (out / "launch").glob("*.sh"):
        assert "UNCERTIFIED" in script.read_text()
    for f in (out / "k8s").glob("*.yaml"):
        assert f.read_text().startswith("# UNCERTIFIED")
        for doc in _docs(f):
            if doc["kind"] != "ConfigMap":
                assert doc["metadata"]["annotations"]["fleetsieve-bayes/certified"] == "false"


def _with_vllm_inputs(d: Path) -> None:
    lines = (d / "journal.jsonl").read_text().splitlines()
    header = json.loads(lines[0])
    header["inputs"] = {"model": {"family": "generic"}, "measurement": {
        "backend": "vllm", "model": "/models/m", "served_model_name": "m",
        "command": ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}",
                    "--tensor-parallel-size", "{tp}", "--port", "{port}"],
        "extra_args": ["--max-num-seqs", "256"], "env": {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}}}
    (d / "journal.jsonl").write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")


def test_vllm_template_rate_cells_and_formats(tmp_path: Path) -> None:
    d = tmp_path / "c"
    build_campaign_dir(d, posterior=False)
    _with_vllm_inputs(d)
    plan = build_plan(d, 2, 8)
    p0 = plan["placements"][0]
    assert p0["argv"][:3] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert p0["argv"][-2:] == ["--max-num-seqs", "256"] and "/models/m" in p0["argv"]
    assert p0["env"]["VLLM_WORKER_MULTIPROC_METHOD"] == "spawn"
    chat = next(c for c in plan["classes"] if c["workload"] == "chat")
    assert chat["load_kind"] == "rate"  # the vLLM backend's labels are arrival multipliers
    assert chat["autoscaler_target"]["per_replica"] == chat["offered_rps_per_replica"] == 6.6
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


@pytest.mark.slow
def test_plan_of_the_shipped_campaign(tmp_path: Path, repo: Path) -> None:
    """The shipped H100 campaign at "point" (NUTS, ~2 min): its certified fleet packed onto 2 × 8 GPUs,
    manifests valid."""
    from shipped import point_file

    out = tmp_path / "run"
    assert cli_main(["run", str(point_file(tmp_path)), "--out", str(out), "--quiet"]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "certified-feasible"
    assert cli_main(["plan", str(out), "--nodes", "2", "--gpus-per-node", "8", "--out", str(tmp_path / "plan")]) == 0
    plan = read_plan(tmp_path / "plan")
    got = {c["workload"]: {"tp": c["tp"], "load": c["load"], "replicas": c["replicas"]} for c in plan["classes"]}
    assert got == {w: a for w, a in result["allocation"].items() if a["replicas"]}
    assert len(plan["placements"]) == sum(a["replicas"] for a in result["allocation"].values())
    validate_manifests([d for f in sorted((tmp_path / "plan" / "k8s").glob("*.yaml")) for d in _docs(f)])
