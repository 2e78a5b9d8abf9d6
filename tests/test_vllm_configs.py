"""The vLLM backend measuring a catalogue of configurations ([[configs]]) on the fake engine.

- the grid is workload × configuration × load, rows name their ``config`` and count
  every GPU of a replica in ``tp``;
- an aggregated configuration's engine arguments are flags of its server
  (``max_num_seqs`` → ``--max-num-seqs``), which the fake engine obeys (a smaller
  limit serves less at a high load); a server is reused only by its own configuration;
- a disaggregated configuration is a prefill and a decode worker on distinct devices,
  each with its ``--kv-transfer-config``, behind the project's router
  (:mod:`fleetsieve_bayes.backends.router`): requests are prefilled with
  ``max_tokens = 1`` and decoded with the prefill's ``kv_transfer_params``;
- a role that fails to start, never gets healthy or dies mid-window is a failed
  observation naming the role; an engine argument vLLM rejects is a ``startup-exit``
  naming the configuration;
- a SIGKILL of the measuring process mid-window leaves no worker and no router;
- the router on its own, and the pieces (flags, KV-transfer JSON, router requests).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from fake_vllm import WARMUP, WINDOW, write_fake_vllm_campaign

from fleetsieve_bayes.backends import make_backend
from fleetsieve_bayes.backends.replica import engine_flags, kv_transfer_config, replica_engines
from fleetsieve_bayes.backends.router import decode_request, prefill_request
from fleetsieve_bayes.backends.server import group_members
from fleetsieve_bayes.backends.vllm import parse_vllm_options
from fleetsieve_bayes.campaign.config import Campaign, load_campaign
from fleetsieve_bayes.campaign.executor import cell_runner
from fleetsieve_bayes.configs import Role, ServingConfig
from fleetsieve_bayes.errors import InputError
from fleetsieve_bayes.table import COLUMNS, validate_table
from fleetsieve_bayes.testing import fake_server_command, running_fake_server

# The server's command, wrapped so that its log shows the devices and the NIXL side-channel port it was given.
SHOW_ENV = ["sh", "-c", 'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; '
            'echo "VLLM_NIXL_SIDE_CHANNEL_PORT=$VLLM_NIXL_SIDE_CHANNEL_PORT"; exec "$@"', "sh"]

SEQS = """
[[configs]]
name = "s2"
tp = 1
engine = { max_num_seqs = 2 }

[[configs]]
name = "s32"
tp = 1
engine = { max_num_seqs = 32 }
"""

DISAGG = """
[[configs]]
name = "agg"
tp = 1

[[configs]]
name = "1p1d"
prefill = { tp = 1, workers = 1 }
decode = { tp = 1, workers = 1 }
"""


def _campaign(tmp_path: Path, configs: str, *, flags: tuple[str, ...] = (), **kw: Any) -> Campaign:
    """A fake-engine vLLM campaign whose [measurement] has no ``tp`` and whose catalogue is ``configs``."""
    cmd = [*SHOW_ENV, *fake_server_command("--slots", "8", "--token-delay", "0.01", "--log-requests", *flags)]
    path = write_fake_vllm_campaign(tmp_path, cmd, **kw)
    text = re.sub(r"^tp = \[.*\]\n", "", path.read_text(), count=1, flags=re.MULTILINE)
    path.write_text(text + configs)
    return load_campaign(path)


def _log(out: Path, pattern: str) -> str:
    (path,) = (out / "logs").glob(pattern)
    return path.read_text()


def _env_in_log(log: str, name: str) -> str:
    m = re.search(rf"^{name}=(.*)$", log, re.MULTILINE)
    assert m is not None, log
    return m.group(1)


def _argv(log: str) -> list[str]:
    m = re.search(r"^fake server: argv (.*)$", log, re.MULTILINE)
    assert m is not None, log
    return json.loads(m.group(1))


def _requests(log: str) -> list[dict[str, Any]]:
    """The completion requests a fake server logged (--log-requests)."""
    out = []
    for m in re.finditer(r"^request max_tokens=(\d+) stream=(\w+) kv_transfer_params=(.*)$", log, re.MULTILINE):
        out.append({"max_tokens": int(m.group(1)), "stream": m.group(2) == "True",
                    "kv_transfer_params": json.loads(m.group(3))})
    return out


def _leftovers() -> list[int]:
    """Live process groups started by this process (servers, routers), the lifeline watchdog excepted."""
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    rest = f.read().rsplit(")", 1)[1].split()
                watchdog = b"lifeline.py" in Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if int(rest[1]) == os.getpid() and rest[0] != "Z" and not watchdog and group_members(int(pid)):
                out.append(int(pid))
    return out


# ------------------------------------------------------------------ the pieces


def test_engine_arguments_become_flags_and_roles_get_their_kv_config() -> None:
    engine = (("enable_prefix_caching", False), ("enforce_eager", True), ("gpu_memory_utilization", 0.85),
              ("kv_cache_dtype", "fp8"), ("max_num_seqs", 8))
    assert engine_flags(engine) == ["--no-enable-prefix-caching", "--enforce-eager", "--gpu-memory-utilization",
                                    "0.85", "--kv-cache-dtype", "fp8", "--max-num-seqs", "8"]
    assert json.loads(kv_transfer_config("NixlConnector", "kv_producer")) == {
        "kv_connector": "NixlConnector", "kv_role": "kv_producer"}
    assert json.loads(kv_transfer_config("LMCacheConnectorV1", "kv_consumer", {"backends": ["UCX"]})) == {
        "kv_connector": "LMCacheConnectorV1", "kv_role": "kv_consumer",
        "kv_connector_extra_config": {"backends": ["UCX"]}}
    two_one = ServingConfig(name="2p-tp2+1d-tp3", prefill=Role(2, 2), decode=Role(3, 1))
    engines = replica_engines(two_one, range(10, 20))
    assert [(e.label, e.tp, e.devices) for e in engines] == [
        ("prefill worker 0", 2, (10, 11)), ("prefill worker 1", 2, (12, 13)), ("decode worker 0", 3, (14, 15, 16))]
    with pytest.raises(ValueError, match="needs 7 devices"):
        replica_engines(two_one, range(6))


def test_router_requests() -> None:
    body = {"model": "m", "prompt": [1, 2], "max_tokens": 50, "stream": True,
            "stream_options": {"include_usage": True}, "min_tokens": 5, "ignore_eos": True}
    p = prefill_request(body)
    assert p["max_tokens"] == 1 and p["stream"] is False and p["kv_transfer_params"]["do_remote_decode"] is True
    assert "stream_options" not in p and "min_tokens" not in p and p["ignore_eos"] is True
    assert body["max_tokens"] == 50 and "kv_transfer_params" not in body  # the original is untouched
    params = {"do_remote_prefill": True, "remote_block_ids": [3]}
    assert decode_request(body, {"kv_transfer_params": params}) == {**body, "kv_transfer_params": params}
    assert decode_request(body, {"choices": []}) == body  # a connector that answers none: the request as sent


def _post(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 - loopback
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 - loopback
        return json.loads(resp.read())


def test_router_prefills_round_robin_then_streams_the_decode(tmp_path: Path) -> None:
    from fleetsieve_bayes.backends.server import free_port, probe

    kv = '--kv-transfer-config={"kv_connector":"NixlConnector","kv_role":"kv_producer"}'
    with running_fake_server(kv) as p0, running_fake_server(kv) as p1, running_fake_server(
        '--kv-transfer-config={"kv_connector":"NixlConnector","kv_role":"kv_consumer"}'
    ) as d0:
        port = free_port()
        router = subprocess.Popen([sys.executable, "-m", "fleetsieve_bayes.backends.router", "--port", str(port),
                                   "--prefill", p0, p1, "--decode", d0], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 20
            while probe(url + "/health") != 200:
                assert router.poll() is None and time.monotonic() < deadline, router.stderr.read()
                time.sleep(0.1)
            status, streamed = _post(url + "/v1/completions", {"model": "fake-model", "prompt": [1, 2, 3],
                                                               "max_tokens": 4, "stream": True})
            assert status == 200 and streamed.count(b"data: ") == 6 and streamed.endswith(b"data: [DONE]\n\n")
            status, whole = _post(url + "/v1/completions", {"model": "fake-model", "prompt": [1], "max_tokens": 3})
            assert status == 200 and json.loads(whole)["usage"]["completion_tokens"] == 3
            # The prefill worker's own answer to a bad request comes back as it is.
            status, bad = _post(url + "/v1/completions", {"model": "nope", "prompt": [1], "max_tokens": 3})
            assert status == 404 and b"does not exist" in bad
            status, _ = _post(url + "/v1/chat/completions", {"model": "fake-model", "messages": []})
            assert status == 404  # routed to the prefill worker, which has no chat route
            debug = [_get_json(u + "/debug") for u in (p0, p1, d0)]
        finally:
            router.terminate()
            router.wait(timeout=10)
    # Round robin over the prefill workers, one output token each, not streamed; the decode
    # worker got the original requests with the prefill's kv_transfer_params.
    # (p0: the streamed request and the bad one; p1: the whole one; the chat request found no route.)
    assert [d["received"] for d in debug[:2]] == [2, 1]
    assert [d["max_tokens"] for d in debug[:2]] == [{"1": 1}, {"1": 1}]
    assert [d["prefills"] for d in debug[:2]] == [1, 1] and debug[0]["streamed"] == debug[1]["streamed"] == 0
    assert debug[2]["max_tokens"] == {"3": 1, "4": 1} and debug[2]["streamed"] == 1
    assert debug[2]["remote_prefilled"] == 2 and debug[2]["prefills"] == 0
    assert debug[2]["kv_transfer_config"] == {"kv_connector": "NixlConnector", "kv_role": "kv_consumer"}


def test_router_health_is_every_workers(tmp_path: Path) -> None:
    from fleetsieve_bayes.backends.server import free_port, probe

    with running_fake_server() as ok:
        port, dead = free_port(), f"http://127.0.0.1:{free_port()}"
        router = subprocess.Popen([sys.executable, "-m", "fleetsieve_bayes.backends.router", "--port", str(port),
                                   "--prefill", ok, "--decode", dead], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 20
            while probe(url + "/health") is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert probe(url + "/health") == 503
            try:
                urllib.request.urlopen(url + "/health", timeout=10)  # noqa: S310 - loopback
            except urllib.error.HTTPError as exc:
                assert json.loads(exc.read())["workers"] == {ok: 200, dead: None}
            status, body = _post(url + "/v1/completions", {"model": "fake-model", "prompt": [1], "max_tokens": 2})
            assert status == 502 and dead.encode() in body and b"decode worker" in body
        finally:
            router.terminate()
            router.wait(timeout=10)


# ------------------------------------------------------------------ options and grid


def test_grid_is_workload_config_load_and_rows_name_their_config(tmp_path: Path) -> None:
    c = _campaign(tmp_path, DISAGG + SEQS, workloads=("chat", "code"), gpus="gpus = [0, 1, 2]")
    s = parse_vllm_options(c)
    assert s.kv_connector == "NixlConnector" and s.kv_connector_extra_config is None and s.tp == (1,)
    g = make_backend(c, tmp_path / "out").grid
    assert g.catalogued and g.n_cells == 2 * 4 * 2
    assert [g.key(i) for i in range(4)] == [("chat", "agg", "low"), ("chat", "agg", "high"),
                                            ("chat", "1p1d", "low"), ("chat", "1p1d", "high")]
    assert list(g.tp[:8]) == [1, 1, 2, 2, 1, 1, 1, 1]  # a replica's GPUs: the disaggregated one has two
    assert g.cost_gpu_s[2] == pytest.approx(2 * (WARMUP + WINDOW))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace('loads = {', 'tp = [1]\nloads = {'), "[measurement] tp: the campaign's [[configs]]"),
        (lambda t: t.replace("gpus = [0, 1]", "gpus = [0]"),
         "[measurement] gpus: configuration '1p1d' needs 2 GPUs but the pool has 1"),
        (lambda t: t.replace('loads = {', 'kv_connector_extra_config = "x"\nloads = {'),
         "[measurement] kv_connector_extra_config: expected a table"),
        (lambda t: t.replace('loads = {', 'kv_connector = ""\nloads = {'),
         "[measurement] kv_connector: expected a non-empty string"),
        (lambda t: t.replace('loads = {', 'kv_connector = "none"\nkv_connector_extra_config = { a = 1 }\nloads = {'),
         '[measurement] kv_connector_extra_config: kv_connector = "none" transfers no KV cache'),
    ],
)
def test_catalogue_options_errors_name_the_key(tmp_path: Path, edit: Any, message: str) -> None:
    c = _campaign(tmp_path, DISAGG)
    c.path.write_text(edit(c.path.read_text()))
    with pytest.raises(InputError) as err:
        parse_vllm_options(load_campaign(c.path))
    assert message in str(err.value) and "\n" not in str(err.value) and str(c.path) in str(err.value)


# ------------------------------------------------------------------ aggregated configurations


def test_max_num_seqs_reaches_the_server_and_limits_throughput(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # 5 req/s at scale 1; at scale 8, 40 req/s: 2 slots of 0.1 s requests serve ~20 req/s, 32 keep up.
    c = _campaign(tmp_path, SEQS, loads="{ low = 1.0, high = 8.0 }", n_requests=60)
    backend = make_backend(c, out)
    idx = backend.grid.index()
    try:
        small = backend.measure(idx[("chat", "s2", "high")])
        large = backend.measure(idx[("chat", "s32", "high")])  # the same TP, other engine arguments: restarted
        again = backend.measure(idx[("chat", "s32", "low")])  # the same configuration: reused
    finally:
        backend.close()
    assert [r["config"] for r in (small, large, again)] == ["s2", "s32", "s32"]
    assert all(r["failure"] == "" and r["tp"] == 1 for r in (small, large, again))
    assert small["startup_s"] > 0 and large["startup_s"] > 0 and again["startup_s"] == 0.0
    for name, seqs in (("s2", "2"), ("s32", "32")):
        log = _log(out, f"chat_{name}_high_*.log")
        assert _argv(log)[-2:] == ["--max-num-seqs", seqs]  # after the template's --slots 8: it wins
        assert log.splitlines()[0].startswith("$ sh -c") and log.splitlines()[0].endswith(f"--max-num-seqs {seqs}")
        assert f"max_num_seqs={seqs}," in log
    assert len(list((out / "logs").glob("*.log"))) == 2
    assert small["throughput_rps"] < 0.75 * large["throughput_rps"], (small, large)
    assert small["ttft_p99_s"] > large["ttft_p99_s"]
    df = validate_table(pd.DataFrame([{k: r[k] for k in (*COLUMNS, "failure", "config")} for r in (small, large)]))
    assert list(df["config"]) == ["s2", "s32"]
    rec = pd.read_parquet(next((out / "raw").glob("chat_s2_high_*.parquet")))
    assert set(rec["config"]) == {"s2"} and set(rec["tp"]) == {1}
    assert _leftovers() == []


def test_an_engine_argument_vllm_rejects_is_a_failed_start_of_its_config(tmp_path: Path) -> None:
    configs = '[[configs]]\nname = "async"\ntp = 1\nengine = { async_scheduling = true }\n'
    backend = make_backend(_campaign(tmp_path, configs, flags=("--reject-flag=--async-scheduling",)),
                           tmp_path / "out")
    try:
        row = backend.measure(backend.grid.index()[("chat", "async", "low")])
    finally:
        backend.close()
    assert row["failure"] == "startup-exit" and row["config"] == "async" and row["tp"] == 1
    detail = row["detail"]
    assert "\n" not in detail and detail.startswith("configuration 'async': server exited after")
    assert "unrecognized arguments: --async-scheduling" in detail
    assert row["duration_s"] == pytest.approx(row["startup_s"])
    assert _leftovers() == []


# ------------------------------------------------------------------ disaggregated configurations


def test_a_disaggregated_config_serves_through_the_router(tmp_path: Path) -> None:
    out = tmp_path / "out"
    c = _campaign(tmp_path, DISAGG, extra='kv_connector_extra_config = { backends = ["UCX"] }')
    backend = make_backend(c, out)
    cell = backend.grid.index()[("chat", "1p1d", "low")]
    try:
        row = backend.measure(cell)
        again = backend.measure(backend.grid.index()[("chat", "1p1d", "high")])  # the same replica, reused
    finally:
        backend.close()
    assert again["failure"] == "" and again["startup_s"] == 0.0 and again["tp"] == 2
    assert len(list((out / "logs").glob("*.log"))) == 3  # two workers and the router, for both cells
    assert row["failure"] == "" and row["success_rate"] == 1.0 and row["config"] == "1p1d"
    # Both GPUs of the replica count: GPU-seconds = duration × 2, start-up GPU-seconds too.
    assert row["tp"] == 2 and row["duration_s"] == pytest.approx(WARMUP + WINDOW) and row["startup_s"] > 0
    assert backend.grid.cost_gpu_s[cell] == pytest.approx(2 * (WARMUP + WINDOW))
    prefill, decode = _log(out, "chat_1p1d_low_*_prefill0.log"), _log(out, "chat_1p1d_low_*_decode0.log")
    router = _log(out, "chat_1p1d_low_*_router.log")
    assert "fleetsieve_bayes.backends.router" in router.splitlines()[0]
    # Distinct devices of the pool; each worker its own NIXL side-channel port.
    assert (_env_in_log(prefill, "CUDA_VISIBLE_DEVICES"), _env_in_log(decode, "CUDA_VISIBLE_DEVICES")) == ("0", "1")
    assert _env_in_log(prefill, "VLLM_NIXL_SIDE_CHANNEL_PORT") != _env_in_log(decode, "VLLM_NIXL_SIDE_CHANNEL_PORT")
    for log, role in ((prefill, "kv_producer"), (decode, "kv_consumer")):
        argv = _argv(log)
        assert json.loads(argv[argv.index("--kv-transfer-config") + 1]) == {
            "kv_connector": "NixlConnector", "kv_role": role, "kv_connector_extra_config": {"backends": ["UCX"]}}
    rec = pd.concat([pd.read_parquet(p) for p in (out / "raw").glob("chat_1p1d_*.parquet")])
    assert set(rec["config"]) == {"1p1d"} and set(rec["tp"]) == {2}
    # Every request of both cells was prefilled (one token, not streamed) and then decoded,
    # streamed, with the prefill's kv_transfer_params.
    pre, dec = _requests(prefill), _requests(decode)
    assert len(pre) == len(dec) == len(rec) > 0
    assert all(r["max_tokens"] == 1 and not r["stream"] and r["kv_transfer_params"]["do_remote_decode"]
               for r in pre)
    assert all(r["max_tokens"] == 10 and r["stream"] and r["kv_transfer_params"]["do_remote_prefill"] for r in dec)
    assert _leftovers() == []


def test_kv_connector_none_recomputes_the_prompt_on_the_decode_worker(tmp_path: Path) -> None:
    out = tmp_path / "out"
    c = _campaign(tmp_path, DISAGG, extra='kv_connector = "none"')
    assert parse_vllm_options(c).kv_connector == "none"
    backend = make_backend(c, out)
    try:
        row = backend.measure(backend.grid.index()[("chat", "1p1d", "low")])
    finally:
        backend.close()
    assert row["failure"] == "" and row["success_rate"] == 1.0 and row["tp"] == 2
    prefill, decode = _log(out, "chat_1p1d_low_*_prefill0.log"), _log(out, "chat_1p1d_low_*_decode0.log")
    # No engine gets a KV-transfer config or a NIXL side-channel port ...
    for log in (prefill, decode):
        assert "--kv-transfer-config" not in _argv(log) and _env_in_log(log, "VLLM_NIXL_SIDE_CHANNEL_PORT") == ""
    # ... and every request is still prefilled (one token) and then decoded in full, without
    # kv_transfer_params: the prefill answered none, the decode worker computes the prompt itself.
    pre, dec = _requests(prefill), _requests(decode)
    assert len(pre) == len(dec) > 0
    assert all(r["max_tokens"] == 1 and not r["stream"] for r in pre)
    assert all(r["max_tokens"] == 10 and r["stream"] and r["kv_transfer_params"] is None for r in dec)
    assert _leftovers() == []


@pytest.mark.parametrize(
    ("flags", "readiness_s", "failure", "label"),
    [
        (("--die-at-start", "--fault-role", "kv_consumer"), 20, "startup-exit", "decode worker 0 exited after"),
        (("--never-healthy", "--fault-role", "kv_producer"), 4, "startup-timeout", "prefill worker 0 timeout after"),
        (("--die-after", "3", "--fault-role", "kv_consumer"), 20, "died-mid-run", "decode worker 0 (port"),
    ],
    ids=["decode-exits-at-start", "prefill-never-healthy", "decode-dies-mid-window"],
)
def test_a_role_that_fails_is_a_failed_observation_naming_it(
    tmp_path: Path, flags: tuple[str, ...], readiness_s: float, failure: str, label: str
) -> None:
    c = _campaign(tmp_path, DISAGG, flags=flags, readiness_timeout_s=readiness_s)
    backend = make_backend(c, tmp_path / "out")
    try:
        row = backend.measure(backend.grid.index()[("chat", "1p1d", "low")])
    finally:
        backend.close()
    assert row["failure"] == failure and row["config"] == "1p1d" and row["tp"] == 2
    assert row["success_rate"] == 0.0 and row["throughput_rps"] == 0.0
    assert row["detail"].startswith(f"configuration '1p1d': {label}") and "\n" not in row["detail"]
    if failure != "died-mid-run":
        assert row["duration_s"] == pytest.approx(row["startup_s"])
    assert _leftovers() == []


def test_the_memory_guard_checks_every_engine_of_a_configuration(tmp_path: Path) -> None:
    configs = DISAGG + '[[configs]]\nname = "agg2"\ntp = 2\n'
    extra = "model_size_gb = 100.0\ngpu_memory_gb = 80.0\nkv_cache_gb_min = 5.0"
    backend = make_backend(_campaign(tmp_path, configs, extra=extra), tmp_path / "out")
    idx = backend.grid.index()
    rows = {name: backend.preflight(idx[("chat", name, "low")]) for name in ("agg", "1p1d", "agg2")}
    assert rows["agg2"] is None  # 50 + 5 GB per GPU fit in 72
    for name, gpus in (("agg", 1), ("1p1d", 2)):  # 100 + 5 > 72: so does each TP1 worker
        row = rows[name]
        assert row is not None and row["failure"] == "memory-guard" and row["duration_s"] == 0.0
        assert row["config"] == name and row["tp"] == gpus
    assert rows["1p1d"]["detail"].startswith("configuration '1p1d': prefill: weights 100 GB / TP1")
    assert not (tmp_path / "out").exists()  # nothing was launched


def test_a_pooled_cell_runs_its_config_on_the_devices_it_was_given(tmp_path: Path) -> None:
    out = tmp_path / "out"
    c = _campaign(tmp_path, DISAGG + SEQS, gpus="gpus = [0, 1, 2, 3]")
    row = cell_runner(c, out)(("chat", "1p1d", "low"), (2, 3))
    assert row["failure"] == "" and row["config"] == "1p1d" and row["tp"] == 2
    assert _env_in_log(_log(out, "chat_1p1d_low_*_prefill0.log"), "CUDA_VISIBLE_DEVICES") == "2"
    assert _env_in_log(_log(out, "chat_1p1d_low_*_decode0.log"), "CUDA_VISIBLE_DEVICES") == "3"
    assert _leftovers() == []


# ------------------------------------------------------------------ SIGKILL mid-window


CHILD = """
import sys
from pathlib import Path
from fleetsieve_bayes.backends import make_backend
from fleetsieve_bayes.campaign.config import load_campaign

backend = make_backend(load_campaign(sys.argv[1]), Path(sys.argv[2]))
backend.measure(backend.grid.index()[("chat", "1p1d", "low")])
print("the window ended before the kill", flush=True)
"""


def _stat(pid: int) -> tuple[str, int, int] | None:
    """``(state, ppid, session)`` of ``pid``, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    rest = text[text.rfind(")") + 2:].split()
    return rest[0], int(rest[1]), int(rest[3])


def _alive(pids: set[int]) -> set[int]:
    return {p for p in pids if (st := _stat(p)) is not None and st[0] != "Z"}


def _tree(root: int) -> set[int]:
    """Live descendants of ``root``."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        st = _stat(int(entry)) if entry.isdigit() else None
        if st is not None:
            children.setdefault(st[1], []).append(int(entry))
    out: set[int] = set()
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return _alive(out)


def _in_sessions(sessions: set[int]) -> set[int]:
    return {int(e) for e in os.listdir("/proc")
            if e.isdigit() and (st := _stat(int(e))) is not None and st[0] != "Z" and st[2] in sessions}


def _cmdlines(marker: bytes) -> set[int]:
    """Live processes whose command line contains ``marker``."""
    out = set()
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker in Path(f"/proc/{entry}/cmdline").read_bytes():
                out.add(int(entry))
        except OSError:
            continue
    return _alive(out)


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_sigkill_mid_window_leaves_no_worker_and_no_router(tmp_path: Path) -> None:
    marker = f"kill-{uuid.uuid4().hex[:10]}"
    out = tmp_path / "out"
    # A long window (400 arrivals, 80 s) and workers with a child process each, as vLLM's have.
    c = _campaign(tmp_path, DISAGG, flags=("--spawn-worker",), served_model=marker, n_requests=400,
                  duration_s=60.0)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, str(c.path), str(out)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # mid-window: the decode worker has served requests through the router
            logs = list((out / "logs").glob("*_decode0.log")) if (out / "logs").exists() else []
            if logs and len(_requests(logs[0].read_text())) >= 3 and list((out / "logs").glob("*_router.log")):
                break
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            assert time.monotonic() < deadline, "the window never started"
            time.sleep(0.1)
        started = _tree(proc.pid)
        workers = _cmdlines(marker.encode())
        routers = {p for p in started if b"fleetsieve_bayes.backends.router" in Path(f"/proc/{p}/cmdline").read_bytes()}
        (argv,) = [Path(f"/proc/{p}/cmdline").read_bytes().decode().split("\0") for p in routers]
        ports = [int(argv[argv.index("--port") + 1])]  # the router's, then its workers'
        ports += [int(u.rsplit(":", 1)[1]) for u in argv if u.startswith("http://127.0.0.1:")]
        assert len(ports) == 3 and all(map(_port_open, ports))
        # Two workers (their session leaders, each with its own child) and the router, all the campaign's.
        leaders = {p for p in workers if (st := _stat(p)) is not None and st[2] == p}
        assert len(leaders) == 2 and all(len(_in_sessions({p})) >= 2 for p in leaders)
        assert workers | routers <= started
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and (_alive(started) or _cmdlines(marker.encode())):
        time.sleep(0.1)
    assert _alive(started) == set() and _cmdlines(marker.encode()) == set()
    assert _in_sessions(leaders | routers) == set()
    assert not any(_port_open(p) for p in ports)


# ------------------------------------------------------------------ a whole campaign


@pytest.mark.slow  # the decision loop's fits take a minute or two on two cores
def test_a_catalogued_campaign_measures_its_design_by_configuration(tmp_path: Path) -> None:
    from fleetsieve_bayes.campaign.runner import run_campaign
    from fleetsieve_bayes.table import read_table

    c = _campaign(tmp_path, DISAGG + SEQS, loads="{ low = 1.0, high = 4.0 }", model_lines='inference = "fast"',
                  stopping='[stopping]\nslo_attainment = "point"\nmax_rounds = 1\n')
    out = tmp_path / "run"
    run_campaign(c, out)
    result = json.loads((out / "result.json").read_text())
    cells = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
    rows = [r for r in cells if r.get("type") == "measurement"]
    assert rows and all(set(r["cell"]) == {"workload", "config", "load"} for r in rows)
    assert all(r["row"]["config"] == r["cell"]["config"] for r in rows)
    gpus = {"agg": 1, "1p1d": 2, "s2": 1, "s32": 1}
    assert all(r["gpu_seconds"] == pytest.approx(r["row"]["duration_s"] * gpus[r["cell"]["config"]]) for r in rows)
    assert "1p1d" in {r["cell"]["config"] for r in rows}  # the design probes the disaggregated mix
    assert result["gpu_seconds"] == pytest.approx(sum(r["gpu_seconds"] for r in rows))
    measured = read_table(out / "measurements.csv")
    assert set(measured["config"]) == {r["cell"]["config"] for r in rows}
    assert _leftovers() == []
