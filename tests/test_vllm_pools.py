"""The vLLM backend over several ``[[fleet.pools]]``: the grid and its order, ``[measurement]
gpus`` as a table per pool (each error one line naming the key), each cell launched on its
pool's devices, reuse within (pool, TP), the per-pool memory guard, the load-time refusal
of the parallel driver, and a whole campaign over two pools against the fake server."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fake_vllm import fake_vllm_campaign

from fleetsieve_bayes.allocation.problem import DEFAULT_POOL, grid_from_table
from fleetsieve_bayes.backends import make_backend
from fleetsieve_bayes.backends.server import group_members
from fleetsieve_bayes.backends.vllm import parse_vllm_options
from fleetsieve_bayes.campaign.config import Campaign
from fleetsieve_bayes.errors import InputError, MeasurementError
from fleetsieve_bayes.resources import data_dir
from fleetsieve_bayes.table import COLUMNS, read_table, validate_table
from fleetsieve_bayes.testing import fake_server_command

H100, A100 = "h100-sxm-80gb", "a100-80gb"
TWO_POOLS = f"""[[fleet.pools]]
gpu = "{H100}"
count = 4
usd_per_gpu_hour = 4.0

[[fleet.pools]]
gpu = "A100-80GB"
count = 4
usd_per_gpu_hour = 1.8
"""
GPUS = f"gpus = {{ {H100} = [0, 1], a100-80gb = [2, 3] }}"
# The server's command, wrapped so that its log starts with the devices it was given.
SHOW_DEVICES = ["sh", "-c", 'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; exec "$@"', "sh"]
# ... and a server on devices 2, 3 (the A100 pool) is a slower GPU: 0.2 s per prompt token,
# so its TTFT p99 (8 tokens: 1.6 s) misses the 1 s SLO.
SLOW_A100 = ["sh", "-c", 'echo "CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES"; case "$CUDA_VISIBLE_DEVICES" in '
             '2*) exec "$@" --prefill-delay-per-token 0.2;; *) exec "$@";; esac', "sh"]


def _campaign(tmp_path: Path, *, fleet: str = TWO_POOLS, gpus: str = GPUS, extra: str = "",
              workloads: tuple[str, ...] = ("chat",), loads: str = "{ low = 1.0, high = 3.0 }",
              family: str = "generic", stopping: str = "", wrapper: tuple[str, ...] = tuple(SHOW_DEVICES)) -> Campaign:
    server = fake_server_command("--slots", "2", "--token-delay", "0.01", "--tp-speedup", "1", "--tp-slots")
    return fake_vllm_campaign(tmp_path, [*wrapper, *server], name="fake-pools", fleet=fleet, gpus=gpus, loads=loads,
                              family=family, extra=extra, stopping=stopping, workloads=workloads)


def _devices_in_log(log: Path) -> str:
    m = re.search(r"^CUDA_VISIBLE_DEVICES=(.*)$", log.read_text(), re.MULTILINE)
    assert m is not None, log.read_text()
    return m.group(1)


def _leftovers() -> list[int]:
    """Live process groups started by this process (servers), the lifeline watchdog excepted."""
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


# --- the grid -----------------------------------------------------------------------


def test_grid_is_workload_pool_tp_load_in_the_order_of_grid_from_table(tmp_path: Path) -> None:
    c = _campaign(tmp_path, workloads=("chat", "code"), loads="{ high = 3.0, low = 1.0, mid = 2.0 }")
    g = make_backend(c, tmp_path / "out").grid
    assert g.pools == c.pool_names == (H100, A100) and g.n_cells == 2 * 2 * 2 * 3
    assert [g.key(i) for i in range(7)] == [
        ("chat", 1, "low", H100), ("chat", 1, "mid", H100), ("chat", 1, "high", H100),
        ("chat", 2, "low", H100), ("chat", 2, "mid", H100), ("chat", 2, "high", H100),
        ("chat", 1, "low", A100),
    ]
    assert g.key(12)[0] == "code" and g.describe(12) == f"code TP1@low on {H100}"
    # The same cells as a table, rows reversed: grid_from_table sorts them into the same grid.
    rows = [{"workload": g.key(i)[0], "tp": g.key(i)[1], "load": g.key(i)[2], "gpu": g.key(i)[3],
             "offered_rps": g.offered_rps[i], "throughput_rps": 1.0, "ttft_p99_s": 0.1, "completion_p99_s": 0.2,
             "success_rate": 1.0, "duration_s": g.duration_s[i]} for i in range(g.n_cells)][::-1]
    t = grid_from_table(validate_table(pd.DataFrame(rows)), c.workload_names, pools=c.pool_names)
    assert [t.key(i) for i in range(t.n_cells)] == [g.key(i) for i in range(g.n_cells)]
    np.testing.assert_array_equal(t.gpu, g.gpu)
    np.testing.assert_array_equal(t.offered_rps, g.offered_rps)
    np.testing.assert_array_equal(t.tp, g.tp)


@pytest.mark.parametrize("fleet", ["gpus = 4", TWO_POOLS.split("\n[[fleet.pools]]")[0]])
def test_one_pool_is_todays_grid(tmp_path: Path, fleet: str) -> None:
    g = make_backend(_campaign(tmp_path, fleet=fleet, gpus="gpus = [0, 1]"), tmp_path / "out").grid
    assert g.gpu is None and g.pools == (DEFAULT_POOL,) and g.n_cells == 4
    assert [g.key(i) for i in range(4)] == [("chat", 1, "low"), ("chat", 1, "high"), ("chat", 2, "low"),
                                            ("chat", 2, "high")]


# --- [measurement] gpus -------------------------------------------------------------


@pytest.mark.parametrize(
    ("gpus", "key", "message"),
    [
        (f"gpus = {{ {H100} = [0, 1] }}", f"gpus.{A100}",
         f"missing: pool '{A100}' has no device ids (one entry per [[fleet.pools]])"),
        (f"gpus = {{ {H100} = [0, 1], a100 = [2, 3] }}", "gpus.a100",
         f"'a100' is not the GPU type of a [[fleet.pools]] entry (did you mean '{A100}'?); pools: {H100}, {A100}"),
        (f"gpus = {{ {H100} = [0, 1], A100-80gb = [2, 3], a100-80GB = [4, 5] }}", "gpus.a100-80GB",
         f"pool '{A100}' is given twice"),
        (f'gpus = {{ {H100} = [0, 1], {A100} = [2, "3"] }}', f"gpus.{A100}",
         "expected a non-empty list of GPU ids (integers >= 0), got [2, '3']"),
        (f"gpus = {{ {H100} = [0, 1], {A100} = [2, -3] }}", f"gpus.{A100}",
         "expected a non-empty list of GPU ids (integers >= 0), got [2, -3]"),
        (f"gpus = {{ {H100} = [0, 1], {A100} = [] }}", f"gpus.{A100}",
         "expected a non-empty list of GPU ids (integers >= 0), got []"),
        (f"gpus = {{ {H100} = [0, 1], {A100} = [2, 2] }}", f"gpus.{A100}", "device 2 is listed twice"),
        (f"gpus = {{ {H100} = [0, 1], {A100} = [1, 2] }}", f"gpus.{A100}",
         f"device 1 is also in pool '{H100}' (a device belongs to one pool)"),
        (f"gpus = {{ {H100} = [0, 1], {A100} = [2] }}", f"gpus.{A100}",
         f"TP2 needs 2 GPUs but pool '{A100}' has 1"),
        ("gpus = [0, 1]", "gpus",
         f"expected a table GPU type = device ids, one entry per [[fleet.pools]] ({H100}, {A100}), "
         f"e.g. {{ {H100} = [0], {A100} = [1] }}; got [0, 1]"),
        ("", "gpus",
         f"missing: the campaign has 2 [[fleet.pools]]; give each pool's device ids on this node, "
         f"e.g. gpus = {{ {H100} = [0], {A100} = [1] }}"),
    ],
)
def test_gpus_table_errors_name_the_key(tmp_path: Path, gpus: str, key: str, message: str) -> None:
    c = _campaign(tmp_path, gpus=gpus)
    with pytest.raises(InputError) as err:
        parse_vllm_options(c)
    assert str(err.value) == f"{c.path}: [measurement] {key}: {message}"


@pytest.mark.parametrize("fleet", ["gpus = 4", TWO_POOLS.split("\n[[fleet.pools]]")[0]])
def test_a_table_without_several_pools_is_an_error(tmp_path: Path, fleet: str) -> None:
    c = _campaign(tmp_path, fleet=fleet, gpus=f"gpus = {{ {H100} = [0, 1] }}")
    with pytest.raises(InputError) as err:
        parse_vllm_options(c)
    assert str(err.value) == (f"{c.path}: [measurement] gpus: a table of GPU types needs two or more "
                              f"[[fleet.pools]]; expected a list of device ids, e.g. [0, 1], got {{'{H100}': [0, 1]}}")


def test_keys_match_the_pools_as_written_case_insensitively(tmp_path: Path) -> None:
    # Pool 2 is written "A100-80GB"; "H100-SXM-80GB" is pool 1's spec-table name in capitals.
    s = parse_vllm_options(_campaign(tmp_path, gpus="gpus = { a100-80GB = [5, 4], H100-SXM-80GB = [0, 1, 2] }"))
    assert s.pool_devices == ((0, 1, 2), (5, 4)) and s.gpus == (0, 1, 2, 5, 4)


@pytest.mark.parametrize(
    ("extra", "key", "message"),
    [
        ("pool_gpus = 4", "pool_gpus",
         f"a vLLM campaign of 2 [[fleet.pools]] needs the profiling GPUs of each type, e.g. "
         f"pool_gpus = {{ {H100} = 4, {A100} = 4 }}, got 4"),
        ('executor = "ray"', "pool_gpus",
         f"a vLLM campaign of 2 [[fleet.pools]] needs the profiling GPUs of each type, e.g. "
         f"pool_gpus = {{ {H100} = 4, {A100} = 4 }}"),
        (f"pool_gpus = {{ {H100} = 2 }}", f"pool_gpus.{A100}",
         f"missing: pool '{A100}' has no profiling GPUs (one entry per [[fleet.pools]])"),
        (f"pool_gpus = {{ {H100} = 2, a100-40gb = 2 }}", "pool_gpus.a100-40gb",
         f"'a100-40gb' is not the GPU type of a [[fleet.pools]] entry (did you mean '{A100}'?); pools: {H100}, {A100}"),
        (f"pool_gpus = {{ {H100} = 2, A100-80gb = 2, a100-80GB = 1 }}", "pool_gpus.a100-80GB",
         f"pool '{A100}' is given twice"),
        (f"pool_gpus = {{ {H100} = 2, {A100} = 0 }}", f"pool_gpus.{A100}", "must be >= 1, got 0"),
    ],
)
def test_the_parallel_driver_over_pools_is_checked_at_load(tmp_path: Path, extra: str, key: str, message: str) -> None:
    with pytest.raises(InputError) as err:
        _campaign(tmp_path, extra=extra)
    assert str(err.value) == f"{(tmp_path / 'campaign.toml').resolve()}: [measurement] {key}: {message}"
    # One pool in parallel stays allowed, and so does a count per GPU type (keys in any case).
    assert _campaign(tmp_path, fleet="gpus = 4", gpus="gpus = [0, 1, 2, 3]", extra="pool_gpus = 4").pool.parallel
    c = _campaign(tmp_path, extra=f"pool_gpus = {{ A100-80GB = 1, {H100.upper()} = 2 }}")
    assert (c.pool.per_gpu, c.pool.pool_gpus) == ((2, 1), 3)


def test_a_count_per_gpu_type_needs_several_pools(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        _campaign(tmp_path, fleet="gpus = 4", gpus="gpus = [0, 1]", extra=f"pool_gpus = {{ {H100} = 2 }}")
    assert str(err.value).endswith(
        f"[measurement] pool_gpus: a table of GPU types needs two or more [[fleet.pools]]; expected a count, "
        f"e.g. pool_gpus = 8, got {{'{H100}': 2}}")


# --- memory guard -------------------------------------------------------------------


def test_memory_guard_per_pool_from_the_gpu_spec(tmp_path: Path) -> None:
    fleet = TWO_POOLS.replace('gpu = "A100-80GB"', 'gpu = "l40s-48gb"')
    gpus = f"gpus = {{ {H100} = [0, 1], l40s-48gb = [2, 3] }}"
    # TP1 needs 60 + 5 GB: fits 0.9 × 80 (H100), not 0.9 × 48 (L40S); TP2 needs 35 GB, fits both.
    b = make_backend(_campaign(tmp_path, fleet=fleet, gpus=gpus, extra="model_size_gb = 60.0\nkv_cache_gb_min = 5.0"),
                     tmp_path / "out")
    idx = b.grid.index()
    row = b.preflight(idx[("chat", 1, "low", "l40s-48gb")])
    assert row is not None and row["failure"] == "memory-guard" and row["duration_s"] == 0.0
    assert row["gpu"] == "l40s-48gb" and "l40s-48gb: 48 GB per GPU" in row["detail"]
    validate_table(pd.DataFrame([{k: row[k] for k in (*COLUMNS, "failure", "gpu")}]))
    assert b.preflight(idx[("chat", 1, "low", H100)]) is None
    assert all(b.preflight(idx[("chat", 2, load, g)]) is None for load in ("low", "high") for g in (H100, "l40s-48gb"))
    assert b.measure(idx[("chat", 1, "high", "l40s-48gb")])["failure"] == "memory-guard"  # nothing launched
    assert not (tmp_path / "out").exists()
    # gpu_memory_gb given: today's guard, that memory on every pool (0.9 × 48 GB: TP1 skipped, TP2 fits).
    b2 = make_backend(_campaign(tmp_path, fleet=fleet, gpus=gpus,
                                extra="model_size_gb = 60.0\nkv_cache_gb_min = 5.0\ngpu_memory_gb = 48.0"),
                      tmp_path / "out")
    i2 = b2.grid.index()
    assert all(b2.preflight(i2[("chat", 1, "low", g)]) is not None for g in (H100, "l40s-48gb"))
    assert all(b2.preflight(i2[("chat", 2, "low", g)]) is None for g in (H100, "l40s-48gb"))


# --- measuring ----------------------------------------------------------------------


def test_cells_run_on_their_pools_devices_and_reuse_only_within_pool_and_tp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    b = make_backend(_campaign(tmp_path), out)
    idx = b.grid.index()
    order = [("chat", 1, "low", H100), ("chat", 1, "high", H100), ("chat", 1, "low", A100),
             ("chat", 1, "high", A100), ("chat", 2, "low", A100)]
    try:
        rows = [b.measure(idx[k]) for k in order]
    finally:
        import fleetsieve_bayes.backends.vllm as vllm

        real_stop = vllm.stop_server
        # The last server is stopped for real, then reported as having left a process behind.
        monkeypatch.setattr(vllm, "stop_server", lambda h, grace_s: (real_stop(h, grace_s=grace_s), {4242})[1])
        with pytest.raises(MeasurementError) as err:
            b.close()
    assert f"(TP2 on {A100}): processes [4242] survived SIGKILL (GPUs [2, 3] may still be held)" in str(err.value)
    assert all(r["failure"] == "" and r["success_rate"] == 1.0 for r in rows)
    assert [r["gpu"] for r in rows] == [H100, H100, A100, A100, A100]
    assert [(r["workload"], r["tp"], r["load"], r["gpu"]) for r in rows] == order
    # Same pool and TP: reused; the other pool at the same TP, or another TP: a new server.
    assert [r["startup_s"] > 0 for r in rows] == [True, False, True, False, True]
    logs = {re.sub(r"_\d{8}T\d{6}.*$", "", p.name): _devices_in_log(p) for p in (out / "logs").glob("*.log")}
    assert logs == {f"chat_{H100}_tp1_low": "0", f"chat_{A100}_tp1_low": "2", f"chat_{A100}_tp2_low": "2,3"}
    rec = pd.read_parquet(next((out / "raw").glob(f"chat_{A100}_tp2_low_*.parquet")))
    assert set(rec["gpu"]) == {A100} and set(rec["tp"]) == {2}
    df = validate_table(pd.DataFrame([{k: r[k] for k in (*COLUMNS, "failure", "startup_s", "gpu")} for r in rows]))
    assert list(df["gpu"]) == [H100, H100, A100, A100, A100]
    assert _leftovers() == []


# --- a whole campaign ----------------------------------------------------------------


@pytest.mark.parametrize("pool_gpus", ["", f"pool_gpus = {{ {H100} = 2, {A100} = 2 }}"], ids=["one-at-a-time", "parallel"])
def test_a_campaign_over_two_pools_measures_both(tmp_path: Path, pool_gpus: str) -> None:
    # `run_campaign` is what `fleetsieve-bayes run` calls once it has loaded the campaign.
    from fleetsieve_bayes.campaign.runner import run_campaign

    # The generic card with its GPU axis replaced: the A100 slower than the H100 (as the fake servers are).
    generic = (data_dir("priors") / "generic.toml").read_text()
    card = generic[: generic.index("[gpu_axis]")] + f"""
[gpu_axis]
reference = "{H100}"
gpus = ["{H100}", "{A100}"]
tp = [1, 2]
log_capacity = [[0.0, 0.0], [-0.5, -0.5]]
log_ttft = [[0.0, 0.0], [2.0, 2.0]]
log_completion = [[0.0, 0.0], [2.0, 2.0]]
"""
    (tmp_path / "card.toml").write_text(card)
    # Two rounds: the initial design (TP1 on the H100s, TP2 on the A100s) and the cells
    # acquisition picks next; no certification attempt (the certifying fit takes minutes on 2 cores).
    c = _campaign(tmp_path, family="card.toml", wrapper=tuple(SLOW_A100), extra=pool_gpus,
                  stopping='[stopping]\nslo_attainment = "point"\nmax_rounds = 2\n')
    out = tmp_path / "run"
    run_campaign(c, out)
    r = json.loads((out / "result.json").read_text())
    by = r["profiling_by_gpu"]
    assert set(by) == {H100, A100} and by[H100]["windows"] > 0 and by[A100]["windows"] > 0
    assert sum(v["windows"] for v in by.values()) == len(r["measured"])
    assert sum(v["gpu_seconds"] for v in by.values()) == pytest.approx(r["gpu_seconds"])
    measured = read_table(out / "measurements.csv")
    assert sorted(zip(measured["tp"], measured["load"], measured["gpu"], strict=True)) == sorted(
        (m["tp"], m["load"], m["gpu"]) for m in r["measured"])
    # Each pool's cells ran on its devices: the A100's servers were the slow ones.
    ttft = measured.groupby("gpu")["ttft_p99_s"]
    assert ttft.min()[A100] > 1.5 and ttft.max()[H100] < 0.5
    devices = {H100: "0,1", A100: "2,3"}
    launched = set()
    for log in (out / "logs").glob("*.log"):
        m = re.match(rf"chat_({H100}|{A100})_tp(\d)_", log.name)
        assert m is not None, log.name
        assert _devices_in_log(log) == devices[m.group(1)][: 2 * int(m.group(2)) - 1]
        launched.add((m.group(1), int(m.group(2))))
    assert launched == set(zip(measured["gpu"], measured["tp"], strict=True))
    assert _leftovers() == []
    if pool_gpus:
        # Each type's cells took slots of its own group (H100: 0-1, A100: 2-3), and a cell of
        # one type started while one of the other held its own pool's GPUs (the design's two
        # probes, one per type, run at once).
        assert r["pool"]["pool_gpus_by_gpu"] == {H100: 2, A100: 2}
        recs = [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]
        started = [x for x in recs if x["type"] == "started"]
        assert {x["cell"]["gpu"] for x in started} == {H100, A100}
        assert all(set(x["gpus"]) <= ({0, 1} if x["cell"]["gpu"] == H100 else {2, 3}) for x in started)
        key = ("workload", "tp", "load", "gpu")
        in_flight: list[dict] = []
        overlapped = False
        for x in recs:
            if x["type"] == "started":
                overlapped |= any(c["gpu"] != x["cell"]["gpu"] for c in in_flight)
                in_flight.append(x["cell"])
            elif x["type"] == "measurement":
                in_flight = [c for c in in_flight if any(c[k] != x["cell"][k] for k in key)]
        assert overlapped


def test_no_server_left_behind() -> None:
    # Sessions started by this process (fake servers of the tests above) are all gone.
    assert _leftovers() == []
