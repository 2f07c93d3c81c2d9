"""Discrete-event fleet simulator driving the live control plane's own control core (``streams/core``).

Modules, one job each:
``traces`` (Azure CSV / Mooncake JSONL readers), ``workload`` (trace -> offline jobs of
tenants with deadlines), ``catalogue`` + ``data/`` (accelerator and model specs),
``fleet`` (pools, links, events), ``perfmodel`` (roofline step times), ``calibrate``
(efficiency factors from measured profiles), ``instance`` (fluid continuous batching of one
model instance), ``engine`` (event loop and request life cycle) with ``disruptions``
(failures, pool loss, slowdowns), ``sampling`` (profile refreshes, time series) and
``speculation`` (straggler copies), ``telemetry`` (simulated telemetry aggregates),
``drivers`` (baselines) and ``core_driver`` (phaseroute: the control core itself), ``bound`` (LP upper
bound, fleet capacity), ``metrics``, ``runner`` (all policies + bound in one document),
``scenarios`` (stale profiles, pool loss), ``planner`` (capacity planning), ``report``
(plots), ``bench`` (simulator speed). See sim/README.md.
"""
