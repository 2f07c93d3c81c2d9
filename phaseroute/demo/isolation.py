"""A state of the demo's own: every run starts from nothing an earlier run left behind.

The demo runs its stack (broker, ClickHouse data, KV store, results, Faust changelogs) under
``<home>/demo`` on ports of its own, so a crashed or killed earlier run, or a stack the user
runs beside it, cannot feed it leftovers (the failure this replaces: a rerun after a crash
re-queued 38 requests of the crashed run and timed out). At start it stops whatever processes
an earlier demo run registered there, then wipes the directory. The converted model and the
Kafka jars are shared with the main home (symlinked), so isolation costs no download and no
conversion. With ``--bootstrap-servers`` (an external cluster) the broker cannot be isolated:
the demo then says so and uses the cluster as it is. One demo runs per home at a time: a
second one, started while the first still runs, would stop the first's stack (and the first's
clean-up the second's), so it is refused while ``<home>/demo.lock`` is held (a lock the kernel
drops when its process dies, kill -9 included).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
from pathlib import Path
from typing import IO

from phaseroute.config import Settings, load_settings
from phaseroute.config import settings as cached_settings
from phaseroute.infra import kafka_launcher, processes


class DemoBusy(RuntimeError):
    """Another demo runs in this home now."""


_held: list[IO[str]] = []  # the lock of this process's demo, held until it exits


def hold_demo_lock(home: Path) -> None:
    """Take ``<home>/demo.lock`` for this process, or raise DemoBusy naming the demo that holds it."""
    home.mkdir(parents=True, exist_ok=True)
    lock = open(home / "demo.lock", "a+")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.seek(0)
        holder = lock.read().strip() or "unknown"
        lock.close()
        raise DemoBusy(f"another demo is running in {home} (pid {holder}); wait for it to finish or stop it "
                       "(Ctrl-C there, or kill that pid), then run the demo again") from None
    lock.seek(0)
    lock.truncate()
    lock.write(str(os.getpid()))
    lock.flush()
    _held.append(lock)


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def stop_leftovers(run_dir: Path, grace_s: float = 2.0) -> list[str]:
    """Stop every process an earlier run registered in ``run_dir`` (workers first, broker last);
    their state is wiped next, so they get a short grace before SIGKILL."""
    names = [n for n in processes.names(run_dir) if processes.alive_pid(run_dir, n) is not None]
    for name in sorted(names, key=lambda n: n == "kafka"):
        processes.stop(run_dir, name, grace_s=grace_s)
    return names


def isolate(settings: Settings) -> tuple[Settings, list[str]]:
    """Fresh demo settings under ``<home>/demo`` (exported to the environment, so every process the
    demo starts uses them); and the names of leftover processes that were stopped."""
    hold_demo_lock(settings.home)
    home = settings.home / "demo"
    stopped = stop_leftovers(home / "run")
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    settings.model_cache.mkdir(parents=True, exist_ok=True)
    (home / "models").symlink_to(settings.model_cache, target_is_directory=True)
    env = {"PHASEROUTE_HOME": str(home), "PHASEROUTE_TELEMETRY_PORT": str(free_port()),
           "PHASEROUTE_API_PORT": str(free_port())}
    if not settings.external_kafka:
        _, mvn = kafka_launcher.check_toolchain()
        libs = kafka_launcher.resolve_jars(settings, mvn)
        own = kafka_launcher.layout_for(settings).root.relative_to(settings.home)
        (home / own).mkdir(parents=True)
        (home / own / "libs").symlink_to(libs, target_is_directory=True)
        env |= {"PHASEROUTE_KAFKA_PORT": str(free_port()), "PHASEROUTE_KAFKA_CONTROLLER_PORT": str(free_port())}
    os.environ.update(env)
    cached_settings.cache_clear()
    return load_settings(), stopped
