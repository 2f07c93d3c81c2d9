"""``phaseroute control``: one control-plane instance, active or standby.

Life of an instance: it starts its admission desk (``streams/admitter.py``: it judges the
submitted jobs of the ``jobs.submitted`` partitions the admission group gives it, active or
standby alike), its job tracker (``streams/tracking_loop.py``: verdicts, receipts, cancels and
expiry of the jobs of the partitions the tracking group gives it, active or standby alike) and
its copy of the control tables (``streams/warm_tables.py``: a hot standby), joins the control
lease (``infra/control_lease.py``) and waits as a standby while another instance holds it; once
it holds the lease it hands its table copy over, reads the tenant registry, builds the Faust
app (``streams/app.py``: fair scheduler, router, the attempts) and runs it until SIGTERM, then leaves
the lease so a standby takes over at once. Should it lose the lease while it runs (cut off from
the brokers past its session timeout), it stops dispatching at once and starts again as a
standby: another instance may hold the lease by then.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import typer

from phaseroute.cli.common import current_settings, errors_as_messages

log = logging.getLogger("phaseroute.control")


def _start_again_as_standby(reason: str) -> None:
    """Fencing: the process image is replaced at once (no Faust shutdown that could still send)."""
    from phaseroute.infra import processes

    log.error("%s: stopping now and starting again as a standby", reason)
    name = processes.recorded_name()
    if name:  # the new image keeps this process's record in the run dir
        os.environ[processes.NAME_ENV] = name
    for handler in logging.getLogger().handlers:
        handler.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def control(tenants: Path = typer.Option(None, "--tenants", help="Deprecated YAML {tenant: {weight, ...}}: prefer "
                                         "`phaseroute tenants import FILE`.")) -> None:
    """Run one control-plane instance until SIGTERM: its admission desk judges the jobs of the
    partitions it owns; it dispatches (fair scheduler, router, tracker) while it holds the
    control lease, and is a standby while another instance does. Start several
    (`phaseroute up --control N`) to share admission and for fail-over."""
    import faust
    from confluent_kafka import KafkaException

    from phaseroute.api.kafka_io import BrokerUnavailable
    from phaseroute.api.registry import read_tenants
    from phaseroute.infra import processes, provision, topics
    from phaseroute.infra.blobstore import open_blob_store, output_prefix
    from phaseroute.infra.control_lease import ControlLease, instance_id
    from phaseroute.streams.admission_desk import AdmissionDesk
    from phaseroute.streams.admitter import Admitter
    from phaseroute.streams.app import SERVED_MODELS, build_app
    from phaseroute.streams.core import JobTracker
    from phaseroute.streams.model_catalog import load_model_info
    from phaseroute.streams.settings import core_config
    from phaseroute.streams.tracking_loop import TrackingLoop
    from phaseroute.streams.views import PoolView, ProfileView
    from phaseroute.streams.warm_tables import ChangelogMirror

    settings = current_settings()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    name = processes.recorded_name() or f"control-{os.getpid()}"
    # what takes seconds (the tokenizers) is done before the wait: a standby takes over warm
    infos = {m: load_model_info(m, settings.model_cache) for m in SERVED_MODELS}
    with errors_as_messages(BrokerUnavailable, ValueError, KafkaException):
        provision.provision(settings.bootstrap_servers, [topics.spec_for(t) for t in (
            topics.CONTROL_LEASE, topics.JOBS_ADMISSIONS, topics.CONTROL_LOAD, topics.TRACKING_CHANGELOG)])
        config = core_config(infos, tenants, list(read_tenants(settings.bootstrap_servers).values()))
        desk = AdmissionDesk(instance_id(name), config, infos, PoolView(config.heartbeat_timeout_s), ProfileView(),
                             output_prefix, open_blob_store(settings.blob_store))
        admitter = Admitter(settings.bootstrap_servers, desk, instance_id(name), settings.control_session_timeout_s)
        admitter.start()
        tracking = TrackingLoop(settings.bootstrap_servers, JobTracker(config), instance_id(name),
                                settings.control_session_timeout_s, output_file=output_prefix)
        tracking.start()
        mirror = ChangelogMirror(settings.bootstrap_servers, cluster=settings.kafka_client_config)
        mirror.start()  # a hot standby: its copy of the tables is current when it takes over
    lease = ControlLease(settings.bootstrap_servers, name, settings.control_session_timeout_s,
                         on_lost=_start_again_as_standby, cluster=settings.kafka_client_config)
    try:
        log.info("%s: waiting for the control lease (a standby while another instance holds it)", name)
        waited = lease.wait_until_held(log.info)
        log.info("%s: holds the control lease after %.1f s: active", name, waited)
        kept = mirror.hand_over()
        log.info("%s: warm tables: %d changelog records applied while standby; keys held: %s", name, mirror.applied,
                 ", ".join(f"{t} {n}" for t, n in kept.items()))
        with errors_as_messages(BrokerUnavailable, ValueError):
            records = list(read_tenants(settings.bootstrap_servers).values())
        app, _handle = build_app(settings, tenants, tenant_records=records, infos=infos, instance=instance_id(name),
                                 views=(desk.pools, desk.profiles, admitter.followers[:2]), warm=True)
        faust.Worker(app, loglevel="info", redirect_stdouts=False).execute_from_commandline()
    finally:
        lease.close()
        admitter.stop()
        tracking.stop()
