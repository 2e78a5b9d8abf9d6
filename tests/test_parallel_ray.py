"""The Ray executor for real: a local Ray with 16 logical GPUs, replayed cells that take time.

``[measurement] time_scale`` makes each replayed cell sleep ``duration_s ×
time_scale`` (300 s → 0.6 s), so cells overlap in real time and Ray's
placement (``num_gpus = tp``) does the packing. One Ray instance serves the
module (Ray's start-up is slow on small machines).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import ray  # the `ray` extra, also part of `test` (pyproject.toml): never skipped
from shipped import point_text

from fleetsieve_bayes.campaign.config import load_campaign
from fleetsieve_bayes.campaign.makespan import in_flight_cells
from fleetsieve_bayes.campaign.runner import run_campaign
from fleetsieve_bayes.errors import MeasurementError
from fleetsieve_bayes.resources import data_dir

SHIPPED = data_dir("examples") / "h100_31b_fp8" / "campaign.toml"
GRID = SHIPPED.parent / "grid.csv"
ORACLE = {"chat": {"tp": 4, "load": "C96", "replicas": 2}, "code": {"tp": 4, "load": "C96", "replicas": 2}}
POOLS = Path(__file__).resolve().parent / "fixtures" / "pools"
H100, A100 = "h100-sxm-80gb", "a100-80gb"


@pytest.fixture(scope="module")
def local_ray() -> Any:
    # 16 GPUs, advertised as 8 of each of two types (for the campaign over two pools).
    ray.init(num_cpus=2, num_gpus=16, resources={H100: 8, A100: 8}, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


def ray_campaign(tmp: Path, table: Path) -> Path:
    text = point_text().replace(
        'table = "grid.csv"', f'table = "{table}"\npool_gpus = 16\nexecutor = "ray"\ntime_scale = 0.002'
    )
    p = tmp / "ray.toml"
    p.write_text(text)
    return p


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "journal.jsonl").read_text().splitlines()]


def _peak(recs: list[dict[str, Any]]) -> tuple[int, int]:
    """(peak GPUs in use, peak cells in flight) from the started/finished records."""
    events = [(r["start_s"], 1, len(r["gpus"])) for r in recs if r["type"] == "started"]
    events += [(r["finish_s"], 0, -len(r["gpus"])) for r in recs if r["type"] in ("finished", "cancelled", "failed")]
    used = cells = peak = peak_cells = 0
    for _, _, d in sorted(events):
        used += d
        cells += 1 if d > 0 else -1
        peak, peak_cells = max(peak, used), max(peak_cells, cells)
    return peak, peak_cells


def test_ray_runs_cells_side_by_side_on_their_gpus(local_ray: Any, tmp_path: Path) -> None:
    table = GRID
    out = tmp_path / "out"
    r = run_campaign(load_campaign(ray_campaign(tmp_path, table)), out).result
    assert r["status"] == "certified-feasible" and r["allocation"] == ORACLE
    assert r["pool"]["executor"] == "ray" and r["pool"]["clock"] == "real"
    recs = _records(out)
    peak, peak_cells = _peak(recs)
    assert peak <= 16 and peak_cells >= 3
    # Ray gave each task as many devices as its TP, on its node.
    for f in (x for x in recs if x["type"] == "finished"):
        assert len(f["where"]["device_ids"]) == f["cell"]["tp"]
    # Overlapping cells: the profiling wall clock (the union of the cells' intervals, from
    # start to finish) is under the sum of those intervals. (Not under the sum of the
    # measurements' own wall_s: on a crowded machine a task waits for a Ray worker.)
    finish = {json.dumps(x["cell"]): x["finish_s"] for x in recs if x["type"] in ("finished", "cancelled", "failed")}
    spans = [finish[json.dumps(x["cell"])] - x["start_s"] for x in recs if x["type"] == "started"]
    assert r["profiling_wall_s"] < sum(spans)


@pytest.mark.slow  # a second Ray campaign; test_ray_runs_cells_side_by_side_on_their_gpus keeps Ray in the default suite
def test_a_failing_task_keeps_the_others_and_resume_re_runs_it(local_ray: Any, tmp_path: Path) -> None:
    table = tmp_path / "grid.csv"
    shutil.copy(GRID, table)
    camp = load_campaign(ray_campaign(tmp_path, table))
    out = tmp_path / "out"
    hidden = tmp_path / "grid.hidden"

    def break_the_table(kind: str, info: dict[str, Any]) -> None:
        # After the first completion, cells that start next cannot read their table: their task fails.
        if kind == "measure-done" and table.exists():
            table.rename(hidden)

    with pytest.raises(MeasurementError, match=r"cell .* resume"):
        run_campaign(camp, out, on_event=break_the_table)
    recs = _records(out)
    failed = [r for r in recs if r["type"] == "failed"]
    assert failed and "grid.csv" in failed[0]["error"]
    key = lambda c: json.dumps(c, sort_keys=True)  # noqa: E731
    measured = {key(r["cell"]) for r in recs if r["type"] == "measurement"}
    started = {key(r["cell"]) for r in recs if r["type"] == "started"}
    # Every cell in flight when the first one failed was awaited: measured, or failed itself.
    assert measured and started == measured | {key(r["cell"]) for r in failed}
    unfinished = in_flight_cells(recs)
    assert unfinished and {json.dumps(r["cell"]) for r in unfinished} >= {json.dumps(failed[0]["cell"])}

    hidden.rename(table)
    r = run_campaign(camp, out).result
    assert r["status"] == "certified-feasible" and r["allocation"] == ORACLE
    recs = _records(out)
    cells = [json.dumps(m["cell"], sort_keys=True) for m in recs if m["type"] == "measurement"]
    assert len(cells) == len(set(cells))  # nothing measured twice
    assert failed[0]["cell"] in [m["cell"] for m in recs if m["type"] == "measurement"]
    assert any(x.get("resumed") for x in recs if x["type"] == "started")
    assert in_flight_cells(recs) == []


@pytest.mark.slow  # a third Ray campaign; the per-type slots are in the default suite (test_vllm_pools.py)
def test_over_two_pools_each_task_asks_for_its_gpu_type(local_ray: Any, tmp_path: Path) -> None:
    text = (POOLS / "run.toml").read_text().replace(
        'table = "grid.csv"',
        f'table = "{POOLS / "grid.csv"}"\npool_gpus = {{ {H100} = 8, A100-80GB = 8 }}\nexecutor = "ray"\n'
        "time_scale = 0.002",
    ).replace('family = "card-h100-a100.toml"', f'family = "{POOLS / "card-h100-a100.toml"}"')
    text = text.replace("[stopping]\n", "[stopping]\nmax_rounds = 3\n", 1)
    (tmp_path / "pools.toml").write_text(text)
    out = tmp_path / "out"
    r = run_campaign(load_campaign(tmp_path / "pools.toml"), out).result
    assert r["pool"]["pool_gpus"] == 16 and r["pool"]["pool_gpus_by_gpu"] == {H100: 8, A100: 8}
    recs = _records(out)
    finished = [x for x in recs if x["type"] == "finished"]
    assert {x["cell"]["gpu"] for x in finished} == {H100, A100}
    # Ray placed each task on its type: it holds `tp` of its type's resource and `tp` devices.
    for f in finished:
        assert f["where"]["resources"] == {f["cell"]["gpu"]: float(f["cell"]["tp"])}
        assert len(f["where"]["device_ids"]) == f["cell"]["tp"]
    for gpu, n in ((H100, 8), (A100, 8)):
        mine = [x for x in recs if x.get("cell", {}).get("gpu") == gpu]
        assert _peak(mine)[0] <= n
