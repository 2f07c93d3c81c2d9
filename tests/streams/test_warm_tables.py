"""A standby's copy of a control table follows its changelog as Faust would rebuild it: JSON keys
and values, a tombstone deletes, the last offset applied per partition is what recovery resumes
after; the ``warm://`` store starts from the handed-over copy and names that offset."""

from __future__ import annotations

import json

import faust

from phaseroute.infra.topics import changelog_topic
from phaseroute.streams import warm_tables
from phaseroute.streams.warm_tables import TableCopy


def _j(value: object) -> bytes:
    return json.dumps(value).encode()


def test_a_copy_applies_writes_and_tombstones_in_order_and_keeps_the_last_offset_per_partition() -> None:
    copy = TableCopy()
    copy.apply(0, 10, _j("r1"), _j({"status": "QUEUED"}))
    copy.apply(1, 3, _j("r2"), _j({"status": "RUNNING"}))
    copy.apply(0, 11, _j("r1"), _j({"status": "DONE"}))
    copy.apply(1, 4, _j("r2"), None)  # the job was forgotten
    assert copy.data == {"r1": {"status": "DONE"}} and copy.partition_of == {"r1": 0}
    assert copy.offsets == {0: 11, 1: 4}


def test_the_warm_store_starts_from_the_handed_over_copy_and_tells_recovery_where_it_is() -> None:
    app = faust.App("warm-test", broker="memory://", store="memory://")
    copy = TableCopy()
    copy.apply(2, 41, _j("acme"), _j({"counter": 7.5}))
    warm_tables._HANDED_OVER[changelog_topic("tenants")] = copy
    table = app.Table("tenants", default=None, partitions=4, store=warm_tables.STORE_URL)
    store = table.data
    assert isinstance(store, warm_tables.WarmStore)
    assert dict(store.data) == {"acme": {"counter": 7.5}}
    assert store.persisted_offset(faust.types.TP("phaseroute-control-tenants-changelog", 2)) == 41
    assert store.persisted_offset(faust.types.TP("phaseroute-control-tenants-changelog", 0)) is None  # read whole
    assert changelog_topic("tenants") not in warm_tables._HANDED_OVER  # taken once
