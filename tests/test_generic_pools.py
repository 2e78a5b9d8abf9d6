"""The shipped ``generic`` card on a fleet of two GPU types (H100 and A100).

The table: one class, 12 req/s, TTFT ≤ 2 s; on each type TP1 and TP2 at three loads, the
third past the knee (TTFT ≥ 3.5 s). Admissible per replica: H100 TP1@L2 3.95 req/s, TP2@L2
7.9, A100 TP1@L2 1.98, TP2@L2 3.96 (and the lighter L1s). Serving all 12 req/s costs, at
$4.50 per H100-hour and $2.00 per A100-hour: H100 TP1 ×4 or TP2 ×2 (4 GPUs) $18/h, A100
TP2 ×4 (8 GPUs) $16/h, A100 TP1 ×7 (6 × 1.98 = 11.88 falls short) $14/h — the cheapest.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetsieve_bayes.cli import main
from fleetsieve_bayes.model.gpu_axis import axis_from_card
from fleetsieve_bayes.model.priors import load_card

ROWS = """workload,tp,load,offered_rps,throughput_rps,ttft_p99_s,completion_p99_s,success_rate,duration_s,gpu
chat,1,L1,2.0,2.0,0.3,8.0,0.999,300,h100-sxm-80gb
chat,1,L2,4.0,3.95,0.5,9.5,0.998,300,h100-sxm-80gb
chat,1,L3,8.0,5.9,4.0,30.0,0.99,300,h100-sxm-80gb
chat,2,L1,4.0,4.0,0.25,7.0,0.999,300,h100-sxm-80gb
chat,2,L2,8.0,7.9,0.4,8.5,0.998,300,h100-sxm-80gb
chat,2,L3,16.0,13.5,3.5,28.0,0.99,300,h100-sxm-80gb
chat,1,L1,1.0,1.0,0.5,11.0,0.999,300,a100-80gb
chat,1,L2,2.0,1.98,0.8,13.0,0.998,300,a100-80gb
chat,1,L3,4.0,2.9,5.0,40.0,0.99,300,a100-80gb
chat,2,L1,2.0,2.0,0.4,10.0,0.999,300,a100-80gb
chat,2,L2,4.0,3.96,0.7,12.0,0.998,300,a100-80gb
chat,2,L3,8.0,6.5,4.5,36.0,0.99,300,a100-80gb
"""

CAMPAIGN = """name = "generic-two-pools"

[fleet]

[[fleet.pools]]
gpu = "h100-sxm-80gb"
count = 8
usd_per_gpu_hour = 4.5

[[fleet.pools]]
gpu = "a100-80gb"
count = 8
usd_per_gpu_hour = 2.0

[model]
family = "FAMILY"

[measurement]
backend = "replay"
table = "grid.csv"

[stopping]
slo_attainment = "point"

[[workloads]]
name = "chat"
demand_rps = 12.0
slo = { success_min = 0.99, ttft_p99_s = 2.0, completion_p99_s = 30.0 }
"""

CHEAPEST = {"chat": {"tp": 1, "load": "L2", "replicas": 7, "gpu": "a100-80gb"}}


def _files(tmp: Path, family: str = "generic") -> Path:
    (tmp / "grid.csv").write_text(ROWS)
    path = tmp / "campaign.toml"
    path.write_text(CAMPAIGN.replace("FAMILY", family))
    return path


def test_the_generic_card_relates_every_shipped_gpu_type() -> None:
    axis = axis_from_card(load_card("generic"))
    assert axis is not None and axis.reference == "h100-sxm-80gb"
    assert axis.gpus == ("h100-sxm-80gb", "h200-141gb", "a100-80gb", "l40s-48gb") and axis.tps == (1, 2, 4, 8)
    a100 = axis.row("a100-80gb")
    # Capacity and completion by HBM bandwidth (2.039 / 3.35 TB/s), TTFT by BF16 FLOP/s (989 / 312).
    assert list(axis.log_capacity[a100]) == [-0.4965] * 4
    assert list(axis.log_completion[a100]) == [0.4965] * 4
    assert list(axis.log_ttft[a100]) == [1.1537] * 4


def test_allocate_picks_the_hand_solved_cheapest_fleet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _files(tmp_path)
    assert main(["allocate", str(path), "--table", str(tmp_path / "grid.csv"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["allocation"] == CHEAPEST
    assert out["objective"] == {"min_fulfillment": 1.0, "goodput_rps": 12.0, "gpus_used": 7, "usd_per_hour": 14.0}


def test_a_replayed_generic_campaign_on_two_pools_certifies_the_cheapest_fleet(tmp_path: Path) -> None:
    path = _files(tmp_path)
    out = tmp_path / "run"
    assert main(["run", str(path), "--out", str(out), "--quiet"]) == 0
    r = json.loads((out / "result.json").read_text())
    assert r["status"] == "certified-feasible"
    assert r["allocation"] == CHEAPEST
    assert (r["objective"]["usd_per_hour"], r["gpu_seconds"]) == (14.0, 3000.0)
    assert {"workload": "chat", "tp": 1, "load": "L2", "gpu": "a100-80gb", "replicate": 0} in r["measured"]


def test_a_card_without_the_gpu_axis_gets_one_line_saying_how_to_add_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _files(tmp_path, family="dense-31b-fp8-h100")
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"fleetsieve-bayes run: error: {path}: [model] family: the prior card dense-31b-fp8-h100 has no [gpu_axis] "
        f"section, which a fleet of 2 GPU types needs (write one with `priors derive --also-gpus`)\n"
    )


def test_a_pool_off_the_cards_axis_gets_one_line_saying_how_to_add_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    card = tmp_path / "mine.toml"
    generic = (Path(load_card("generic").path)).read_text()
    card.write_text(generic.replace('gpus = ["h100-sxm-80gb", "h200-141gb", "a100-80gb", "l40s-48gb"]',
                                    'gpus = ["h100-sxm-80gb", "h200-141gb", "l40s-48gb", "l4-24gb"]'))
    path = _files(tmp_path, family="mine.toml")
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert capsys.readouterr().err == (
        f"fleetsieve-bayes run: error: {path}: [[fleet.pools]] #2 gpu: 'a100-80gb' is not on the prior card's GPU "
        f"axis (h100-sxm-80gb, h200-141gb, l40s-48gb, l4-24gb); add a row for it to the card's [gpu_axis] "
        f"(`priors derive --also-gpus`)\n"
    )
