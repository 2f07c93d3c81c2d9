"""``phaseroute sim drift``: how long a lossy path goes unnoticed, against the canary share.

The live control core and drift monitor on a virtual clock with a fake saturated pool
(``phaseroute.sim.drift_detection``); prints a table, or one JSON document with ``--json``.
"""

from __future__ import annotations

import logging

import typer


def drift(
    shares: str = typer.Option("0.01,0.03,0.1,0.3", "--shares", help="Canary shares to compare (CoreConfig.canary_share)."),
    rows: int = typer.Option(32, "--rows", help="The fake pool's batch rows."),
    units_per_s: float = typer.Option(200.0, "--units-per-s",
                                      help="The fake pool's work rate (a prompt token 1, an output token 2); "
                                           "200 is this machine's engine on the pipeline bench."),
    phases: int = typer.Option(12, "--phases", help="Lossy moments spread over one longest monitor interval."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> None:
    """Detection time of a path that turns lossy, per canary share (live core and monitor, fake pool)."""
    from phaseroute.cli.common import json_stdout
    from phaseroute.sim.drift_detection import FakePool, detection_table

    try:
        chosen = tuple(float(s) for s in shares.split(",") if s.strip())
        pool = FakePool(rows=rows, units_per_s=units_per_s)
        if rows < 1 or units_per_s <= 0 or phases < 1 or not chosen:
            raise ValueError(f"need --rows >= 1, --units-per-s > 0, --phases >= 1 and a share (got {rows}, "
                             f"{units_per_s}, {phases}, {shares!r})")
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    logging.getLogger("phaseroute.consumers.drift_monitor").setLevel(logging.ERROR)  # a line per round otherwise
    with json_stdout(as_json, indent=1) as emit:
        try:
            doc = detection_table(chosen, pool, phases)
        except ValueError as exc:  # a share CoreConfig refuses
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        if as_json:
            emit(doc)
            return
    typer.echo(f"fake pool: {rows} rows, {units_per_s:g} units/s, kept saturated by a flooding tenant; "
               f"lossy at {len(doc['lossy_at_s'])} moments over one {doc['monitor']['max_interval_s']:g} s interval")
    typer.echo(f"{'share':>6} {'detected':>9} {'mean s':>7} {'median s':>9} {'worst s':>8} {'round s':>8} "
               f"{'canary work':>12}")
    for r in doc["shares"]:
        typer.echo(f"{r['canary_share']:>6g} {r['detected']:>4}/{r['runs']:<4} {_s(r['detection_s_mean']):>7} "
                   f"{_s(r['detection_s_median']):>9} {_s(r['detection_s_max']):>8} {r['round_s_mean']:>8.1f} "
                   f"{100 * r['canary_work_share']:>11.2f}%")


def _s(value: float | None) -> str:
    return "never" if value is None else f"{value:.0f}"
