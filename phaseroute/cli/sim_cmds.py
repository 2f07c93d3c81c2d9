"""``phaseroute sim`` (fleet simulator) and ``phaseroute plan`` (capacity planner).

Register in the main CLI with::

    from phaseroute.cli.sim_cmds import plan_app, sim_app
    app.add_typer(sim_app, name="sim")
    app.add_typer(plan_app, name="plan")

``phaseroute sim --workload W --fleet F [--policy all] [--load 0.7] --json`` prints one JSON
document: every policy's metrics and the LP bound. Subcommands: ``capacity`` (capacity at SLO
per policy and the bound, over seeds: the headline), ``report`` (capacity, load sweep,
scenarios, plots), ``scenario stale|loss|transfer``, ``drift`` (detection time of a lossy path
against the canary share), ``bench`` (1M requests on 1,000 accelerators), ``bench-bound``
(time of the LP bound at 2,000 jobs), ``calibrate`` (efficiency factors from measured
profiles). Every ``--json`` (and every command that only prints JSON) writes exactly one JSON
document to standard output; progress and solver output never go there (progress to standard
error, the solver's own lines nowhere: sim/solver_io.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import typer

from phaseroute.cli.common import json_stdout
from phaseroute.cli.fuzz_cmd import fuzz, tick_bench
from phaseroute.cli.sim_drift_cmd import drift
from phaseroute.sim.errors import SimError

if TYPE_CHECKING:
    from phaseroute.sim.capacity import CapacityOptions

sim_app = typer.Typer(help="Fleet simulator: the phaseroute policy at fleet scale, against baselines and an LP bound.",
                      invoke_without_command=True, add_completion=False)
plan_app = typer.Typer(help="Capacity planner: which accelerators, how many, at what cost, meet the deadlines.",
                       invoke_without_command=True, add_completion=False)

WORKLOAD_HELP = "Workload spec (YAML/JSON path) or a bundled name: azure-code, mooncake, bench-1m."
FLEET_HELP = "Fleet spec (YAML/JSON path) or a bundled name: h100-a100, l40s-a10g-t4, bench-1000."


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def _emit(doc: dict[str, Any], as_json: bool, human: Callable[[dict[str, Any]], None], emit: Callable[[object], None]) -> None:
    """``--json``: ``emit`` (from ``json_stdout``: one document on the real stdout, whatever a
    solver writes meanwhile goes to stderr); else the human form."""
    if as_json:
        emit(doc)
    else:
        human(doc)


def _print_summary(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{doc['workload']['name']} on {doc['fleet']['name']} (offered load {doc.get('offered_load')})")
    cols = ["policy", "goodput_tok_s", "vs_bound", "miss_rate", "cost_usd", "goodput_tokens_per_dollar", "kv_gb_moved", "wall_s"]
    for c in cols:
        table.add_column(c)
    for row in doc["summary"]:
        table.add_row(*["" if row.get(c) is None else str(row.get(c)) for c in cols])
    Console().print(table)


@sim_app.callback()
def sim(
    ctx: typer.Context,
    workload: str = typer.Option(None, "--workload", "-w", help=WORKLOAD_HELP),
    fleet: str = typer.Option(None, "--fleet", "-f", help=FLEET_HELP),
    policy: str = typer.Option("all", "--policy", "-p",
        help="all, or a comma list of phaseroute, static-spec, rr, jsq, split "
             "(and phaseroute-poolkv, an ablation: the router sees only pools' summed free KV)."),
    load: float = typer.Option(None, "--load", help="Offered load as a fraction of the fleet's fluid capacity (overrides the spec)."),
    seed: int = typer.Option(None, "--seed", help="Seed of the workload draws and the simulation (default: the spec's)."),
    max_requests: int = typer.Option(None, "--max-requests", help="Keep only the first N requests."),
    series: bool = typer.Option(False, "--series", help="Include each policy's time series in the JSON."),
    bound: bool = typer.Option(True, "--bound/--no-bound", help="Solve the LP upper bound."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Simulate every policy on one workload and fleet; print metrics and the bound."""
    if ctx.invoked_subcommand is not None:
        return
    if not workload or not fleet:
        _fail("give --workload and --fleet (or a subcommand: report, scenario, bench, calibrate)")
    from phaseroute.sim.engine import SimConfig
    from phaseroute.sim.runner import parse_policies, prepare, run_all

    with json_stdout(as_json, indent=1) as emit:
        try:
            names = parse_policies(policy)
            w, f, info = prepare(workload, fleet, load, seed, max_requests)
            doc = run_all(w, f, names, SimConfig(seed=seed or 0), bound=bound, series=series, info=info)
        except (SimError, ValueError) as exc:
            _fail(str(exc))
        _emit(doc, as_json, _print_summary, emit)


def _capacity_options(slo: float, seeds: int, seed: int | None, workload: str, start: float, max_load: float,
                      tolerance: float, bound: bool, max_requests: int | None, bound_max_load: float = 8.0) -> CapacityOptions:
    from phaseroute.sim.capacity import CapacityOptions
    from phaseroute.sim.workload import load_workload_spec

    if seeds < 1:
        raise ValueError(f"--seeds must be >= 1, got {seeds}")
    base = seed if seed is not None else load_workload_spec(workload).seed
    return CapacityOptions(slo=slo, seeds=tuple(range(base, base + seeds)), start=start, max_load=max_load,
                           tolerance=tolerance, bound=bound, max_requests=max_requests,
                           bound_max_load=max(bound_max_load, max_load))


def _print_capacity(doc: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{doc['workload']} on {doc['fleet']}: capacity at SLO (miss rate <= {doc['slo']}), "
                        f"seeds {doc['options']['seeds']}")
    for c in ("policy", "capacity mean", "range", "per seed", "goodput/$ at capacity (mean, range)", "points"):
        table.add_column(c)
    rows = list(doc["policies"].items()) + ([("bound", doc["bound"])] if "bound" in doc else [])
    mark = {"found": "", "at_max": "+", "below_min": "<"}
    for name, p in rows:
        c, money = p["capacity"], p.get("goodput_tokens_per_dollar_at_capacity")
        per_seed = ", ".join(f"{v}{mark[st]}" for v, st in zip(c["per_seed"], p["status"], strict=True))
        table.add_row(name, f"{c['mean']:.3f}", f"{c['min']:.2f}-{c['max']:.2f}", per_seed,
                      f"{money['mean']:.0f} ({money['min']:.0f}-{money['max']:.0f})" if money else "",
                      str(p["points_simulated"]))
    console = Console()
    console.print(table)
    if any(st != "found" for _, p in rows for st in p["status"]):
        console.print("+: still within the SLO at --max-load (the capacity is at least this); "
                      "<: above the SLO at the lowest load tried")
    for key, r in doc["ratios"].items():
        if r:
            extra = f", best baseline {r['best_baseline']}" if "best_baseline" in r else ""
            console.print(f"{key.replace('_', ' ')}: {r.get('of_means')} (per seed {r.get('per_seed')}{extra})")


@sim_app.command("capacity")
def capacity(
    workload: str = typer.Option(..., "--workload", "-w", help=WORKLOAD_HELP),
    fleet: str = typer.Option(..., "--fleet", "-f", help=FLEET_HELP),
    policy: str = typer.Option("all", "--policy", "-p", help="all, or a comma list of policies."),
    slo: float = typer.Option(0.02, "--slo", help="Largest job deadline-miss rate accepted."),
    seeds: int = typer.Option(3, "--seeds", help="Number of seeds (workload draws and simulation), from --seed on."),
    seed: int = typer.Option(None, "--seed", help="First seed (default: the workload spec's)."),
    start: float = typer.Option(1.0, "--start", help="First offered load tried."),
    max_load: float = typer.Option(4.0, "--max-load", help="Highest offered load tried."),
    tolerance: float = typer.Option(0.05, "--tolerance", help="Stop bisecting when hi / lo - 1 <= this."),
    max_requests: int = typer.Option(None, "--max-requests", help="Keep only the first N requests."),
    bound: bool = typer.Option(True, "--bound/--no-bound", help="Also search the LP bound's capacity."),
    bound_max_load: float = typer.Option(8.0, "--bound-max-load", help="Highest offered load tried for the bound."),
    plot: str = typer.Option(None, "--plot", help="Write the miss-rate-vs-load plot (PNG) here."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
) -> None:
    """Capacity at SLO: per policy, the highest offered load at which the job deadline-miss rate
    stays within --slo (bisection, each point a full simulation), with the bound's capacity and
    the ratios phaseroute / best baseline and phaseroute / bound; mean and range over the seeds."""
    from phaseroute.sim.capacity import capacity_study
    from phaseroute.sim.capacity_plot import plot_capacity
    from phaseroute.sim.runner import parse_policies

    with json_stdout(as_json, indent=1) as emit:
        try:
            opts = _capacity_options(slo, seeds, seed, workload, start, max_load, tolerance, bound, max_requests,
                                     bound_max_load)
            doc = capacity_study(workload, fleet, parse_policies(policy), opts, log=lambda m: typer.echo(m, err=True))
            if plot:
                doc["plot"] = str(plot_capacity(doc, plot))
        except (SimError, ValueError) as exc:
            _fail(str(exc))
        _emit(doc, as_json, _print_capacity, emit)


@sim_app.command("bench-bound")
def bench_bound(
    workload: str = typer.Option("mooncake", "--workload", "-w", help=WORKLOAD_HELP),
    fleet: str = typer.Option("l40s-a10g-t4", "--fleet", "-f", help=FLEET_HELP),
    jobs: int = typer.Option(2000, "--jobs", help="About this many jobs (the offered load is chosen to give them)."),
    exact: bool = typer.Option(False, "--exact", help="Also time the exact LP (minutes at 2,000 jobs)."),
    slowdown: bool = typer.Option(True, "--slowdown/--no-slowdown", help="Also time it with a slowdown event."),
    seed: int = typer.Option(None, "--seed"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Time the LP bound (column generation) on about --jobs jobs; prints the figures."""
    from phaseroute.sim.bound_bench import run_bound_bench

    with json_stdout(as_json, indent=1) as emit:
        try:
            doc = run_bound_bench(workload, fleet, jobs, exact, slowdown, seed, log=lambda m: typer.echo(m, err=True))
        except (SimError, ValueError) as exc:
            _fail(str(exc))
        _emit(doc, as_json, lambda d: typer.echo(json.dumps(d, indent=1)), emit)


@sim_app.command("report")
def report(
    workload: str = typer.Option(..., "--workload", "-w", help=WORKLOAD_HELP),
    fleet: str = typer.Option(..., "--fleet", "-f", help=FLEET_HELP),
    out: str = typer.Option("sim-report", "--out", "-o", help="Folder for report.md, results.json and the PNGs."),
    loads: str = typer.Option("0.3,0.5,0.7,0.9,1.1", "--loads", help="Offered loads of the sweep."),
    policy: str = typer.Option("all", "--policy", "-p"),
    seed: int = typer.Option(None, "--seed", help="Seed (default: the workload spec's)."),
    max_requests: int = typer.Option(None, "--max-requests"),
    scenarios: bool = typer.Option(True, "--scenarios/--no-scenarios", help="Also run the stale-profile and pool-loss scenarios."),
    capacity: bool = typer.Option(True, "--capacity/--no-capacity", help="Headline: capacity at SLO per policy."),
    slo: float = typer.Option(0.02, "--slo", help="Largest job deadline-miss rate accepted (capacity)."),
    seeds: int = typer.Option(3, "--seeds", help="Seeds of the capacity search."),
    bound: bool = typer.Option(True, "--bound/--no-bound", help="Solve the LP bound (sweep, scenarios, capacity)."),
) -> None:
    """Capacity at SLO + load sweep + scenarios -> report.md with plots (capacity, goodput and
    miss rate vs load, pool utilization over time, share per tenant, stale-profile reaction)."""
    from phaseroute.sim.report import build_report
    from phaseroute.sim.runner import parse_policies

    try:
        cap = _capacity_options(slo, seeds, seed, workload, 1.0, 4.0, 0.05, bound, max_requests) if capacity else None
        build_report(workload, fleet, out, tuple(float(x) for x in loads.split(",")), parse_policies(policy), seed,
                     max_requests, scenarios=scenarios, log=lambda m: typer.echo(m, err=True), capacity=cap,
                     bound=bound)
    except (SimError, ValueError) as exc:
        _fail(str(exc))
    typer.echo(f"wrote {out}/report.md")


@sim_app.command("scenario")
def scenario(
    kind: str = typer.Argument(..., help="stale (a pool slows down), loss (a pool disappears) or transfer "
                                         "(moving KV costs --usd-per-gb)."),
    workload: str = typer.Option(..., "--workload", "-w", help=WORKLOAD_HELP),
    fleet: str = typer.Option(..., "--fleet", "-f", help=FLEET_HELP),
    pool: str = typer.Option(None, "--pool", help="The pool hit (default: the one with the most capacity)."),
    at_s: float = typer.Option(None, "--at", help="When, in simulated seconds (default: 40% / 50% into the arrivals)."),
    factor: float = typer.Option(4.0, "--factor", help="Slowdown factor (stale)."),
    policy: str = typer.Option("phaseroute,static-spec,jsq", "--policy", "-p"),
    load: float = typer.Option(None, "--load"),
    seed: int = typer.Option(None, "--seed", help="Seed (default: the workload spec's)."),
    max_requests: int = typer.Option(None, "--max-requests"),
    usd_per_gb: float = typer.Option(0.02, "--usd-per-gb", help="Price of KV moved between pools (transfer)."),
    bound: bool = typer.Option(True, "--bound/--no-bound", help="Solve the LP bound (stale, loss)."),
) -> None:
    """Stale-profile, pool-loss or transfer-price scenario; prints JSON."""
    from phaseroute.sim.engine import SimConfig
    from phaseroute.sim.runner import parse_policies, prepare
    from phaseroute.sim.scenarios import pool_loss, stale_profile, transfer_price

    if kind not in ("stale", "loss", "transfer"):
        _fail(f"scenario must be 'stale', 'loss' or 'transfer', got {kind!r}")
    with json_stdout(indent=1) as emit:
        try:
            w, f, _ = prepare(workload, fleet, load, seed, max_requests)
            cfg = SimConfig(seed=seed or 0, sample_s=10.0)
            names = parse_policies(policy)
            if kind == "stale":
                doc = stale_profile(w, f, names, pool, at_s, factor, cfg, bound=bound)
            elif kind == "loss":
                doc = pool_loss(w, f, names, pool, at_s, cfg, bound=bound)
            else:
                doc = transfer_price(w, f, names, usd_per_gb, SimConfig(seed=seed or 0))
        except (SimError, ValueError) as exc:
            _fail(str(exc))
        emit(doc)


sim_app.command("fuzz")(fuzz)
sim_app.command("tick-bench")(tick_bench)
sim_app.command("drift")(drift)


@sim_app.command("bench")
def bench(
    workload: str = typer.Option("bench-1m", "--workload", "-w", help=WORKLOAD_HELP),
    fleet: str = typer.Option("bench-1000", "--fleet", "-f", help=FLEET_HELP),
    policy: str = typer.Option("jsq,phaseroute", "--policy", "-p"),
    max_requests: int = typer.Option(None, "--max-requests"),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Time the simulator (default: 1,000,000 requests on 1,000 accelerators) and the policy calls."""
    from phaseroute.sim.bench import run_bench
    from phaseroute.sim.runner import parse_policies

    with json_stdout(as_json, indent=1) as emit:
        try:
            doc = run_bench(workload, fleet, parse_policies(policy), max_requests, seed,
                            log=lambda m: typer.echo(m, err=True))
        except (SimError, ValueError) as exc:
            _fail(str(exc))
        _emit(doc, as_json, lambda d: typer.echo(json.dumps(d, indent=1)), emit)


@sim_app.command("calibrate")
def calibrate(
    points: str = typer.Argument(..., help="Measured points (YAML/JSON), e.g. sim/data/calibration-cpu-smollm2.yaml."),
) -> None:
    """Fit the roofline's efficiency factors to measured throughput; prints JSON."""
    from phaseroute.sim.calibrate import calibrate as fit
    from phaseroute.sim.calibrate import load_points

    with json_stdout(indent=1) as emit:
        try:
            acc, model, tp, pts = load_points(points)
            doc = fit(acc, model, tp, pts)
        except (SimError, ValueError) as exc:
            _fail(str(exc))
        emit(doc)


@plan_app.callback()
def plan(
    workload: str = typer.Option(..., "--workload", "-w", help=WORKLOAD_HELP),
    catalogue: str = typer.Option(None, "--catalogue", "-c", help="Candidates (YAML/JSON); default: every bundled accelerator."),
    max_types: int = typer.Option(2, "--max-types", help="Most accelerator types in one fleet."),
    target_miss: float = typer.Option(0.01, "--target-miss", help="Largest simulated job deadline-miss rate accepted."),
    confirm: int = typer.Option(3, "--confirm", help="How many LP-cheapest compositions to confirm by simulation."),
    policy: str = typer.Option("phaseroute", "--policy", "-p", help="Policy the simulator confirms with."),
    replicate: int = typer.Option(None, "--replicate", help="Override the spec's replicate."),
    speedup: float = typer.Option(None, "--speedup", help="Override the spec's speedup."),
    max_requests: int = typer.Option(None, "--max-requests"),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Cheapest fleet (types, counts, model placement, prefill/decode split) meeting the deadlines."""
    from dataclasses import replace

    from phaseroute.sim.planner import PlanOptions
    from phaseroute.sim.planner import plan as run_plan
    from phaseroute.sim.workload import build_workload, load_workload_spec

    with json_stdout(as_json, indent=1) as emit:  # HiGHS writes its solver log to fd 1: it lands on stderr
        try:
            spec = load_workload_spec(workload)
            spec = replace(spec, replicate=replicate or spec.replicate, speedup=speedup or spec.speedup,
                           max_requests=max_requests if max_requests is not None else spec.max_requests, load=None)
            w = build_workload(spec)
            doc = run_plan(w, catalogue, PlanOptions(max_types=max_types, target_miss_rate=target_miss, confirm=confirm,
                                                     policy=policy, seed=seed))
        except (SimError, ValueError) as exc:
            _fail(str(exc))
        _emit(doc, as_json, _print_plan, emit)


def _print_plan(doc: dict[str, Any]) -> None:
    choice = doc["choice"]
    if choice is None:
        typer.echo("no candidate fleet could serve the workload")
        return
    typer.echo(f"cheapest confirmed fleet: ${choice['cost_per_hour']}/h (LP lower bound ${choice['lp_cost_per_hour']}/h), "
               f"simulated miss rate {choice['miss_rate']}" + ("" if choice["meets_target"] else " (ABOVE target)"))
    for name, p in choice["placement"].items():
        typer.echo(f"  {name}: {p['accelerators']} x {p['accelerator']} ({p['instances']} instances of {p['model']}, tp={p['tp']}),"
                   f" prefill share of busy time {p['prefill_share_of_busy_time']}")


def _standalone() -> typer.Typer:
    """``python -m phaseroute.cli.sim_cmds sim|plan ...`` works before (and besides) registration."""
    app = typer.Typer(add_completion=False, no_args_is_help=True)
    app.add_typer(sim_app, name="sim")
    app.add_typer(plan_app, name="plan")
    return app


if __name__ == "__main__":  # pragma: no cover
    _standalone()()
