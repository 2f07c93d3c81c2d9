"""The ``phaseroute`` command: one typer app, each command group in its own module."""

from __future__ import annotations

import typer

from phaseroute.cli import (
    api_cmds,
    bench_control,
    bench_pipeline,
    bench_sink,
    common,
    control_cmd,
    drift_cmds,
    engine_cmds,
    jobs_cmds,
    pools_cmd,
    query_cmd,
    sim_cmds,
    stack,
    worker_cmds,
)

app = typer.Typer(no_args_is_help=True, add_completion=False, help="phaseroute: offline LLM batch inference over Kafka.")


@app.callback()
def _global_options(
    bootstrap_servers: str = typer.Option(
        None, "--bootstrap-servers", "-b",
        help="Use this Kafka cluster instead of the local broker (env PHASEROUTE_BOOTSTRAP_SERVERS).",
    ),
    home: str = typer.Option(None, "--home", help="State directory (env PHASEROUTE_HOME)."),
) -> None:
    common.apply_global_options(bootstrap_servers, home)


app.command("up")(stack.up)
app.command("down")(stack.down)
app.command("restart")(stack.restart)
app.command("topics")(stack.list_topics)
app.command("worker")(worker_cmds.worker)
app.command("sink")(worker_cmds.sink)
app.command("query")(query_cmd.query)
app.command("pools")(pools_cmd.pools)
# the control plane records itself in the run dir like every long-running command (`down` stops it)
app.command("control")(common.long_running(lambda _kw: "control")(control_cmd.control))
app.command("submit")(jobs_cmds.submit)
app.command("status")(jobs_cmds.status)
app.command("results")(jobs_cmds.results)
app.command("cancel")(jobs_cmds.cancel)
app.command("demo")(jobs_cmds.demo)
app.command("api")(common.long_running(lambda _kw: "api")(api_cmds.api))
app.add_typer(api_cmds.tenants_app, name="tenants")
app.command("profile")(engine_cmds.profile)
engine_cmds.bench_app.command("admission")(api_cmds.bench_admission)
engine_cmds.bench_app.command("pipeline")(bench_pipeline.bench_pipeline)
engine_cmds.bench_app.command("sink")(bench_sink.bench_sink)
engine_cmds.bench_app.command("control")(bench_control.bench_control)
app.add_typer(engine_cmds.bench_app, name="bench")
app.add_typer(sim_cmds.sim_app, name="sim")
app.add_typer(sim_cmds.plan_app, name="plan")
app.add_typer(drift_cmds.drift_app, name="drift")
app.command("report", help="Quality drift per variant and path, alerts, and drift over time (--plot PNG).")(drift_cmds.report)


if __name__ == "__main__":  # pragma: no cover
    app()
