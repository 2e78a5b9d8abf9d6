"""Serving configurations in ``verify``, ``run --production`` and ``ingest``.

``verify`` of a catalogued plan whose class ``summ`` is disaggregated (2 prefill workers of TP1 and
1 decode worker of TP2 behind a router) reads each role's workers from fake vLLM ``/metrics`` pages
(:class:`fleetsieve_bayes.testing.fake_metrics.FakeMetrics` behind loopback HTTP servers, the
window event-ordered as in tests/test_verify.py) or from a fake Prometheus HTTP API, and names the
role that drifts. The campaign directory is written by hand as in tests/test_plan_configs.py.
``ingest --config`` labels rows by configuration; an llm-d v0.2 report whose stack is prefill and
decode engines names its layout. The fixtures hold no disaggregated llm-d report (their v0.2
stacks are decode engines only), so one is made from the edited one-replica fixture.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from fleetsieve_bayes.campaign.journal import Cell, Header, open_journal
from fleetsieve_bayes.cli import main as cli_main
from fleetsieve_bayes.configs import Role, ServingConfig, resolve_configs
from fleetsieve_bayes.deploy import verify as verify_module
from fleetsieve_bayes.deploy.plan import build_plan, write_plan
from fleetsieve_bayes.deploy.production import (
    describe_change,
    production_inputs,
    production_rows,
    production_summary,
)
from fleetsieve_bayes.deploy.verify import ROUTER_NOTE, assign_roles
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.evaluation.config_worlds import enumerate_catalogue
from fleetsieve_bayes.table import read_table
from fleetsieve_bayes.testing.fake_metrics import FakeMetrics

FIX = Path(__file__).parent / "fixtures" / "ingest"
CATALOGUE: tuple[ServingConfig, ...] = enumerate_catalogue(8, (64,))
DISAGG = "2p-tp1+1d-tp2-s64"  # 2 prefill workers of TP1, 1 decode worker of TP2: 4 GPUs a replica
AGG = "agg-tp2-s64"
SLO = {"success_min": 0.99, "ttft_p99_s": 2.0, "completion_p99_s": 10.0}
# bounds.csv of both cells, the plan's predicted intervals: TTFT [0.5, 0.9] s, completion [3, 6] s.
BOUNDS = "2.0,2.5,0.5,0.9,3.0,6.0,0.995,1.0"
N = 40  # requests in the window


def _entry(name: str) -> dict[str, Any]:
    c = next(c for c in CATALOGUE if c.name == name)
    return {"tp": c.tp, "load": "C4", "replicas": 1, "config": c.name, "gpus_per_replica": c.gpus}


def _campaign(d: Path) -> Path:
    """A certified catalogued campaign: summ on DISAGG, chat on AGG, one replica each."""
    d.mkdir(parents=True)
    alloc = {"summ": _entry(DISAGG), "chat": _entry(AGG)}
    j = open_journal(d)
    j.append(Header(
        campaign="cfg-verify", strategy="thompson", seed=0,
        cells=tuple(Cell(w, a["config"], a["load"]) for w, a in alloc.items()), gpus=8, epsilon=0.05,
        credible_level=0.9, workloads=tuple({"name": w, "demand_rps": 1.0, "slo": SLO} for w in alloc),
        fingerprint={"campaign": "f" * 64},
        inputs={"name": "cfg-verify", "measurement": {"backend": "replay"}, "model": {"family": "generic"},
                "configs": [c.to_json() for c in CATALOGUE]}))
    j.close()
    (d / "result.json").write_text(json.dumps({"status": "certified-feasible", "allocation": alloc, "certificate": {
        "reason": "by hand", "p_slo_met": 0.97, "p_epsilon_optimal": 0.95}}))
    lines = ["workload,tp,config,gpus_per_replica,load,measured,throughput_lo,throughput_hi,ttft_p99_lo,"
             "ttft_p99_hi,completion_p99_lo,completion_p99_hi,success_lo,success_hi"]
    lines += [f"{w},{'' if a['tp'] is None else a['tp']},{a['config']},{a['gpus_per_replica']},C4,True,{BOUNDS}"
              for w, a in alloc.items()]
    (d / "bounds.csv").write_text("\n".join(lines) + "\n")
    return d


class _Pages:
    """One loopback HTTP server per worker, each serving its own FakeMetrics as ``/metrics``."""

    def __init__(self) -> None:
        self.metrics: dict[int, FakeMetrics] = {}
        self.servers: list[http.server.ThreadingHTTPServer] = []

    def start(self) -> int:
        m = FakeMetrics("m", itl=True)
        pages = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = pages.metrics[self.server.server_address[1]].render(running=0).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        port = server.server_address[1]
        self.metrics[port] = m
        self.servers.append(server)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return port

    def close(self) -> None:
        for s in self.servers:
            s.shutdown()
            s.server_close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, Any], _Pages]]:
    """The plan directory (its workers' ports those of the fake pages) and the pages."""
    root = tmp_path_factory.mktemp("cfg")
    plan = build_plan(_campaign(root / "c"), 1, 8, hosts=["127.0.0.1"])
    pages = _Pages()
    try:
        for p in plan["placements"]:  # the plan's workers listen where the fake pages do
            p["port"] = pages.start()
            p["metrics_url"] = f"http://127.0.0.1:{p['port']}/metrics"
        for r in plan["routers"]:
            r["port"] = 1  # nothing listens there: a router exposes no /metrics
            r["url"] = "http://127.0.0.1:1"
        write_plan(plan, root / "plan", ["launch"])
        yield root / "plan", plan, pages
    finally:
        pages.close()


def _workers(plan: dict[str, Any], w: str, role: str) -> list[dict[str, Any]]:
    return [p for p in plan["placements"] if p["workload"] == w and p["role"] == role]


def _traffic(plan: dict[str, Any], pages: _Pages, *, prefill_ttft: float, decode_e2e: float) -> Callable[[], None]:
    """What the fleet serves in the window: N requests of summ (each prefilled on one prefill worker
    with max_tokens = 1, then decoded on the decode worker: 20 tokens 30 ms apart) and N of chat."""
    def drive() -> None:
        prefill = _workers(plan, "summ", "prefill")
        (decode,) = _workers(plan, "summ", "decode")
        (chat,) = _workers(plan, "chat", "engine")
        for i in range(N):
            pages.metrics[prefill[i % 2]["port"]].finish(prefill_ttft, prefill_ttft + 0.01, "length")
            pages.metrics[decode["port"]].finish(0.05, decode_e2e, "length", itl_s=[0.03] * 19)
            pages.metrics[chat["port"]].finish(0.6, 4.0, "stop")

    return drive


def _event_ordered(monkeypatch: pytest.MonkeyPatch, drive: Callable[[], None], window_s: float) -> list[str]:
    """``verify --metrics`` event-ordered: every first scrape, ``drive()``, every second scrape,
    on a clock that reads 0 before ``drive`` and ``window_s`` after (tests/test_verify.py's way)."""
    now = {"t": 0.0}
    scraped: list[str] = []
    read_direct, scrape = verify_module.read_direct, verify_module.scrape

    def ordered(urls: Any, w: float, **kw: Any) -> Any:
        def during() -> None:
            drive()
            now["t"] = window_s

        return read_direct(urls, w, during=during, **kw)

    def clocked(url: str, timeout: float = 10.0, clock: Any = None) -> Any:
        scraped.append(url)
        return scrape(url, timeout, clock=lambda: now["t"])

    monkeypatch.setattr(verify_module, "read_direct", ordered)
    monkeypatch.setattr(verify_module, "scrape", clocked)
    return scraped


@pytest.mark.parametrize(
    ("prefill_ttft", "decode_e2e", "verdict", "role"),
    [
        (0.6, 4.0, "meets", None),  # TTFT in (0.5, 0.75], completion in (2.5, 5]: both overlap their intervals
        (0.6, 12.0, "drifted", "decode"),  # completion in (10, 15]: above [3, 6] (and straddling the 10 s SLO)
        (1.5, 4.0, "drifted", "prefill"),  # TTFT in (1, 2.5]: above [0.5, 0.9]
    ],
)
def test_verify_reads_each_role_and_names_the_drifting_one(
    fleet: tuple[Path, dict[str, Any], _Pages], prefill_ttft: float, decode_e2e: float, verdict: str,
    role: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    plan_dir, plan, pages = fleet
    scraped = _event_ordered(monkeypatch, _traffic(plan, pages, prefill_ttft=prefill_ttft, decode_e2e=decode_e2e), 10.0)
    # Each worker's URL under its class only, in no particular order: roles come from the plan's ports.
    urls = [p["metrics_url"] for p in reversed(plan["placements"])]
    items = [f"{p['workload']}={u}" for u, p in zip(urls, reversed(plan["placements"]), strict=True)]
    rc = cli_main(["verify", str(plan_dir), "--metrics", ",".join(items), "--window", "10s", "--out",
                   str(tmp_path / "v.json")])
    text = capsys.readouterr().out
    assert rc == 0 and sorted(scraped) == sorted(urls * 2)
    report = json.loads((tmp_path / "v.json").read_text())
    summ, chat = (next(c for c in report["classes"] if c["workload"] == w) for w in ("summ", "chat"))
    assert (summ["verdict"], summ["role"]) == (verdict, role), summ["reasons"]
    assert report["source"]["roles"] == {"summ": {
        r: [p["metrics_url"] for p in reversed(_workers(plan, "summ", r))] for r in ("prefill", "decode")}}
    # The class's TTFT is the prefill workers', its completion and success the decode worker's.
    pre, dec = summ["roles"]["prefill"], summ["roles"]["decode"]
    assert (pre["workers_planned"], pre["workers_seen"], dec["workers_planned"], dec["workers_seen"]) == (2, 2, 1, 1)
    assert {k: summ["metrics"]["ttft_p99_s"][k] for k in ("lo", "hi", "count")} == {
        k: pre["ttft_p99_s"][k] for k in ("lo", "hi", "count")} and pre["ttft_p99_s"]["count"] == N
    assert summ["metrics"]["completion_p99_s"]["lo"] == dec["completion_p99_s"]["lo"]
    assert summ["metrics"]["success_rate"]["finished"] == N and summ["served_rps"] == pytest.approx(N / 10)
    assert (dec["itl_p99_s"]["lo"], dec["itl_p99_s"]["hi"]) == (0.025, 0.05) and dec["itl_p99_s"]["count"] == N * 19
    assert pre["num_requests_waiting"] == {"start": 0.0, "end": 0.0}
    assert pre["reads"] == ["ttft_p99_s"] and "completion_p99_s" in dec["reads"]
    assert pre["drift"] == (["ttft_p99_s"] if role == "prefill" else [])
    assert dec["drift"] == (["completion_p99_s"] if role == "decode" else [])
    assert summ["config"] == DISAGG and summ["tp"] is None and summ["gpus_per_replica"] == 4
    assert summ["router"] == {"replicas": 1, "metrics": None, "note": ROUTER_NOTE}
    # The aggregated class of the catalogued plan: its configuration, no roles.
    assert (chat["config"], chat["tp"], chat["role"], chat["roles"], chat["router"]) == (AGG, 2, None, None, None)
    assert chat["verdict"] == "meets"
    lines = text.splitlines()
    assert f"  summ {DISAGG}@C4 ×1 (1 seen): {verdict}" in lines and f"  chat {AGG}@C4 ×1 (1 seen): meets" in lines
    assert f"    router: {ROUTER_NOTE}" in lines and f"    drifting role: {role or 'none'}" in lines

    # run --production: the window observes summ's (config, load) cell, per replica.
    rows = {cell["workload"]: (cell, row) for cell, row, _ in production_rows(report, "v.json")}
    cell, row = rows["summ"]
    assert cell == {"workload": "summ", "config": DISAGG, "load": "C4"}
    assert (row["tp"], row["config"]) == (4, DISAGG)
    assert row["ttft_p99_s"] == pre["ttft_p99_s"]["interpolated"]
    assert row["completion_p99_s"] == dec["completion_p99_s"]["interpolated"]


@pytest.mark.parametrize("legacy", [False, True])
def test_fake_inter_token_latency_is_read_under_either_name(legacy: bool) -> None:
    from fleetsieve_bayes.deploy.metrics import parse_scrape, reading

    assert "token_seconds" not in FakeMetrics("m").render(0).replace("time_to_first_token_seconds", "")
    m = FakeMetrics("m", itl=True, legacy_names=legacy)
    a = parse_scrape(m.render(0), "u", 0.0)
    m.finish(0.1, 1.0, itl_s=[0.02] * 50)
    r = reading([a], [parse_scrape(m.render(0), "u", 1.0)])
    assert r.itl_p99 is not None and (r.itl_p99.lo, r.itl_p99.hi, r.itl_p99.count) == (0.01, 0.025, 50)
    assert r.names["vllm:inter_token_latency_seconds"] == (
        "vllm:time_per_output_token_seconds" if legacy else "vllm:inter_token_latency_seconds")


def test_role_assignment_by_port_name_and_refusals(fleet: tuple[Path, dict[str, Any], _Pages]) -> None:
    _, plan, _ = fleet
    (pre0, pre1), (dec,) = _workers(plan, "summ", "prefill"), _workers(plan, "summ", "decode")
    # Another host name for the same workers: the port decides.
    other = [f"summ=http://localhost:{p['port']}/metrics" for p in (dec, pre1, pre0)]
    assert assign_roles(plan, other) == {"summ": {"prefill": [f"http://localhost:{pre1['port']}/metrics",
                                                              f"http://localhost:{pre0['port']}/metrics"],
                                                  "decode": [f"http://localhost:{dec['port']}/metrics"]}}
    # A role named outright; the aggregated class is no role's.
    named = ["summ:prefill=http://a:9/metrics", "summ:decode=http://b:9/metrics", "chat=http://c:9/metrics"]
    assert assign_roles(plan, named) == {"summ": {"prefill": ["http://a:9/metrics"], "decode": ["http://b:9/metrics"]}}
    # Plain URLs, one per placement in the plan's order: each its placement's role.
    plain = [f"http://x:{i}/metrics" for i in range(len(plan["placements"]))]
    got = assign_roles(plan, plain)
    assert got["summ"]["decode"] == [u for u, p in zip(plain, plan["placements"], strict=True) if p["role"] == "decode"]
    for items, message in (
        (["summ=http://127.0.0.1:1/metrics"], "is class summ's router, which exposes no /metrics"),
        (["summ=http://h:2/metrics"], "no worker of the plan listens on port 2"),
        ([f"summ={pre0['metrics_url']}"], "none of its URLs is a decode worker's"),
        (["chat:prefill=http://h:2/metrics"], "class 'chat' is not disaggregated"),
    ):
        with pytest.raises(InputError, match=re.escape(message)) as err:
            assign_roles(plan, items)
        assert "\n" not in str(err.value)


class _PrometheusAPI:
    """A Prometheus HTTP API whose series carry ``class`` and, for summ's workers, the role label
    ``label``: summ's prefill TTFT p99 in (0.5, 0.75], its decode completion p99 in (10, 15]."""

    EDGES = ("0.25", "0.5", "0.75", "1.0", "2.5", "5.0", "10.0", "15.0", "+Inf")

    def __init__(self, label: str) -> None:
        self.label = label
        self.queries: list[str] = []
        # matchers → (workers, TTFT bucket's upper edge, completion bucket's upper edge)
        self.series = {f'class="summ",{label}="prefill"': (2, "0.75", "1.0"),
                       f'class="summ",{label}="decode"': (1, "0.25", "15.0"),
                       'class="chat"': (1, "0.75", "5.0")}

    def answer(self, q: str) -> dict[str, Any]:
        self.queries.append(q)

        def vector(*rows: tuple[dict[str, str], float]) -> dict[str, Any]:
            return {"resultType": "vector", "result": [{"metric": m, "value": [0, str(v)]} for m, v in rows]}

        m = re.match(r"count by \((\w+)\) \(\{(.*)\}\)", q)
        if m:  # which label names the roles
            return vector(({m[1]: "prefill"}, 1)) if m[1] == self.label and 'class="summ"' in m[2] else vector()
        key = next((k for k in sorted(self.series, key=len, reverse=True) if k in q), None)
        if key is None:
            return vector()
        workers, ttft, e2e = self.series[key]
        if q.startswith("up{"):
            return vector()  # no target down
        if q.startswith("group by (__name__)"):
            names = ["vllm:time_to_first_token_seconds_bucket", "vllm:e2e_request_latency_seconds_bucket",
                     "vllm:request_success_total", "vllm:num_requests_running", "vllm:num_requests_waiting"]
            return vector(*(({"__name__": n}, 1) for n in names))
        for name, edge in (("vllm:time_to_first_token_seconds", ttft), ("vllm:e2e_request_latency_seconds", e2e)):
            if q.startswith(f"{name}_bucket{{"):
                at = self.EDGES.index(edge)
                return {"resultType": "matrix", "result": [
                    {"metric": {"le": le}, "values": [[0, "0"], [1, str(N if i >= at else 0)]]}
                    for i, le in enumerate(self.EDGES)]}
            if q.startswith("histogram_quantile") and name in q:
                return vector(({}, float(edge) * 0.9))
        if q.startswith("count("):
            return vector(({}, workers))
        if q.startswith("sum(increase(vllm:request_success_total"):
            return vector(({}, N))
        if q.startswith("sum(vllm:num_requests_waiting") and "offset" not in q:
            return vector(({}, 3 if "prefill" in key else 0))
        return vector(({}, 0))


@contextlib.contextmanager
def _serving(api: _PrometheusAPI) -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            parsed = urllib.parse.urlparse(self.path)
            body = json.dumps({"status": "success",
                               "data": api.answer(urllib.parse.parse_qs(parsed.query)["query"][0])}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("label", ["role", "fleetsieve_bayes_role"])  # prometheus.yml's; k8s pods' through labelmap
def test_prometheus_reads_each_role_by_its_label(fleet: tuple[Path, dict[str, Any], _Pages], label: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    plan_dir, _, _ = fleet
    api = _PrometheusAPI(label)
    with _serving(api) as base:
        rc = cli_main(["verify", str(plan_dir), "--prometheus", base, "--window", "2m", "--json"])
    assert rc == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["source"]["role_selectors"] == {"summ": {r: f'class="summ",{label}="{r}"' for r in ("prefill", "decode")}}
    summ = next(c for c in report["classes"] if c["workload"] == "summ")
    assert (summ["verdict"], summ["role"]) == ("drifted", "decode"), summ["reasons"]
    assert (summ["metrics"]["ttft_p99_s"]["lo"], summ["metrics"]["ttft_p99_s"]["hi"]) == (0.5, 0.75)
    assert (summ["metrics"]["completion_p99_s"]["lo"], summ["metrics"]["completion_p99_s"]["hi"]) == (10.0, 15.0)
    assert summ["roles"]["prefill"]["workers_seen"] == 2 and summ["roles"]["decode"]["workers_seen"] == 1
    assert summ["roles"]["prefill"]["num_requests_waiting"] == {"start": 0.0, "end": 3.0}
    # Every query of summ's workers names one role; the aggregated class is read as before.
    assert any(f'{label}="decode"' in q for q in api.queries)
    assert not any('class="chat"' in q and f'{label}=' in q for q in api.queries)


def test_production_of_a_catalogued_class_is_its_config_cell(fleet: tuple[Path, dict[str, Any], _Pages],
                                                            tmp_path: Path) -> None:
    report = {"version": 1, "classes": [{
        "workload": "summ", "tp": None, "load": "C4", "config": DISAGG, "gpus_per_replica": 4, "window_s": 60.0,
        "offered_rps_per_replica": 2.0, "served_rps_per_replica": 2.0, "verdict": "drifted",
        "metrics": {"ttft_p99_s": {"interpolated": 0.7}, "completion_p99_s": {"interpolated": 12.0},
                    "success_rate": {"value": 1.0, "finished": 120}}}]}
    (tmp_path / "v.json").write_text(json.dumps(report))
    [(cell, row, _)] = production_inputs([tmp_path / "v.json"], {("summ", DISAGG, "C4")})
    assert tuple(cell) == ("summ", DISAGG, "C4") and (row["tp"], row["config"]) == (4, DISAGG)
    with pytest.raises(InputError, match=re.escape(f"class summ's cell {DISAGG}@C4 is not a candidate")):
        production_inputs([tmp_path / "v.json"], {("summ", AGG, "C4")})
    rec = SimpleNamespace(phase="production", cell=cell, row=row)
    alloc = {"summ": {"tp": 2, "config": AGG, "load": "C4", "replicas": 2}}
    summary = production_summary([rec], alloc, {"summ": SLO}, {tuple(cell): [2.0, 0.7, 12.0, 1.0]})
    assert summary["cells"] == [{"workload": "summ", "config": DISAGG, "load": "C4"}]
    (changed,) = summary["changed"]
    assert changed["planned"] == {"config": DISAGG, "load": "C4"}
    assert changed["now"] == {"config": AGG, "tp": 2, "load": "C4", "replicas": 2}
    assert describe_change(changed) == (f"summ: production windows put {DISAGG}@C4 outside its SLO (completion p99 "
                                        f"12 s > 10 s); change it to {AGG}@C4 ×2")


# --- ingest --config ------------------------------------------------------------------------


def _ingest(*args: str) -> int:
    return cli_main(["ingest", *args])


def test_ingest_config_writes_the_name_and_an_empty_tp(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "t.csv"
    assert _ingest(str(FIX / "vllm_bench_serve_default.json"), "--workload", "chat", "--config", AGG,
                   "--load", "C4", "--out", str(out)) == 0
    # A second result of the cell is its window 1; an AIPerf run of the disaggregated configuration.
    assert _ingest(str(FIX / "vllm_bench_serve_no_oversample.json"), "--workload", "chat", "--config", AGG,
                   "--load", "C4", "--out", str(out)) == 0
    assert _ingest(str(FIX / "dynamo_aic_medium_profile_export_aiperf.json"), "--workload", "summ",
                   "--config", DISAGG, "--out", str(out)) == 0
    raw = out.read_text().splitlines()
    assert raw[0].split(",")[1] == "tp" and all(line.split(",")[1] == "" for line in raw[1:])
    df = read_table(out)
    assert df["config"].tolist() == [AGG, AGG, DISAGG] and df["tp"].tolist() == [0, 0, 0]
    assert df["replicate"].tolist() == [0, 1, 0]
    resolved = resolve_configs(df, CATALOGUE, str(out), row_offset=2)
    assert resolved["tp"].tolist() == [2, 2, 4] and resolved["config"].tolist() == [AGG, AGG, DISAGG]
    # --tp with --config: the aggregated configuration's own TP is written; a contradiction is one line.
    assert _ingest(str(FIX / "vllm_bench_serve_default.json"), "--workload", "w", "--config", AGG, "--tp", "2",
                   "--json") == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["tp"], row["config"]) == (2, AGG)
    for extra, message in ((("--config", AGG, "--tp", "4"), f"--config {AGG} names TP2, but --tp is 4"),
                           (("--config", DISAGG, "--tp", "4"), f"--config {DISAGG} names a disaggregated layout "
                                                               "(2 prefill TP1 + 1 decode TP2), which has no single TP"),
                           (("--config", "two words"), "--config: expected a configuration name")):
        assert _ingest(str(FIX / "vllm_bench_serve_default.json"), "--workload", "w", *extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err


def _llmd_disaggregated(tmp_path: Path, prefill: tuple[int, int] = (2, 2), decode: tuple[int, int] = (1, 4)) -> Path:
    """The edited one-replica v0.2 fixture with a stack of ``prefill`` = (replicas, tp) prefill engines
    and ``decode`` decode engines (llm-d's standardized ``role``), behind its router."""
    data = yaml.safe_load((FIX / "llmd_br_v0_2_edited_one_replica.yaml").read_text())
    stack = data["scenario"]["stack"]
    (engine,) = [c for c in stack if c["standardized"]["kind"] == "inference_engine"]
    roles = []
    for role, (n, tp) in (("prefill", prefill), ("decode", decode)):
        c = json.loads(json.dumps(engine))
        c["standardized"].update(role=role, replicas=n)
        c["standardized"]["accelerator"].update(count=n * tp)
        c["standardized"]["accelerator"]["parallelism"]["tp"] = tp
        roles.append(c)
    data["scenario"]["stack"] = roles + [c for c in stack if c is not engine]
    p = tmp_path / "pd.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_llmd_disaggregated_stack_names_its_layout(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = _llmd_disaggregated(tmp_path)
    out = tmp_path / "t.csv"
    assert _ingest(str(report), "--workload", "summ", "--out", str(out)) == 0
    df = read_table(out)
    assert df["config"].tolist() == ["2p-tp2+1d-tp4"] and df["tp"].tolist() == [0] and df["load"].tolist() == ["10rps"]
    catalogue = (ServingConfig("2p-tp2+1d-tp4", prefill=Role(2, 2), decode=Role(4, 1)),)
    assert resolve_configs(df, catalogue, str(out), row_offset=2)["tp"].tolist() == [8]
    # --config names the campaign's own entry (its name says the same layout); --tp alone reads it as
    # that TP, as before configurations.
    assert _ingest(str(report), "--workload", "summ", "--config", "2p-tp2+1d-tp4-s256", "--json") == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["tp"], row["config"]) == (None, "2p-tp2+1d-tp4-s256")
    assert _ingest(str(report), "--workload", "summ", "--tp", "8", "--json") == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["tp"] == 8 and "config" not in row
    for extra, message in (
        (("--config", "pd-big", "--tp", "8"), "the stack is disaggregated (2p-tp2+1d-tp4), which has no single TP"),
        (("--config", "1p-tp4+1d-tp4"), "--config 1p-tp4+1d-tp4 says another layout than the report's stack "
                                        "(2p-tp2+1d-tp4)"),
        (("--config", "agg-tp8"), "--config agg-tp8 says another layout"),
    ):
        assert _ingest(str(report), "--workload", "summ", *extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err
    # A one-engine report with --config: the name, tp empty; a --tp that is not the engine's is one line.
    one = FIX / "llmd_br_v0_2_edited_one_replica.yaml"
    assert _ingest(str(one), "--workload", "w", "--config", "agg-tp8-s64", "--json") == 0
    [row] = json.loads(capsys.readouterr().out)
    assert (row["tp"], row["config"]) == (None, "agg-tp8-s64")
    assert _ingest(str(one), "--workload", "w", "--config", "big", "--tp", "4") == 2
    assert "--tp 4 but the report's one engine has tp 8" in capsys.readouterr().err
