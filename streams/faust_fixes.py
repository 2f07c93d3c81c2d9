"""Corrections to faust-streaming (0.15.3, with aiokafka) that the control plane needs.

Each was found on the real broker. Three are applied to one app, at build time:

- ``drain_table_writes_before_commits``: an offset commit waits until every buffered table
  write was sent (after the app wrote the state it keeps in memory, when it has a
  ``write_state``), so a committed event's state changes are in the changelogs.
- ``read_uncommitted_partitions_from_the_start``: an input partition the group never committed
  is read from its first record after a rebalance, not from wherever the fetcher happened to be.
- ``keep_changelog_partitions_known``: a table write still finds its changelog's partition after
  the producer's metadata forgot the changelog topic (which happens once any topic created after
  the app started is sent to, such as the ``prefill.<pool>`` topic of a pool added to the stack).

One is how an agent waits: ``hold_until_ready`` holds an event until the app can handle it, and
lets it go unacked when the app stops first, so a stop before then neither hangs nor loses it.
One is applied once the tables are recovered: ``fetch_in_small_slices`` keeps a flood of one
topic from holding the records of every other topic back (a big job's pending requests held
the results that free the fleet's slots back for ~40 s).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any, cast

import faust
from faust.types import TP, EventT

log = logging.getLogger(__name__)
DRAIN_LIMIT_S = 120.0  # longest a commit waits for the table writes of the events it commits
READY_POLL_S = 0.1  # how often an agent holding an event looks whether the app became ready


def drain_table_writes_before_commits(app: faust.App, write_state: Callable[[], None] | None = None) -> None:
    """Make Faust's offset commits wait for every table write of the events they commit.

    Table writes are buffered (``ProducerBuffer``) and a commit flushes the buffer first, but
    Faust's ``flush`` gives up after 0.1 s without a message sent and the commit goes on: a
    kill -9 right after it lost the changelog writes of results whose offsets were committed
    (measured: a standby that took over found 5 of 40 requests still running, their results
    consumed and never counted, and the job never completed). Here ``flush`` returns only once
    the buffer is empty, so a committed event's state changes are in the changelogs.

    ``write_state`` writes the state the app changed in memory since its last table write (the
    control core's write-behind): it runs first, once the offsets to commit are chosen (Faust
    chooses them before it flushes), so every event they cover has its state in the buffer."""
    buffer: Any = app.producer.buffer  # aiokafka's buffer: Faust's abstract type does not name its event

    async def flush_all() -> None:
        if write_state is not None:
            write_state()
        waited = 0.0
        while buffer.size and buffer.state == "running":
            buffer.message_sent.clear()
            try:
                await asyncio.wait_for(buffer.message_sent.wait(), timeout=1.0)
            except TimeoutError:
                waited += 1.0
                if waited >= DRAIN_LIMIT_S:  # the producer is stuck: Faust's own handling takes over
                    log.error("%d table writes not sent after %.0f s; committing anyway", buffer.size, waited)
                    return
                if waited % 10 == 0:
                    log.warning("commit waits for %d table writes to be sent (%.0f s so far)", buffer.size, waited)

    buffer.flush = flush_all


def read_uncommitted_partitions_from_the_start(app: faust.App) -> None:
    """After a rebalance, read every input partition without a committed offset from its start.

    While the tables recover, Faust keeps fetching input partitions but drops their records
    (they are not "active" yet) and relies on seeking back to the committed offsets afterwards.
    aiokafka's ``seek_to_committed`` seeks only where the committed offset is above 0, so a
    partition the group never committed stays where the fetcher left it: its records fetched
    during recovery were never processed. Measured: a control plane that started on long
    changelogs (40 s of recovery) processed 1 of 24 drift canaries already waiting in a new
    partition of ``requests.pending``, and the other 23 were never read; the same loss hits the
    first job of a ``jobs.submitted`` partition, or a new tenant's first requests, whenever they
    arrive before or during a restart. Here such a partition is read again from its beginning, as
    ``auto_offset_reset="earliest"`` promises. Records an agent got in the moment between the
    resume and this seek come twice, as after a crash, and the core ignores a record it has seen
    (seeking to the first record not yet handed over instead lost a record in the race)."""
    consumer: Any = app.consumer  # the aiokafka consumer, which Faust's abstract type does not describe
    seek_to_committed = consumer.seek_to_committed

    async def seek_to_committed_or_beginning() -> Mapping[Any, int]:
        committed: Mapping[Any, int] = await seek_to_committed()
        changelogs = app.tables.changelog_topics
        fresh = [tp for tp, offset in committed.items() if not offset and tp.topic not in changelogs]
        if fresh:
            log.info("reading %d partition(s) without a committed offset from the start: %s", len(fresh),
                     ", ".join(f"{tp.topic}[{tp.partition}]" for tp in sorted(fresh)))
            await consumer._thread.seek_to_beginning(*fresh)  # the Faust consumer seeks through its thread
        return committed

    consumer.seek_to_committed = seek_to_committed_or_beginning


def keep_changelog_partitions_known(app: faust.App) -> None:
    """Partition a table write by its changelog's declared partition count when the producer's
    metadata no longer holds that topic, and have the producer track the topic from then on.

    A table with ``use_partitioner=True`` picks the partition of each write synchronously, from
    the aiokafka producer's cluster metadata. That metadata starts with every topic, but aiokafka
    refreshes it for the topics it tracks only, and it starts tracking a topic only when a send
    misses it: the first send to a topic created after the app started (the ``prefill.<pool>``
    topic of a pool added to a running stack) leaves metadata that holds that topic alone. From
    then on every table write whose changelog had not been sent to since raised ``TypeError:
    'NoneType' object is not iterable`` (seen in a CI run: after a second ``phaseroute up`` added a
    pool, the control plane failed every write of its dispatch ticks and result handlers, and then
    hung on shutdown; ``tests/streams/test_faust_fixes.py`` reproduces it). The partition is the
    producer's own partitioner over the declared count, so a key lands where it always did."""
    producer: Any = app.producer  # the aiokafka producer, which Faust's abstract type does not describe
    key_partition = producer.key_partition

    def key_partition_of_a_known_topic(topic: str, key: bytes) -> TP:
        kafka = producer._ensure_producer()  # the aiokafka producer Faust drives
        if kafka.client.cluster.partitions_for_topic(topic) is not None:
            return cast(TP, key_partition(topic, key))
        declared = {table.changelog_topic.get_topic_name(): table.changelog_topic.partitions or app.conf.topic_partitions
                    for table in app.tables.values()}
        if topic in declared:
            kafka.client.add_topic(topic)  # tracked from now on: the refresh this starts brings it back
            partitions = list(range(declared[topic]))
            log.warning("producer metadata had lost changelog %s; partitioning its write over its %d declared "
                        "partitions", topic, len(partitions))
            return TP(topic, kafka._partitioner(key, partitions, partitions))
        return cast(TP, key_partition(topic, key))

    producer.key_partition = key_partition_of_a_known_topic


async def hold_until_ready(app: faust.App, event: EventT[Any], ready: Callable[[], bool]) -> None:
    """Return once ``ready()``: an agent's event waits here until the app can handle it (the
    control plane's agents wait for the restored core).

    Faust's stop waits until every event an agent took was acked (``wait_empty``), and an ack
    lets the next commit move past the event. An app stopped before it was ready hung there: its
    agents held events they could not handle, the timer that would have made it ready had
    stopped, and nothing acked them (seen in CI: a standby that got SIGTERM 0.08 s after it took
    the control lease, before its restore, hung 60 s until it was killed). Acking them would
    have committed events the app never handled. Here, once the app stops, the held event is let
    go without an offset to commit: Faust stops waiting for it, no commit covers it, and the next
    owner of its partition reads it, as after a kill. The event stays held until the agent is
    cancelled, so it is never handled after that."""
    while not ready():
        if app.should_stop:
            message: Any = event.message  # marked acked without Consumer.ack: no offset to commit
            message.acked = True
            log.warning("stopping before the app was ready: %s[%d]@%d is left for the next owner",
                        message.topic, message.partition, message.offset)
            await asyncio.Event().wait()  # never handled here: held until the agent is cancelled
        await asyncio.sleep(READY_POLL_S)


def fetch_in_small_slices(app: faust.App, partition_bytes: int) -> None:
    """From now on fetch at most ``partition_bytes`` of each partition at a time (aiokafka's
    ``max_partition_fetch_bytes``, 1 MiB unless set), so no partition's backlog holds the
    others' records back for long.

    aiokafka hands records over from the partitions whose fetches are buffered, in the order the
    fetches arrived, and fetches a partition again only once its buffer is drained; Faust hands
    each poll's records to the agents (round-robin by topic), waiting while an agent's queue is
    full, and polls again only once the whole poll was handed over. So one poll of eight full
    megabytes of pending requests ends with thousands of them after the last result it held,
    handed over at the agent's pace, while the results read meanwhile wait for the next poll:
    while the control plane read 40,000 pending requests it read no result and dispatched nothing
    for ~40 s, the fleet's slots staying taken (``phaseroute bench control``, 2026-12-07: ticks of
    0.2-0.3 ms releasing nothing while the queue rose from 8,600 to 35,500). With small buffers a
    poll is small and the results come in every poll (the bench's fake fleet then waited at most
    1.8-3.4 s for work mid-run, against 9.2-18.0 s without). Faust's poll limit
    (``broker_max_poll_records``) alone did not help (measured): it takes a poll's records from
    the partitions in the order their fetches arrived, so the results still come after the
    buffered megabytes. Not used while the tables recover: reading the changelogs in small
    fetches made a restart's recovery of ~20,000 requests take 60-81 s instead of 37-40 s."""
    consumer = cast(Any, app.consumer)._thread._ensure_consumer()  # the aiokafka consumer in Faust's thread
    fetcher = consumer._fetcher  # it reads the size anew for every fetch request it builds
    if fetcher._max_partition_fetch_bytes != partition_bytes:
        log.info("fetching at most %d bytes of a partition at a time (was %d)", partition_bytes,
                 fetcher._max_partition_fetch_bytes)
        fetcher._max_partition_fetch_bytes = partition_bytes
