"""The launcher, for real: the fake server as the command, start → ready → tear-down, and failures."""

from __future__ import annotations

import sys
import time

import pytest

from fleetsieve_bayes.backends.failures import (
    STARTUP_EXIT,
    STARTUP_OOM,
    STARTUP_TIMEOUT,
    classify_run,
    classify_startup,
    memory_guard,
)
from fleetsieve_bayes.backends.server import (
    DEFAULT_COMMAND,
    free_port,
    group_members,
    log_tail,
    probe,
    render_command,
    start_server,
    stop_server,
    wait_ready,
)
from fleetsieve_bayes.testing import fake_server_command

_LAUNCHED: list[int] = []


def _launch(tmp_path, *flags: str):
    port = free_port()
    cmd = render_command(fake_server_command(*flags), model="m", tp=1, port=port)
    h = start_server(cmd, port=port, log_path=tmp_path / f"{port}.log")
    _LAUNCHED.append(h.pgid)
    return h


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_start_ready_and_teardown_leaves_no_orphan(tmp_path) -> None:
    h = _launch(tmp_path, "--spawn-worker", "--startup-delay", "0.5")
    try:
        assert probe(h.url + "/health") in (None, 503)  # not ready yet
        ready = wait_ready(h, 20.0)
        assert ready.status == "ready" and ready.waited_s >= 0.4
        members = group_members(h.pgid)
        assert h.proc.pid in members and len(members) >= 2  # the server and its worker
        assert h.url.startswith("http://127.0.0.1:")
    finally:
        left = stop_server(h, grace_s=5.0)
    assert left == set() and group_members(h.pgid) == set()
    assert not any(_alive(p) for p in members)
    assert probe(h.url + "/health", timeout_s=0.5) is None  # the port is closed


def test_sigterm_ignored_escalates_to_sigkill(tmp_path) -> None:
    h = _launch(tmp_path, "--ignore-sigterm", "--spawn-worker")
    assert wait_ready(h, 20.0).status == "ready"
    t = time.monotonic()
    left = stop_server(h, grace_s=0.5)
    assert left == set() and time.monotonic() - t >= 0.5
    assert h.proc.returncode == -9


def test_server_that_dies_at_start_fails_fast(tmp_path) -> None:
    h = _launch(tmp_path, "--die-at-start", "--spawn-worker")
    ready = wait_ready(h, 60.0)
    assert ready.status == "exited" and ready.returncode == 1  # not "timeout": it did not wait the 60 s
    assert classify_startup(ready.status, log_tail(h.log_path)) == STARTUP_EXIT
    assert stop_server(h, grace_s=2.0) == set()  # the worker it left is stopped too


def test_oom_at_start_is_classified(tmp_path) -> None:
    h = _launch(tmp_path, "--oom-at-start")
    ready = wait_ready(h, 60.0)
    assert ready.status == "exited"
    assert classify_startup(ready.status, log_tail(h.log_path)) == STARTUP_OOM
    assert stop_server(h, grace_s=2.0) == set()


def test_never_healthy_times_out(tmp_path) -> None:
    h = _launch(tmp_path, "--never-healthy")
    try:
        ready = wait_ready(h, 1.5)
        assert ready.status == "timeout" and ready.waited_s >= 1.5
        assert classify_startup(ready.status, log_tail(h.log_path)) == STARTUP_TIMEOUT
    finally:
        assert stop_server(h, grace_s=5.0) == set()


def test_gpu_pool_is_passed_as_cuda_visible_devices(tmp_path) -> None:
    out = tmp_path / "env.txt"
    code = "import os,sys; open(sys.argv[1],'w').write(os.environ['CUDA_VISIBLE_DEVICES'] + ' ' + os.environ['X'])"
    h = start_server([sys.executable, "-c", code, str(out)], port=0, log_path=tmp_path / "l.log",
                     gpus=[3, 5], env={"X": "y"})
    h.proc.wait(timeout=20)
    assert out.read_text() == "3,5 y"
    assert stop_server(h, grace_s=1.0) == set()


def test_render_command() -> None:
    assert render_command(DEFAULT_COMMAND, model="/m/x", tp=4, port=8001) == [
        "vllm", "serve", "/m/x", "--tensor-parallel-size", "4", "--port", "8001", "--seed", "0"]
    # Only the three placeholders are filled; JSON braces pass through untouched.
    assert render_command(["--port={port}", '{"level": 3}'], model="m", tp=1, port=7) == ["--port=7", '{"level": 3}']
    with pytest.raises(ValueError, match=r"\{prot\}"):
        render_command(["--port", "{prot}"], model="m", tp=1, port=7)


def test_classify_run() -> None:
    assert classify_run(server_died=True, n_window=10, n_error=0, n_ok=10) == "died-mid-run"
    assert classify_run(server_died=False, n_window=100, n_error=2, n_ok=98) == ""
    assert classify_run(server_died=False, n_window=100, n_error=100, n_ok=0) == "request-errors"


def test_memory_guard_known_answers() -> None:
    # 140 GB of weights on 80 GB GPUs at 0.9 utilisation (72 GB usable), 10 GB KV cache minimum.
    kw = dict(model_size_gb=140.0, gpu_memory_gb=80.0, kv_cache_gb_min=10.0, gpu_memory_utilization=0.9)
    assert "150.0 GB > 72.0 GB" in memory_guard(1, **kw)
    assert "80.0 GB > 72.0 GB" in memory_guard(2, **kw)  # 70 + 10
    assert memory_guard(4, **kw) is None  # 35 + 10 = 45 <= 72
    assert memory_guard(1, model_size_gb=None, gpu_memory_gb=80.0) is None  # unknown size: measure


def test_no_stray_fake_servers_left(tmp_path) -> None:
    # Every server this module launched (this test's own at least) ran in its own session;
    # none of those is left. (Scoped to our own sessions: other test runs may share the machine.)
    h = _launch(tmp_path, "--spawn-worker")
    assert wait_ready(h, 20.0).status == "ready"
    assert stop_server(h, grace_s=5.0) == set()
    assert h.pgid in _LAUNCHED and all(group_members(pgid) == set() for pgid in _LAUNCHED)


def test_a_missing_executable_is_reported_before_anything_starts(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="no-such-server-xyz"):
        start_server(["no-such-server-xyz", "--port", "1"], port=1, log_path=tmp_path / "l.log")
    assert not (tmp_path / "l.log").exists()
