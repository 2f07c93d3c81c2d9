"""``phaseroute sim`` (fleet simulator) and ``phaseroute plan`` (capacity planner).

Register in the main CLI with::

    from phaseroute.cli.sim_cmds import plan_app, sim_app
    app.add_typer(sim_app, name="sim")
    app.add_typer(plan_app, name="plan")

``phaseroute sim --workload W --fleet F [--policy all] [--load 0.7] --json`` prints one JSON
document: every policy's metrics and the LP bound. Subcommands: ``report`` (load sweep,
scenarios, plots), ``scenario stale|loss``, ``bench`` (1M requests on 1,000 accelerators),
``calibrate`` (efficiency factors from measured profiles).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import typer

from phaseroute.cli.fuzz_cmd import fuzz, tick_bench

from phaseroute.cli.common import json_stdout
from phaseroute.sim.errors import SimError

sim_app = typer.Typer(help="Fleet simulator: the phaseroute policy at fleet scale, against baselines and an LP bound.",
                      invoke_without_command=True, add_completion=False)
plan_app = typer.Typer(help="Capacity planner: which accelerators, how many, at what cost, meet the deadlines.",
                       invoke_without_command=True, add_completion=False)

WORKLOAD_HELP = "Workload spec (YAML/JSON path) or a bundled name: azure-code, mooncake, bench-1m."
FLEET_HELP = "Fleet spec (YAML/JSON path) or a bundled name: h100-a100, l40s-a10g-t4, bench-1000."


def _fail(message: str) -> None:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def _emit(doc: dict, as_json: bool, human: Callable[[dict], None], emit: Callable[[object], None]) -> None:
    """``--json``: ``emit`` (from ``json_stdout``: one document on the real stdout, whatever a
    solver writes meanwhile goes to stderr); else the human form."""
    if as_json:
        emit(doc)
    else:
        human(doc)


def _print_summary(doc: dict) -> None:
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
    policy: str = typer.Option("all", "--policy", "-p", help="all, or a comma list of phaseroute, static-spec, rr, jsq, split (and phaseroute-poolkv, an ablation: the router sees only pools' summed free KV)."),
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
) -> None:
    """Load sweep + scenarios -> report.md with plots (goodput and miss rate vs load, pool
    utilization over time, share per tenant, stale-profile reaction)."""
    from phaseroute.sim.report import build_report
    from phaseroute.sim.runner import parse_policies

    try:
        build_report(workload, fleet, out, tuple(float(x) for x in loads.split(",")), parse_policies(policy), seed,
                     max_requests, scenarios=scenarios, log=lambda m: typer.echo(m, err=True))
    except (SimError, ValueError) as exc:
        _fail(str(exc))
    typer.echo(f"wrote {out}/report.md")


@sim_app.command("scenario")
def scenario(
    kind: str = typer.Argument(..., help="stale (a pool slows down) or loss (a pool disappears)."),
    workload: str = typer.Option(..., "--workload", "-w", help=WORKLOAD_HELP),
    fleet: str = typer.Option(..., "--fleet", "-f", help=FLEET_HELP),
    pool: str = typer.Option(None, "--pool", help="The pool hit (default: the one with the most capacity)."),
    at_s: float = typer.Option(None, "--at", help="When, in simulated seconds (default: 40% / 50% into the arrivals)."),
    factor: float = typer.Option(4.0, "--factor", help="Slowdown factor (stale)."),
    policy: str = typer.Option("phaseroute,static-spec,jsq", "--policy", "-p"),
    load: float = typer.Option(None, "--load"),
    seed: int = typer.Option(None, "--seed", help="Seed (default: the workload spec's)."),
    max_requests: int = typer.Option(None, "--max-requests"),
) -> None:
    """Stale-profile or pool-loss scenario; prints JSON."""
    from phaseroute.sim.engine import SimConfig
    from phaseroute.sim.runner import parse_policies, prepare
    from phaseroute.sim.scenarios import pool_loss, stale_profile

    if kind not in ("stale", "loss"):
        _fail(f"scenario must be 'stale' or 'loss', got {kind!r}")
    with json_stdout(indent=1) as emit:
        try:
            w, f, _ = prepare(workload, fleet, load, seed, max_requests)
            cfg = SimConfig(seed=seed or 0, sample_s=10.0)
            names = parse_policies(policy)
            doc = (stale_profile(w, f, names, pool, at_s, factor, cfg) if kind == "stale"
                   else pool_loss(w, f, names, pool, at_s, cfg))
        except (SimError, ValueError) as exc:
            _fail(str(exc))
        emit(doc)


sim_app.command("fuzz")(fuzz)
sim_app.command("tick-bench")(tick_bench)


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


def _print_plan(doc: dict) -> None:
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
