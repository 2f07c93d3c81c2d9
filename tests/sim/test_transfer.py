"""Transfer has a price: the fleet spec's transfer_usd_per_gb in the metrics, and in phaseroute's routing."""

from __future__ import annotations

import pytest

from phaseroute.sim.errors import SpecError
from phaseroute.sim.fleet import parse_fleet
from phaseroute.sim.runner import prepare, run_policy
from phaseroute.sim.scenarios import transfer_price

POOLS = [{"name": "l40s", "accelerator": "L40S", "count": 1, "models": ["llama-3.1-8b"]},
         {"name": "a10g", "accelerator": "A10G", "count": 2, "models": ["llama-3.1-8b"]},
         {"name": "t4", "accelerator": "T4", "count": 2, "models": ["llama-3.1-8b"]}]


def test_the_fleet_spec_carries_the_price_and_refuses_a_bad_one(sim_inputs):
    assert parse_fleet(sim_inputs.fleet()).transfer_usd_per_gb == 0.0
    assert parse_fleet(sim_inputs.fleet(transfer_usd_per_gb=0.02)).transfer_usd_per_gb == 0.02
    with pytest.raises(SpecError, match="transfer_usd_per_gb' must be >= 0, got -1"):
        parse_fleet(sim_inputs.fleet(transfer_usd_per_gb=-1))


def test_metrics_charge_the_kv_moved(sim_inputs):
    w, f, _ = prepare(sim_inputs.workload(max_requests=600), sim_inputs.fleet(transfer_usd_per_gb=0.05), load=0.7)
    _, m = run_policy(w, f, "split")                       # split always moves the KV
    assert m["kv_bytes_moved"] > 0 and m["colocated_share"] == 0.0
    assert m["transfer_cost_usd"] == pytest.approx(m["kv_bytes_moved"] / 1e9 * 0.05, abs=0.01)
    assert m["cost_usd"] == pytest.approx(m["rental_cost_usd"] + m["transfer_cost_usd"], abs=0.011)
    assert m["goodput_tokens_per_dollar"] == pytest.approx(m["deadline_met_tokens"] / m["cost_usd"], rel=1e-2)
    assert m["kv_bytes_per_delivered_token"] == pytest.approx(m["kv_bytes_moved"] / m["completed_tokens"], rel=1e-3)


def test_phaseroute_colocates_more_when_moving_kv_costs(sim_inputs):
    """Long Mooncake prompts on three generations: with moving KV at $1/GB phaseroute keeps more
    requests on one pool and moves less KV; jsq (always colocated) is unchanged."""
    w, f, _ = prepare(sim_inputs.workload(trace=sim_inputs.mooncake, max_requests=600),
                      parse_fleet(sim_inputs.fleet(pools=POOLS)), load=0.8)
    doc = transfer_price(w, f, ["phaseroute", "jsq"], 1.0)
    free, priced = doc["policies"]["phaseroute"]["free"], doc["policies"]["phaseroute"]["priced"]
    assert free["transfer_cost_usd"] == 0.0 and priced["transfer_cost_usd"] > 0.0
    assert priced["colocated_share"] > free["colocated_share"] + 0.03
    assert priced["kv_bytes_moved"] < 0.7 * free["kv_bytes_moved"]
    jsq = doc["policies"]["jsq"]
    assert jsq["free"] == jsq["priced"] and jsq["priced"]["colocated_share"] == 1.0
    with pytest.raises(ValueError, match="needs a price > 0"):
        transfer_price(w, f, ["jsq"], 0.0)



@pytest.mark.slow
def test_at_a_cloud_egress_price_phaseroute_moves_almost_no_kv_and_beats_the_baselines_per_dollar():
    """The bundled Mooncake trace on three generations at 0.9 load, moving KV at $0.02/GB: a long
    prompt's KV costs far more to move than its compute, so neither an exploration pick nor a
    traffic-share walk may buy a transfer (``RouterConfig.walk_transfer_share``). phaseroute then
    moves almost nothing, misses no more deadlines than free, and stays ahead of every baseline
    on goodput per dollar, transfer included (before the walk bound it moved ~11 kB per
    delivered token, paid more for transfer than for rent, and fell below jsq)."""
    w, f, _ = prepare("mooncake", "l40s-a10g-t4", load=0.9)
    doc = transfer_price(w, f, ["phaseroute", "static-spec", "jsq"], 0.02)
    runs = {name: doc["policies"][name]["priced"] for name in doc["policies"]}
    free, priced = doc["policies"]["phaseroute"]["free"], runs["phaseroute"]
    assert priced["kv_bytes_moved"] < 0.01 * free["kv_bytes_moved"], (free, priced)
    assert priced["transfer_cost_usd"] < 0.02 * priced["rental_cost_usd"]
    assert priced["miss_rate"] <= free["miss_rate"]
    best_baseline = max(runs[n]["goodput_tokens_per_dollar"] for n in ("static-spec", "jsq"))
    assert priced["goodput_tokens_per_dollar"] > 1.1 * best_baseline, runs
