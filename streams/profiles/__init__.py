"""Profile building in the telemetry service: ClickHouse telemetry and cold-start profiles ->
the policy's profile rows -> the compacted ``profiles`` topic.

``aggregates_sql`` (SQL -> ``PhaseAggregate`` / ``LinkAggregate``), ``convert`` (policy rows
<-> ``profile_row`` Avro records; ``engine_profile`` grids -> PROFILER rows), ``builder``
(``ProfileBuilder``: build, publish changed records, ``on_tick`` hook). The math is the
policy's (``phaseroute.streams.policy.profile_builder``).
"""

from phaseroute.streams.profiles.builder import BuilderConfig, ProfileBuilder, service_builder
from phaseroute.streams.profiles.convert import from_avro, link_to_avro, profiler_rows, record_key, row_to_avro, table_from_avro

__all__ = [
    "BuilderConfig", "ProfileBuilder", "service_builder",
    "from_avro", "link_to_avro", "profiler_rows", "record_key", "row_to_avro", "table_from_avro",
]
