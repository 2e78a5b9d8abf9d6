"""``fleetsieve-bayes plan`` of a catalogued campaign: engine arguments as vLLM flags, disaggregated
configurations as prefill and decode workers behind a router, packed worker by worker.

The campaign directories are written by hand (a journal header recording the catalogue, and a
result.json whose allocation names configurations), from the config worlds' catalogue
(:func:`fleetsieve_bayes.evaluation.config_worlds.enumerate_catalogue`) and one aggregated
configuration of our own; the plain (uncatalogued) plans are pinned by tests/test_plan.py.
"""

from __future__ import annotations

import itertools
import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetsieve_bayes.campaign.journal import Cell, Header, MeasurementRecord, open_journal
from fleetsieve_bayes.cli import main as cli_main
from fleetsieve_bayes.configs import ServingConfig
from fleetsieve_bayes.deploy.k8s import class_names, role_name, validate_manifests
from fleetsieve_bayes.deploy.packing import first_unfit_groups, pack_groups
from fleetsieve_bayes.deploy.plan import build_plan, read_plan, write_plan
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.evaluation.config_worlds import enumerate_catalogue

SMALL = ServingConfig(name="agg-tp2-s2", tp=2, engine=(("enable_chunked_prefill", True),
                                                       ("enable_prefix_caching", False), ("max_num_seqs", 2)))
CATALOGUE: tuple[ServingConfig, ...] = (*enumerate_catalogue(8, (64, 256)), SMALL)
DISAGG = "2p-tp2+1d-tp4-s256"  # 2 prefill workers of TP2 and 1 decode worker of TP4: 8 GPUs a replica
SLO = {"success_min": 0.99, "ttft_p99_s": 2.0, "completion_p99_s": 10.0}


def _config(name: str) -> ServingConfig:
    return next(c for c in CATALOGUE if c.name == name)


def _entry(name: str, load: str, replicas: int) -> dict[str, Any]:
    c = _config(name)
    return {"tp": c.tp, "load": load, "replicas": replicas, "config": c.name, "gpus_per_replica": c.gpus}


def catalogued_campaign(d: Path, alloc: dict[str, dict[str, Any]], *, backend: str = "replay",
                        bounds: bool = True, offered: dict[str, float] | None = None) -> Path:
    """A finished, certified campaign directory whose allocation is ``alloc``: the journal's header
    (its cells, SLOs and the catalogue), result.json and, with ``bounds``, a bounds.csv of its cells
    as a catalogued run writes it (``tp`` empty for a disaggregated configuration); ``offered``:
    classes whose cell has a measured window at that offered rate."""
    d.mkdir(parents=True)
    cells = tuple(Cell(w, a["config"], a["load"]) for w, a in alloc.items())
    header = Header(
        campaign="cfg-plan", strategy="thompson", seed=0, cells=cells, gpus=32, epsilon=0.05, credible_level=0.9,
        workloads=tuple({"name": w, "demand_rps": 1.0, "slo": SLO} for w in alloc),
        fingerprint={"campaign": "f" * 64},
        inputs={"name": "cfg-plan", "measurement": {"backend": backend}, "model": {"family": "generic"},
                "configs": [c.to_json() for c in CATALOGUE]},
    )
    j = open_journal(d)
    j.append(header)
    for seq, (w, rps) in enumerate((offered or {}).items()):
        a = alloc[w]
        row = {"workload": w, "tp": a["gpus_per_replica"], "load": a["load"], "offered_rps": rps, "throughput_rps": rps,
               "ttft_p99_s": 0.7, "completion_p99_s": 4.0, "success_rate": 0.999, "duration_s": 300.0,
               "config": a["config"]}
        j.append(MeasurementRecord(seq=seq, round=0, phase="design", cell=Cell(w, a["config"], a["load"]), row=row,
                                   gpu_seconds=300.0 * a["gpus_per_replica"]))
    j.close()
    result = {"status": "certified-feasible", "allocation": alloc,
              "certificate": {"reason": "by hand", "p_slo_met": 0.97, "p_epsilon_optimal": 0.95}}
    (d / "result.json").write_text(json.dumps(result))
    if bounds:
        lines = ["workload,tp,config,gpus_per_replica,load,measured,throughput_lo,throughput_hi,ttft_p99_lo,"
                 "ttft_p99_hi,completion_p99_lo,completion_p99_hi,success_lo,success_hi"]
        for w, a in alloc.items():
            tp = "" if a["tp"] is None else str(a["tp"])
            lines.append(f"{w},{tp},{a['config']},{a['gpus_per_replica']},{a['load']},True,2.0,2.5,0.5,0.9,3.0,6.0,0.995,1.0")
        (d / "bounds.csv").write_text("\n".join(lines) + "\n")
    return d


def _docs(path: Path) -> list[dict[str, Any]]:
    return [x for x in yaml.safe_load_all(path.read_text()) if x]


def _strict_cli(files: list[Path]) -> None:
    """The files through ``kubernetes-validate --strict`` itself, as the Kubernetes 1.31 schemas."""
    r = subprocess.run(["kubernetes-validate", "--strict", "--quiet", "-k", "1.31", *map(str, files)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture(scope="module")
def disagg_plan(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """summ: 2 replicas of 2p-tp2+1d-tp4-s256; chat: 1 replica of agg-tp2-s2; on 3 nodes × 8 GPUs."""
    root = tmp_path_factory.mktemp("disagg")
    d = catalogued_campaign(root / "c", {"summ": _entry(DISAGG, "C3", 2), "chat": _entry("agg-tp2-s2", "C1", 1)},
                            offered={"summ": 2.4})
    out = root / "plan"
    plan = build_plan(d, 3, 8)
    write_plan(plan, out)
    return out, plan


def _by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(x["kind"], x["metadata"]["labels"].get("fleetsieve-bayes/role", "")): x for x in docs}


def test_disaggregated_class_is_a_deployment_per_role_valid_strictly(disagg_plan: tuple[Path, dict[str, Any]]) -> None:
    out, plan = disagg_plan
    files = sorted((out / "k8s").glob("*.yaml"))
    assert [f.name for f in files] == ["chat.yaml", "prometheus-adapter-rules.yaml", "summ.yaml"]
    validate_manifests([x for f in files for x in _docs(f)])
    _strict_cli(files)
    summ = _docs(out / "k8s" / "summ.yaml")
    assert [(x["kind"], x["metadata"]["name"]) for x in summ] == [
        ("Deployment", "cfg-plan-summ-prefill"), ("Service", "cfg-plan-summ-prefill"),
        ("HorizontalPodAutoscaler", "cfg-plan-summ-prefill"),
        ("Deployment", "cfg-plan-summ-decode"), ("Service", "cfg-plan-summ-decode"),
        ("HorizontalPodAutoscaler", "cfg-plan-summ-decode"),
        ("Deployment", "cfg-plan-summ-router"), ("Service", "cfg-plan-summ-router"),
    ]
    objs = _by_kind(summ)
    for role, tp, pods in (("prefill", 2, 2 * 2), ("decode", 4, 1 * 2)):  # workers × replicas
        dep = objs["Deployment", role]
        (c,) = dep["spec"]["template"]["spec"]["containers"]
        assert dep["spec"]["replicas"] == pods
        assert c["resources"]["limits"]["nvidia.com/gpu"] == c["resources"]["requests"]["nvidia.com/gpu"] == str(tp)
        cmd = c["command"]
        assert cmd[cmd.index("--tensor-parallel-size") + 1] == str(tp)
        assert cmd[cmd.index("--max-num-seqs") + 1] == "256"
        kv = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
        assert kv == {"kv_connector": "NixlConnector", "kv_role": "kv_producer" if role == "prefill" else "kv_consumer"}
        assert {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in c["env"]
        # Each role's Service selects its own role's pods only.
        sel = objs["Service", role]["spec"]["selector"]
        assert sel == dep["spec"]["selector"]["matchLabels"] and sel["fleetsieve-bayes/role"] == role
        # One autoscaler per role Deployment.
        hpa = objs["HorizontalPodAutoscaler", role]
        assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]
        assert hpa["spec"]["maxReplicas"] == pods + (24 - 18) // tp  # 6 spare GPUs at the role's TP
        assert dep["metadata"]["annotations"]["fleetsieve-bayes/config"] == DISAGG
        assert dep["metadata"]["annotations"]["fleetsieve-bayes/cell"] == f"{DISAGG}@C3"
    # The replay grid's C3 is a concurrency: the decode pods share it (1 decode worker a replica);
    # each request passes one prefill worker once, so the prefill pods share the cell's offered rate.
    decode_target = objs["HorizontalPodAutoscaler", "decode"]["spec"]["metrics"][0]["pods"]
    assert decode_target["metric"]["name"] == "vllm_num_requests_running" and decode_target["target"]["averageValue"] == "3"
    prefill_target = objs["HorizontalPodAutoscaler", "prefill"]["spec"]["metrics"][0]["pods"]
    assert prefill_target["metric"]["name"] == "vllm_request_success_per_second"
    assert prefill_target["target"]["averageValue"] == "1200m"  # 2.4 req/s over 2 prefill workers
    router = objs["Deployment", "router"]
    (rc,) = router["spec"]["template"]["spec"]["containers"]
    assert router["spec"]["replicas"] == 2 and "resources" not in rc
    assert rc["command"] == ["python", "-m", "fleetsieve_bayes.backends.router", "--host", "0.0.0.0", "--port", "8000",
                             "--prefill", "http://cfg-plan-summ-prefill:8000", "--decode", "http://cfg-plan-summ-decode:8000"]
    assert objs["Service", "router"]["spec"]["selector"]["fleetsieve-bayes/role"] == "router"


def test_plan_json_names_configs_and_roles(disagg_plan: tuple[Path, dict[str, Any]]) -> None:
    out, _ = disagg_plan
    plan = read_plan(out)
    summ, chat = (next(c for c in plan["classes"] if c["workload"] == w) for w in ("summ", "chat"))
    assert (summ["config"], summ["tp"], summ["gpus_per_replica"], summ["gpus"]) == (DISAGG, None, 8, 16)
    assert summ["engine"] == {"max_num_seqs": 256} and summ["router"] == {"replicas": 2}
    assert {r: (v["tp"], v["workers"], v["pods"], v["gpus"], v["kv_role"]) for r, v in summ["roles"].items()} == {
        "prefill": (2, 2, 4, 8, "kv_producer"), "decode": (4, 1, 2, 8, "kv_consumer")}
    assert summ["roles"]["decode"]["autoscaler_target"]["per_replica"] == 3.0
    assert summ["roles"]["prefill"]["autoscaler_target"] == {
        "metric": "rate(vllm:request_success_total)", "per_replica": 1.2, "unit": "requests/s"}
    assert summ["offered_rps_per_replica"] == 2.4 and summ["measured_row"]["config"] == DISAGG
    assert (chat["config"], chat["tp"], chat["roles"], chat["router"]) == ("agg-tp2-s2", 2, None, None)
    # bounds.csv of a catalogued run (empty tp for the disaggregated configuration) reaches the plan.
    assert summ["measured"] is True and summ["bounds"]["ttft_p99_s"] == [0.5, 0.9]
    assert summ["predicted_source"] == "bounds.csv"
    assert plan["gpus_used"] == 18 and plan["disaggregation"] == {
        "kv_connector": "NixlConnector", "kv_roles": {"prefill": "kv_producer", "decode": "kv_consumer"},
        "router_command": ["python", "-m", "fleetsieve_bayes.backends.router"], "router_image": plan["image"],
        "split_replicas": False, "spread_replicas": []}


def test_each_worker_on_one_node_and_each_replica_whole(disagg_plan: tuple[Path, dict[str, Any]]) -> None:
    out, plan = disagg_plan
    workers = plan["placements"]
    assert sorted((p["workload"], p["role"]) for p in workers) == sorted(
        [("summ", "prefill")] * 4 + [("summ", "decode")] * 2 + [("chat", "engine")])
    taken: set[tuple[int, int]] = set()
    nodes: dict[tuple[str, int], set[int]] = {}
    for p in workers:
        assert len(p["gpus"]) == p["tp"] and p["gpus"] == list(range(p["gpus"][0], p["gpus"][0] + p["tp"]))
        assert all(0 <= g < 8 for g in p["gpus"]) and p["env"]["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, p["gpus"]))
        assert taken.isdisjoint({(p["node"], g) for g in p["gpus"]})
        taken |= {(p["node"], g) for g in p["gpus"]}
        nodes.setdefault((p["workload"], p["index"]), set()).add(p["node"])
    assert all(len(n) == 1 for n in nodes.values())  # a replica's prefill and decode workers on one node
    ports = [(p["node"], p["port"]) for p in workers] + [(r["node"], r["port"]) for r in plan["routers"]]
    assert len(set(ports)) == len(ports)
    # Each router names its own replica's workers.
    for r in plan["routers"]:
        mine = [p for p in workers if (p["workload"], p["index"]) == (r["workload"], r["index"])]
        urls = {role: [f"http://node-{p['node']}:{p['port']}" for p in mine if p["role"] == role] for role in ("prefill", "decode")}
        argv = r["argv"]
        assert argv[argv.index("--prefill") + 1: argv.index("--decode")] == urls["prefill"]
        assert argv[argv.index("--decode") + 1:] == urls["decode"] and r["nodes"] == [mine[0]["node"]]


def test_launch_scripts_start_each_role_and_the_routers(disagg_plan: tuple[Path, dict[str, Any]]) -> None:
    out, plan = disagg_plan
    text = ""
    for n in range(3):
        script = out / "launch" / f"node_{n}.sh"
        assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
        text += script.read_text()
    producer = "--kv-transfer-config '{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_producer\"}'"
    consumer = producer.replace("kv_producer", "kv_consumer")
    assert text.count(producer) == 4 and text.count(consumer) == 2
    assert text.count("--max-num-seqs 256 --kv-transfer-config") == 6
    assert text.count("python -m fleetsieve_bayes.backends.router --host 0.0.0.0 --port") == 2
    assert "logs/summ_1_prefill1.log" in text and "logs/summ_0_decode0.log" in text and "logs/summ_1_router.log" in text
    for p in plan["placements"]:
        if p["role"] != "engine":  # NIXL's handshake: the node's host and a port block of its own
            assert p["env"]["VLLM_NIXL_SIDE_CHANNEL_HOST"] == f"node-{p['node']}"
            assert p["env"]["VLLM_NIXL_SIDE_CHANNEL_PORT"] == str(5600 + p["gpus"][0])
            assert shlex.join(p["argv"]) in text
    prom = yaml.safe_load((out / "launch" / "prometheus.yml").read_text())
    job = next(j for j in prom["scrape_configs"] if j["job_name"] == "vllm-summ")
    assert [(s["labels"]["role"], len(s["targets"])) for s in job["static_configs"]] == [("prefill", 4), ("decode", 2)]


def test_aggregated_engine_arguments_are_vllm_flags(disagg_plan: tuple[Path, dict[str, Any]]) -> None:
    out, plan = disagg_plan
    (p,) = [p for p in plan["placements"] if p["workload"] == "chat"]
    flags = ["--enable-chunked-prefill", "--no-enable-prefix-caching", "--max-num-seqs", "2"]
    assert p["argv"][-4:] == flags and "--kv-transfer-config" not in p["argv"]
    assert "VLLM_NIXL_SIDE_CHANNEL_PORT" not in p["env"]
    script = (out / "launch" / f"node_{p['node']}.sh").read_text()
    assert f"--tensor-parallel-size 2 --port {p['port']} --seed 0 --enable-chunked-prefill --no-enable-prefix-caching --max-num-seqs 2 >" in script
    (dep, _svc, hpa) = _docs(out / "k8s" / "chat.yaml")
    cmd = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd[cmd.index("--max-num-seqs") + 1] == "2" and cmd[-4:] == flags
    assert cmd[cmd.index("--tensor-parallel-size") + 1] == "2"
    assert dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert dep["metadata"]["annotations"]["fleetsieve-bayes/cell"] == "agg-tp2-s2@C1"
    assert hpa["spec"]["scaleTargetRef"]["name"] == dep["metadata"]["name"]


def test_a_template_without_tp_and_extra_args_the_engine_flags_win(tmp_path: Path) -> None:
    """vLLM backend template: the engine flags come after extra_args (argparse keeps the last)."""
    d = catalogued_campaign(tmp_path / "c", {"chat": _entry("agg-tp2-s2", "x1", 1)}, backend="vllm")
    plan = build_plan(d, 1, 8)
    plan["server"]["extra_args"] = ["--max-num-seqs", "256"]
    plan["server"]["command"] = ["vllm", "serve", "{model}", "--port", "{port}"]
    from fleetsieve_bayes.deploy.k8s import manifests

    (dep, *_), = [g for stem, g in manifests(plan) if stem == "chat"]
    cmd = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    assert cmd == ["vllm", "serve", "generic", "--port", "8000", "--max-num-seqs", "256", "--tensor-parallel-size", "2",
                   "--enable-chunked-prefill", "--no-enable-prefix-caching", "--max-num-seqs", "2"]
    assert plan["classes"][0]["load_kind"] == "rate"


def test_replicas_that_do_not_fit_one_node_fail_or_split(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 3 replicas of 2p-tp2+2d-tp1 (6 GPUs) on 2 nodes of 10: two stay whole, the third only fits split.
    d = catalogued_campaign(tmp_path / "c", {"rag": _entry("2p-tp2+2d-tp1-s256", "C2", 3)})
    rc = cli_main(["plan", str(d), "--nodes", "2", "--gpus-per-node", "10", "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1 and not (tmp_path / "p").exists()
    assert "class rag: its 3 2p-tp2+2d-tp1-s256 replica(s) (2 prefill TP2 + 2 decode TP1, 6 GPUs each)" in err
    assert "--split-replicas" in err
    rc = cli_main(["plan", str(d), "--nodes", "2", "--gpus-per-node", "10", "--out", str(tmp_path / "p"), "--split-replicas"])
    assert rc == 0, capsys.readouterr().err
    assert "replicas on several nodes (--split-replicas): rag#2" in capsys.readouterr().out
    plan = read_plan(tmp_path / "p")
    assert plan["disaggregation"]["spread_replicas"] == [{"workload": "rag", "index": 2}]
    nodes = {i: {p["node"] for p in plan["placements"] if p["index"] == i} for i in range(3)}
    assert [len(nodes[i]) for i in range(3)] == [1, 1, 2]
    (router,) = [r for r in plan["routers"] if r["index"] == 2]
    assert router["nodes"] == [0, 1]
    assert any(f"http://node-{p['node']}:{p['port']}" in router["argv"] for p in plan["placements"]
               if p["index"] == 2 and p["node"] != router["node"])  # a worker on the other node
    _strict_cli(sorted((tmp_path / "p" / "k8s").glob("*.yaml")))
    # A replica larger than a node (8 GPUs on nodes of 6): refused whole, split when allowed.
    d2 = catalogued_campaign(tmp_path / "c2", {"summ": _entry(DISAGG, "C3", 1)})
    with pytest.raises(InputError, match=r"class summ: a replica of 2p-tp2\+1d-tp4-s256 \(2 prefill TP2 \+ 1 decode "
                       r"TP4, 8 GPUs\) does not fit a node of 6 GPUs; pass --split-replicas"):
        build_plan(d2, 2, 6)
    plan = build_plan(d2, 2, 6, split_replicas=True)
    assert sorted(p["tp"] for p in plan["placements"]) == [2, 2, 4] and plan["disaggregation"]["spread_replicas"]
    # A worker larger than a node cannot be placed at all.
    with pytest.raises(InputError, match="class summ: a TP4 decode worker of 2p-tp2\\+1d-tp4-s256 does not fit a node of 2 GPUs"):
        build_plan(d2, 8, 2, split_replicas=True)
    # Too few GPUs even split: the class is named.
    with pytest.raises(InputError, match=r"^class summ: its 1 2p-tp2\+1d-tp4-s256 replica\(s\) .* \(the fleet needs 8 GPUs\)$"):
        build_plan(d2, 1, 6, split_replicas=True)


def test_connector_router_and_kv_both_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = catalogued_campaign(tmp_path / "c", {"summ": _entry(DISAGG, "C3", 1)}, bounds=False)
    out = tmp_path / "p"
    rc = cli_main(["plan", str(d), "--nodes", "1", "--gpus-per-node", "8", "--out", str(out), "--kv-connector",
                   "P2pNcclConnector", "--router-command", "/opt/router --verbose", "--router-image", "r:1", "--kv-both"])
    assert rc == 0, capsys.readouterr().err
    assert "summ#0/prefill0(GPUs" in capsys.readouterr().out
    plan = read_plan(out)
    for p in plan["placements"]:
        assert json.loads(p["argv"][-1]) == {"kv_connector": "P2pNcclConnector", "kv_role": "kv_both"}
        assert not any(k.startswith("VLLM_NIXL") for k in p["env"])  # NIXL's settings only with NIXL
    assert plan["routers"][0]["argv"][:4] == ["/opt/router", "--verbose", "--host", "0.0.0.0"]
    docs = _by_kind(_docs(out / "k8s" / "summ.yaml"))
    router = docs["Deployment", "router"]["spec"]["template"]["spec"]["containers"][0]
    assert router["image"] == "r:1" and router["command"][:2] == ["/opt/router", "--verbose"]
    assert "env" not in docs["Deployment", "prefill"]["spec"]["template"]["spec"]["containers"][0]
    # No measured row and no bounds.csv: predictions are empty, the prefill role has no target, so no autoscaler.
    assert ("HorizontalPodAutoscaler", "prefill") not in docs and ("HorizontalPodAutoscaler", "decode") in docs
    with pytest.raises(InputError, match="--kv-connector"):
        build_plan(d, 1, 8, kv_connector=" ")


def test_an_allocation_naming_an_unknown_config_is_refused(tmp_path: Path) -> None:
    alloc = {"summ": {**_entry(DISAGG, "C3", 1), "config": "no-such-config"}}
    d = catalogued_campaign(tmp_path / "c", alloc, bounds=False)
    with pytest.raises(InputError, match="class summ: config 'no-such-config' is not in the campaign's"):
        build_plan(d, 1, 8)


def test_role_names_fit_kubernetes_labels() -> None:
    long = {"campaign": "c" * 50, "classes": [{"workload": "a" * 20}, {"workload": "a" * 19 + "b"}]}
    names = class_names(long)
    got = [role_name(n, r) for n in names.values() for r in ("prefill", "decode", "router")]
    assert all(len(x) <= 63 and x.endswith(("-prefill", "-decode", "-router")) for x in got)
    assert len(set(got)) == len(got)
    assert role_name({"name": "c-chat", "key": "chat"}, "decode") == "c-chat-decode"


def test_the_report_labels_each_worker_by_config_and_role(disagg_plan: tuple[Path, dict[str, Any]]) -> None:
    from fleetsieve_bayes.reporting.deployment import deployment_html, plot_packing

    _, plan = disagg_plan
    p = plot_packing(plan)
    df = p.data["placements"]
    assert list(df.columns) == ["workload", "index", "tp", "node", "first_gpu", "port", "config", "role"]
    assert sorted(df[df["workload"] == "summ"]["role"]) == ["decode 0", "decode 0", "prefill 0", "prefill 0",
                                                           "prefill 1", "prefill 1"]
    texts = [t.get_text() for t in p.figure.axes[0].texts]
    assert any(t.startswith("summ#0 prefill 1\n" + DISAGG) for t in texts)
    assert any(t.startswith("chat#0\nagg-tp2-s2\nTP2") for t in texts)
    html = "".join(deployment_html(plan, None, {}, lambda i, q, c: ""))
    assert f"summ#1 {DISAGG} decode 0 TP4" in html and "<th>workers</th>" in html


# ------------------------------------------------------------------ packing of workers by replica


def _fits(sizes: list[int], nodes: int, g: int) -> bool:
    for assign in itertools.product(range(nodes), repeat=len(sizes)):
        used = [0] * nodes
        for s, n in zip(sizes, assign, strict=True):
            used[n] += s
        if max(used, default=0) <= g:
            return True
    return False


_worker = st.tuples(st.sampled_from(["prefill", "decode"]), st.sampled_from([1, 2, 4]))


@settings(max_examples=80, deadline=None)
@given(replicas=st.lists(st.lists(_worker, min_size=1, max_size=3), min_size=0, max_size=3),
       nodes=st.integers(1, 3), g=st.sampled_from([4, 6, 8]), split=st.booleans())
def test_pack_groups_agrees_with_brute_force(replicas: list[list[tuple[str, int]]], nodes: int, g: int, split: bool) -> None:
    groups = [(f"w{i % 2}", tuple(ws)) for i, ws in enumerate(replicas)]
    got = pack_groups(groups, nodes, g, split=split)
    whole = [sum(t for _, t in ws) for ws in replicas]
    workers = [t for ws in replicas for _, t in ws]
    want = _fits(workers, nodes, g) if split else _fits(whole, nodes, g)
    assert (got is not None) == want
    if got is None:
        return
    assert [(p.workload, p.role, p.tp) for p in got.placements] == [(w, r, t) for w, ws in groups for r, t in ws]
    taken: set[tuple[int, int]] = set()
    for p in got.placements:
        assert len(p.gpus) == p.tp and all(0 <= x < g for x in p.gpus)
        assert list(p.gpus) == list(range(p.gpus[0], p.gpus[0] + p.tp))
        assert taken.isdisjoint({(p.node, x) for x in p.gpus})
        taken |= {(p.node, x) for x in p.gpus}
    spread = {(p.workload, p.index) for p in got.placements} - {
        (w, i) for (w, i) in {(p.workload, p.index) for p in got.placements}
        if len({q.node for q in got.placements if (q.workload, q.index) == (w, i)}) == 1}
    assert spread == set(got.split)
    if _fits(whole, nodes, g) and all(s <= g for s in whole):
        assert got.split == ()  # whole where a whole packing exists


def test_first_unfit_groups_names_the_class() -> None:
    a, b = (("prefill", 2), ("decode", 4)), (("engine", 8),)
    assert first_unfit_groups([("summ", a, 2), ("chat", b, 1)], 3, 8) is None
    assert first_unfit_groups([("summ", a, 2), ("chat", b, 2)], 3, 8) == "chat"
    assert first_unfit_groups([("summ", a, 1)], 2, 4) == "summ"
    assert first_unfit_groups([("summ", a, 1)], 2, 4, split=True) is None


def test_kv_connector_none_plans_workers_without_kv_transfer(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--kv-connector none`` (the decode workers recompute the prompt): no worker's launch
    command nor container carries a KV-transfer config or NIXL's settings; the router is kept."""
    d = catalogued_campaign(tmp_path / "c", {"summ": _entry(DISAGG, "C3", 1)}, bounds=False)
    out = tmp_path / "p"
    rc = cli_main(["plan", str(d), "--nodes", "1", "--gpus-per-node", "8", "--out", str(out), "--kv-connector", "none"])
    assert rc == 0, capsys.readouterr().err
    plan = read_plan(out)
    assert {p["role"] for p in plan["placements"]} == {"prefill", "decode"}
    for p in plan["placements"]:
        assert "--kv-transfer-config" not in p["argv"]
        assert not any(k.startswith("VLLM_NIXL") for k in p["env"])
    assert len(plan["routers"]) == 1
    docs = _by_kind(_docs(out / "k8s" / "summ.yaml"))
    for role in ("prefill", "decode"):
        container = docs["Deployment", role]["spec"]["template"]["spec"]["containers"][0]
        assert "--kv-transfer-config" not in container["command"] + container.get("args", [])
