"""A SIGKILL of `run` leaves no server, no worker and no held port, and the run resumes.

Every kill comes from outside (``os.kill`` of the ``run`` process, mid-cell), so
no cleanup code of the killed process runs:

- a process that started a fake server with a worker, from a thread that has
  exited since (the parent-death signal is this process's, not that thread's);
- a pooled replay campaign with cells in flight: the resumed run makes the
  uninterrupted run's decisions (replay is deterministic);
- a vLLM-backend campaign against the fake engine (``--spawn-worker``: each
  server has a worker, as vLLM has), one cell at a time and pooled: nothing of
  the killed run's servers is left, and the resumed run keeps every measured
  cell and certifies;
- the same for a disaggregated configuration (a prefill and a decode worker
  behind the router), killed mid-window: no worker and no router is left
  (tests/test_engine_configs.py does it with vLLM's CPU build).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from fake_vllm import write_fake_vllm_campaign
from tiny_campaign import write_certify_preset, write_tiny

from fleetsieve_bayes.testing import fake_server_command

T = TypeVar("T")


@pytest.fixture(scope="module")
def jax_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One JAX compilation cache for this module's processes: only the first run compiles."""
    return str(tmp_path_factory.mktemp("jax-cache"))


def _env(jax_cache: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "MPLBACKEND": "Agg",
        "JAX_COMPILATION_CACHE_DIR": jax_cache,
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    }


def _start_run(campaign: Path, out: Path, jax_cache: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "fleetsieve_bayes", "run", str(campaign), "--out", str(out), "--quiet"],
        env=_env(jax_cache), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )


def _finish_run(campaign: Path, out: Path, jax_cache: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "fleetsieve_bayes", "run", str(campaign), "--out", str(out), "--quiet"],
        env=_env(jax_cache), capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "result.json").read_text())


def _wait(what: str, probe: Callable[[], T | None], proc: subprocess.Popen[str], timeout_s: float = 600) -> T:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = probe()
        if got:
            return got
        if proc.poll() is not None:
            raise AssertionError(f"run ended (exit {proc.returncode}) before {what}: {proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=30) == -signal.SIGKILL


def _stat(pid: int) -> tuple[str, int] | None:
    """``(state, session)`` of ``pid``, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text(errors="replace")
    except OSError:
        return None
    rest = text[text.rfind(")") + 2:].split()
    return rest[0], int(rest[3])


def _servers(marker: str) -> dict[int, int]:
    """Live fake servers whose command line carries ``marker``: ``{pid: port}``."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        st = _stat(int(entry))
        if marker.encode() in argv and b"fleetsieve_bayes.testing.fake_server" in argv and st and st[0] != "Z":
            found[int(entry)] = int(argv[argv.index(b"--port") + 1])
    return found


def _tree(root: int) -> set[int]:
    """Live descendants of ``root`` (servers, their workers, the watchdog)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        try:
            text = Path(f"/proc/{entry}/stat").read_text(errors="replace") if entry.isdigit() else ""
        except OSError:
            continue
        if text:
            children.setdefault(int(text[text.rfind(")") + 2:].split()[1]), []).append(int(entry))
    out: set[int] = set()
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return {pid for pid in out if (st := _stat(pid)) is not None and st[0] != "Z"}


def _in_sessions(sessions: set[int]) -> set[int]:
    """Live processes in any of ``sessions`` (a server and its workers share the server's session)."""
    left = set()
    for entry in os.listdir("/proc"):
        st = _stat(int(entry)) if entry.isdigit() else None
        if st is not None and st[0] != "Z" and st[1] in sessions:
            left.add(int(entry))
    return left


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _alive(pids: set[int]) -> set[int]:
    return {pid for pid in pids if (st := _stat(pid)) is not None and st[0] != "Z"}


def _assert_nothing_left(servers: dict[int, int], marker: str, started: set[int]) -> None:
    """Within 15 s of the kill, no server, worker, watchdog or listening port of the killed run remains.

    ``started``: the killed process's descendants, taken just before the kill.
    """
    deadline = time.monotonic() + 15.0
    while time.monotonic() < deadline and (_servers(marker) or _in_sessions(set(servers)) or _alive(started)):
        time.sleep(0.1)
    assert _servers(marker) == {}
    assert _in_sessions(set(servers)) == set()
    assert _alive(started) == set()
    assert not any(_port_open(port) for port in servers.values())


def _records(out: Path) -> list[dict[str, Any]]:
    path = out / "journal.jsonl"
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]


# ----------------------------------------------------------------------------- the launcher alone


CHILD = """
import sys, threading, time
from pathlib import Path
from fleetsieve_bayes.backends.server import free_port, render_command, start_server, wait_ready
from fleetsieve_bayes.testing import fake_server_command

port = free_port()
cmd = render_command(fake_server_command("--spawn-worker"), model=sys.argv[1], tp=1, port=port)
box = {}
t = threading.Thread(target=lambda: box.update(h=start_server(cmd, port=port, log_path=Path(sys.argv[2]))))
t.start()
t.join()  # the thread that asked for the server has exited
print(wait_ready(box["h"], 30.0).status, flush=True)
time.sleep(600)
"""


def test_a_killed_process_leaves_none_of_its_servers(tmp_path: Path) -> None:
    marker = f"die-{uuid.uuid4().hex[:10]}"
    proc = subprocess.Popen([sys.executable, "-c", CHILD, marker, str(tmp_path / "server.log")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready", proc.stderr
        servers = _servers(marker)
        assert len(servers) == 1 and all(_port_open(p) for p in servers.values())
        (pid,) = servers
        assert len(_in_sessions({pid})) >= 2  # the server and its worker, alive after the thread's exit
    finally:
        started = _tree(proc.pid)
        _kill(proc)
    assert len(started) >= 3  # the server, its worker and the watchdog
    _assert_nothing_left(servers, marker, started)


LAUNCHER = """
import subprocess, sys, time
agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
print(agent.pid, flush=True)
time.sleep(600)
"""


def test_the_watchdog_kills_registered_groups_and_the_launchers_descendants() -> None:
    from fleetsieve_bayes.backends import lifeline

    def sleeper() -> subprocess.Popen[bytes]:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)

    # A launcher with a descendant in a session of its own (as a local Ray's agents are),
    # and two server groups registered with the watchdog, one of them stopped since.
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    assert launcher.stdout is not None
    agent = int(launcher.stdout.readline())
    kept, dropped = sleeper(), sleeper()
    watchdog = subprocess.Popen([sys.executable, "-I", lifeline.__file__, "watch", str(launcher.pid)],
                                stdin=subprocess.PIPE)
    try:
        assert watchdog.stdin is not None
        watchdog.stdin.write(b"+%d\n+%d\n-%d\n" % (kept.pid, dropped.pid, dropped.pid))
        watchdog.stdin.close()  # as when the launcher dies: the watchdog notes its tree, then reads the end
        assert watchdog.wait(timeout=30) == 0
        assert kept.wait(timeout=30) == -signal.SIGKILL
        deadline = time.monotonic() + 30
        while _alive({agent}) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive({agent})
        assert dropped.poll() is None  # unregistered (stopped by its owner), not the launcher's
    finally:
        for p in (kept, dropped, watchdog, launcher):
            if p.poll() is None:
                p.kill()
                p.wait()
        with contextlib.suppress(OSError):
            os.kill(agent, signal.SIGKILL)


# ----------------------------------------------------------------------------- a pooled replay campaign


def _summary(out: Path, result: dict[str, Any]) -> dict[str, Any]:
    cells = [json.dumps(r["cell"], sort_keys=True) for r in _records(out) if r["type"] == "measurement"]
    assert len(cells) == len(set(cells)), "a cell was measured twice"
    keys = ("status", "allocation", "measured", "gpu_seconds", "profiling_wall_s", "objective")
    return {k: result[k] for k in keys}


@pytest.mark.slow  # three campaigns; test_parallel.py resumes a pooled run with cells in flight in-process
def test_sigkill_of_a_pooled_run_mid_cell_resumes_to_the_uninterrupted_result(tmp_path: Path, jax_cache: str) -> None:
    reference = write_tiny(tmp_path / "ref", measurement_extra="pool_gpus = 8")
    ref_out = tmp_path / "ref" / "out"
    ref = _summary(ref_out, _finish_run(reference, ref_out, jax_cache))
    assert ref["status"] == "certified-feasible"
    # The same campaign, each replayed cell held 1.5 s of wall clock (not a decision input).
    slow = write_tiny(tmp_path / "cut", measurement_extra="pool_gpus = 8\ndelay_s = 1.5")
    out = tmp_path / "cut" / "out"
    proc = _start_run(slow, out, jax_cache)

    def cells_in_flight() -> list[dict[str, Any]] | None:
        recs = _records(out)
        done = {json.dumps(r["cell"]) for r in recs if r["type"] in ("finished", "cancelled")}
        flying = [r for r in recs if r["type"] == "started" and json.dumps(r["cell"]) not in done]
        # mid-run: the design measured, an acquisition's cells in flight
        return flying if any(r["type"] == "measurement" for r in recs) and flying else None

    try:
        flying = _wait("cells in flight after the design", cells_in_flight, proc)
    finally:
        _kill(proc)
    assert not (out / "result.json").exists() and flying
    kept = (out / "journal.jsonl").read_bytes()
    resumed = _summary(out, _finish_run(reference, out, jax_cache))
    assert (out / "journal.jsonl").read_bytes().startswith(kept)  # nothing journaled is lost
    assert resumed == ref


# ----------------------------------------------------------------------------- vLLM backend, fake engine


def _fake_vllm_campaign(tmp: Path, marker: str, pool: str = "") -> Path:
    """One class × TP {1, 2} × three loads; every server has a worker process."""
    cmd = fake_server_command("--slots", "2", "--token-delay", "0.01", "--tp-speedup", "1",
                              "--tp-slots", "--spawn-worker", "--startup-delay", "0.5")
    return write_fake_vllm_campaign(
        tmp, cmd, name="fake-vllm-kill", model_lines=f'certify_inference = "{write_certify_preset(tmp)}"',
        served_model=marker, tp=(1, 2), gpus="gpus = [0, 1, 2, 3]", extra=pool,
        loads="{ low = 1.0, mid = 2.0, high = 4.0 }", warmup_s=0.5, duration_s=2.0, readiness_timeout_s=60,
        stopping='[stopping]\nepsilon = 0.05\nslo_attainment = "point"', n_requests=40, demand_rps=8.0,
        critical=True, slo="{ success_min = 0.99, ttft_p99_s = 0.5, completion_p99_s = 2.0 }")


@pytest.mark.parametrize(
    ("pool", "n_servers", "n_measured"),
    [
        ("pool_gpus = 4", 2, 0),
        # A local Ray started by the run (4 logical GPUs): its processes, the task
        # workers and their servers all go with the run.
        pytest.param('pool_gpus = 4\nexecutor = "ray"', 2, 0, marks=pytest.mark.slow),
    ],
    ids=["pooled", "ray"],
)
def test_sigkill_of_a_vllm_run_mid_cell_leaves_no_server_and_resumes(
    tmp_path: Path, jax_cache: str, pool: str, n_servers: int, n_measured: int, monkeypatch
) -> None:
    monkeypatch.setenv("RAY_OVERRIDE_RESOURCES", '{"GPU": 4}')  # read by a Ray the run starts
    marker = f"die-{uuid.uuid4().hex[:10]}"
    campaign = _fake_vllm_campaign(tmp_path, marker, pool)
    out = tmp_path / "run"
    proc = _start_run(campaign, out, jax_cache)

    def serving() -> dict[int, int] | None:
        # mid-cell: n_measured cells journaled, as many servers up as the run measures
        # cells at once, each taking requests
        if sum(r["type"] == "measurement" for r in _records(out)) < n_measured:
            return None
        servers = _servers(marker)
        if len(servers) < n_servers or not all(map(_port_open, servers.values())):
            return None
        # A server may answer before its worker process shows: wait for both.
        return servers if all(len(_in_sessions({pid})) >= 2 for pid in servers) else None

    try:
        servers = _wait(f"{n_measured} cell(s) measured and {n_servers} server(s) serving", serving, proc)
        assert all(len(_in_sessions({pid})) >= 2 for pid in servers)  # each server has its worker
    finally:
        started = _tree(proc.pid)
        _kill(proc)
    assert set(servers) <= started
    _assert_nothing_left(servers, marker, started)
    assert not (out / "result.json").exists()
    kept = (out / "journal.jsonl").read_bytes() if (out / "journal.jsonl").exists() else b""
    before = [r for r in _records(out) if r["type"] == "measurement"]

    result = _finish_run(campaign, out, jax_cache)
    assert result["status"] == "certified-feasible"
    assert (out / "journal.jsonl").read_bytes().startswith(kept)  # every measured cell is kept
    after = [r for r in _records(out) if r["type"] == "measurement"]
    assert after[: len(before)] == before
    cells = [json.dumps(r["cell"], sort_keys=True) for r in after]
    assert len(cells) == len(set(cells)) == len(result["measured"])
    # The fake engine's TP1 saturates at 20 req/s and TP2 keeps up at 80: 8 req/s are met.
    assert result["objective"]["min_fulfillment"] == pytest.approx(1.0)
    assert _servers(marker) == {}  # the finished run stopped its own servers too


@pytest.mark.slow  # two campaigns; test_vllm_configs.py kills a process measuring a disaggregated window, quickly
def test_sigkill_of_a_disaggregated_cell_mid_window_leaves_no_worker_nor_router_and_resumes(
    tmp_path: Path, jax_cache: str
) -> None:
    import re

    marker = f"die-{uuid.uuid4().hex[:10]}"
    cmd = fake_server_command("--slots", "4", "--token-delay", "0.01", "--spawn-worker", "--startup-delay", "0.5")
    campaign = write_fake_vllm_campaign(
        tmp_path, cmd, name="fake-disaggregated-kill", served_model=marker, gpus="gpus = [0, 1]",
        model_lines=f'certify_inference = "{write_certify_preset(tmp_path)}"', loads="{ low = 1.0, high = 2.0 }",
        warmup_s=0.5, duration_s=6.0, readiness_timeout_s=60, n_requests=60, demand_rps=2.0,
        stopping='[stopping]\nslo_attainment = "point"\nmax_rounds = 2')
    text = re.sub(r"^tp = \[.*\]\n", "", campaign.read_text(), count=1, flags=re.MULTILINE)
    campaign.write_text(text + '[[configs]]\nname = "1p1d"\nprefill = { tp = 1, workers = 1 }\n'
                               "decode = { tp = 1, workers = 1 }\n")
    out = tmp_path / "run"
    proc = _start_run(campaign, out, jax_cache)

    def routing() -> tuple[dict[int, int], int] | None:
        # mid-window: both workers (each with its worker process) and the router listening
        servers = _servers(marker)
        routers = [pid for pid in _tree(proc.pid)
                   if b"fleetsieve_bayes.backends.router" in Path(f"/proc/{pid}/cmdline").read_bytes()]
        if len(servers) < 2 or len(routers) != 1 or not all(map(_port_open, servers.values())):
            return None
        argv = Path(f"/proc/{routers[0]}/cmdline").read_bytes().decode().split("\0")
        port = int(argv[argv.index("--port") + 1])
        ready = _port_open(port) and all(len(_in_sessions({pid})) >= 2 for pid in servers)
        return (servers, port) if ready else None

    try:
        servers, router_port = _wait("both workers and the router serving", routing, proc)
        time.sleep(1.0)  # inside the 6.5 s window
    finally:
        started = _tree(proc.pid)
        _kill(proc)
    _assert_nothing_left(servers, marker, started)
    assert not _port_open(router_port)
    assert not (out / "result.json").exists()
    kept = (out / "journal.jsonl").read_bytes() if (out / "journal.jsonl").exists() else b""

    result = _finish_run(campaign, out, jax_cache)
    assert (out / "journal.jsonl").read_bytes().startswith(kept)
    rows = [r for r in _records(out) if r["type"] == "measurement"]
    cells = [json.dumps(r["cell"], sort_keys=True) for r in rows]
    assert rows and len(cells) == len(set(cells)) == len(result["measured"])
    assert all(r["row"]["config"] == "1p1d" and r["row"]["failure"] == "" and r["row"]["tp"] == 2 for r in rows)
    assert _servers(marker) == {}
