"""The local phaseroute stack beside Kafka: telemetry service, result sink, control plane, drift
monitor, and the workers of each pool — each a process with a PID file, so ``phaseroute down`` stops them.

A pool spec names each pool's phase, engine variant, threads and worker count::

    prefill-fp32=prefill:fp32,decode-int8=decode:int8-dynamic,colo-fp32=both:fp32:1x2

(``name=phase:variant[:threads][xWORKERS]``), or a YAML file with the same fields.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from phaseroute.config import Settings
from phaseroute.infra import processes, provision, topics

PHASES = ("prefill", "decode", "both")


@dataclass(frozen=True)
class PoolSpec:
    name: str
    phase: str
    variant: str = "fp32"
    threads: int = 1
    workers: int = 1
    max_decode_batch: int = 16

    def __post_init__(self) -> None:
        topics.check_pool_name(self.name)
        if self.phase not in PHASES:
            raise ValueError(f"pool {self.name!r}: phase {self.phase!r} must be one of {PHASES}")
        if self.threads < 1 or self.workers < 1:
            raise ValueError(f"pool {self.name!r}: threads ({self.threads}) and workers ({self.workers}) must be >= 1")


DEMO_POOLS = (
    PoolSpec("prefill-fp32", "prefill", "fp32"),
    PoolSpec("decode-int8", "decode", "int8-dynamic"),
    PoolSpec("colo-fp32", "both", "fp32"),
)


def parse_pools(spec: str) -> list[PoolSpec]:
    """Pools from ``name=phase:variant[:threads][xN],...`` or from a YAML file path."""
    path = Path(spec)
    if path.suffix in (".yaml", ".yml", ".json") and path.exists():
        data = yaml.safe_load(path.read_text())
        return [PoolSpec(name, **fields) for name, fields in data.items()]
    pools = []
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, eq, rest = part.partition("=")
        if not eq:
            raise ValueError(f"pool spec {part!r} must look like name=phase:variant[:threads][xWORKERS]")
        rest, _, workers = rest.partition("x")
        fields = rest.split(":")
        if len(fields) < 2:
            raise ValueError(f"pool spec {part!r} needs at least phase and variant")
        threads = int(fields[2]) if len(fields) > 2 else 1
        pools.append(PoolSpec(name.strip(), fields[0], fields[1], threads, int(workers) if workers else 1))
    if not pools:
        raise ValueError(f"pool spec {spec!r} names no pool")
    return pools


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "phaseroute.cli.main", *args]


def start(settings: Settings, pools: list[PoolSpec], tenants_file: Path | None = None,
          drift_interval_s: float | None = 60.0) -> list[str]:
    """Provision the pools' topics and start services and workers; return the process names.
    The drift monitor runs canaries on every path every ``drift_interval_s`` (None: no monitor)."""
    provision.provision(settings.bootstrap_servers, topics.all_topics([p.name for p in pools]))
    logs = settings.run_dir / "logs"
    started = []

    def spawn(name: str, cmd: list[str]) -> None:
        if processes.alive_pid(settings.run_dir, name) is None:
            processes.spawn(settings.run_dir, name, cmd, logs / f"{name}.log")
        started.append(name)

    spawn("telemetry", _cli("sink", "telemetry"))
    spawn("results", _cli("sink", "results"))
    spawn("control", _cli("control", *(["--tenants", str(tenants_file)] if tenants_file else [])))
    if drift_interval_s is not None:
        spawn("drift", [sys.executable, "-m", "phaseroute.cli.drift_cmds", "monitor", "--interval-s", str(drift_interval_s)])
    for pool in pools:
        for i in range(pool.workers):
            spawn(f"worker-{pool.name}-{i}", _cli(
                "worker", "--pool", pool.name, "--phase", pool.phase, "--variant", pool.variant,
                "--threads", str(pool.threads), "--max-decode-batch", str(pool.max_decode_batch),
                "--worker-id", f"{pool.name}-{i}",
            ))
    return started


def check_running(settings: Settings, names: list[str]) -> None:
    """Raise naming the processes that exited, with the tail of their logs."""
    dead = [n for n in names if processes.alive_pid(settings.run_dir, n) is None]
    if dead:
        tails = []
        for name in dead:
            log = settings.run_dir / "logs" / f"{name}.log"
            tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else ["(no log)"]
            tails.append(f"--- {name}\n" + "\n".join(tail))
        raise RuntimeError(f"processes exited: {', '.join(dead)}\n" + "\n".join(tails))


def wait_for(condition: "callable[[], bool]", timeout_s: float, what: str, settings: Settings, names: list[str]) -> None:  # type: ignore[valid-type]
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        check_running(settings, names)
        if condition():
            return
        time.sleep(1.0)
    raise TimeoutError(f"{what} not reached within {timeout_s:.0f} s")
