"""``phaseroute sim fuzz`` (deterministic simulation testing of the control core over many seeds)
and ``phaseroute sim tick-bench`` (what one tick of the core costs with many requests waiting).

Each seed is a whole test case (jobs, fleet, faults, restarts); a failing seed prints the
invariant it broke and the shortest event log that reproduces it (``phaseroute.sim.dst``).
"""

from __future__ import annotations

import json
import time

import typer


def fuzz(
    seeds: int = typer.Option(100, "--seeds", help="How many seeds to run."),
    start: int = typer.Option(1000, "--start", help="The first seed (the test suite runs 0-25)."),
    jobs: int = typer.Option(40, "--jobs", help="Jobs per seed."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> None:
    """Run the control core through SEEDS seeded fault-injecting simulations; exit 1 on a violation."""
    from phaseroute.sim.dst import SeedFailure, run_seed

    t0, outcomes, failures = time.perf_counter(), [], []
    for seed in range(start, start + seeds):
        try:
            outcome = run_seed(seed, jobs=jobs)
            outcomes.append(outcome)
            if not as_json:
                typer.echo(f"seed {seed}: ok ({outcome.requests} requests, {outcome.restarts} restarts, "
                           f"{outcome.counts.get('pool_losses', 0)} pool losses)", err=True)
        except SeedFailure as failure:
            failures.append(failure)
            typer.echo(str(failure), err=True)
    doc = {"seeds": seeds, "start": start, "requests": sum(o.requests for o in outcomes),
           "restarts": sum(o.restarts for o in outcomes), "wall_s": round(time.perf_counter() - t0, 1),
           "failures": [{"seed": f.seed, "invariant": f.violation.invariant, "detail": f.violation.detail,
                         "shortest_log_events": len(f.shortest) if f.shortest else None} for f in failures]}
    if as_json:
        print(json.dumps(doc, indent=2))
    else:
        typer.echo(f"{seeds - len(failures)}/{seeds} seeds held every invariant ({doc['requests']} requests, "
                   f"{doc['restarts']} restarts) in {doc['wall_s']} s", err=True)
    if failures:
        raise typer.Exit(1)


def tick_bench(
    queued: int = typer.Option(100_000, "--queued", help="Requests waiting in the fair queues."),
    ticks: int = typer.Option(1000, "--ticks", help="Ticks timed."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> None:
    """Time the control core's tick with QUEUED requests waiting, and with 1,000 (a fake fleet)."""
    from phaseroute.sim.tick_bench import bench

    doc = bench(queued, ticks)
    if as_json:
        print(json.dumps(doc, indent=2))
        return
    for row in (doc["queued"], doc["thousand_queued"]):
        typer.echo(f"{row['queued_at_start']:>7} waiting: tick p50 {row['tick_ms_p50']} ms, p99 {row['tick_ms_p99']} ms "
                   f"(outside the router p99 {row['outside_router_ms_p99']} ms; {row['dispatches_per_tick']} "
                   f"dispatches per tick at {row['router_us_per_dispatch']} us each)")
