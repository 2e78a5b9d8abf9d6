"""A real Prometheus server for tests: the Debian ``prometheus`` binary on a loopback port.

:func:`running_prometheus` writes a scrape configuration (one job per class,
each target labelled ``class``, as ``plan`` writes ``launch/prometheus.yml``),
starts ``prometheus`` with a temporary data directory, waits for ``/-/ready``
and stops it on exit. It is never started as a system service. The binary is
``$FLEETSIEVE_PROMETHEUS`` or ``prometheus`` on ``PATH``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["prometheus_binary", "running_prometheus"]


def prometheus_binary() -> str | None:
    """Path of the Prometheus server binary, or None."""
    env = os.environ.get("FLEETSIEVE_PROMETHEUS")
    if env:
        return env if Path(env).is_file() else None
    return shutil.which("prometheus")


def _config(targets: dict[str, list[str]], scrape_interval_s: float) -> str:
    lines = ["global:", f"  scrape_interval: {scrape_interval_s:g}s", f"  evaluation_interval: {scrape_interval_s:g}s",
             "scrape_configs:"]
    for cls, hosts in targets.items():
        lines += [f"  - job_name: {json.dumps('vllm-' + cls)}", "    static_configs:",
                  f"      - targets: {json.dumps(hosts)}", "        labels:", f"          class: {json.dumps(cls)}"]
    return "\n".join(lines) + "\n"


@contextmanager
def running_prometheus(targets: dict[str, list[str]], *, scrape_interval_s: float = 1.0,
                       ready_timeout_s: float = 60.0) -> Iterator[str]:
    """Start Prometheus scraping ``targets`` (class → ``host:port`` list); yield its base URL.

    Raises:
        RuntimeError: no binary, or it never became ready (its log tail in the message).
    """
    from fleetsieve_bayes.backends.server import free_port

    binary = prometheus_binary()
    if binary is None:
        raise RuntimeError("no prometheus binary (apt-get install prometheus, or set FLEETSIEVE_PROMETHEUS)")
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "prometheus.yml"
        cfg.write_text(_config(targets, scrape_interval_s))
        log = open(Path(tmp) / "prometheus.log", "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [binary, f"--config.file={cfg}", f"--storage.tsdb.path={Path(tmp) / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + ready_timeout_s
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"prometheus exited {proc.returncode}: "
                                       f"{(Path(tmp) / 'prometheus.log').read_text()[-800:]}")
                try:
                    with urllib.request.urlopen(url + "/-/ready", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"prometheus not ready after {ready_timeout_s:g} s")
                time.sleep(0.2)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
