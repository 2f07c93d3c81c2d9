"""A minimal Faust app for ``test_faust_fixes.py`` (run as a subprocess): a table write after the
app sent to a topic created after it started.

On its first input record the agent writes key ``k`` of a ``use_partitioner`` table (as the
control plane's tables are), creates the topic ``<source>.late``, sends one record there and
waits for it, then writes ``k`` again and once more a second later. It prints ``write <n> ok`` or
``write <n> failed <exception>`` for each write, and ``done`` at the end. ``--as-is`` leaves Faust
as shipped; otherwise ``keep_changelog_partitions_known`` is applied, as ``build_app`` does."""

from __future__ import annotations

import argparse
import asyncio

import faust
from confluent_kafka.admin import AdminClient, NewTopic

from phaseroute.streams.faust_fixes import keep_changelog_partitions_known


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("app_id")
    parser.add_argument("source")
    parser.add_argument("--as-is", action="store_true")
    args = parser.parse_args()
    app = faust.App(args.app_id, broker=f"kafka://{args.bootstrap}", store="memory://", web_enabled=False,
                    topic_partitions=2, topic_replication_factor=1, consumer_auto_offset_reset="earliest")
    table = app.Table("counts", default=int, partitions=2, use_partitioner=True)
    if not args.as_is:
        keep_changelog_partitions_known(app)
    late = f"{args.source}.late"

    def write(n: int) -> None:
        try:
            table["k"] = n
            print(f"write {n} ok", flush=True)
        except Exception as exc:  # what the test looks for
            print(f"write {n} failed {type(exc).__name__}: {exc}", flush=True)

    @app.agent(app.topic(args.source, key_serializer="raw", value_serializer="raw"))
    async def process(stream: faust.StreamT) -> None:
        async for _ in stream:
            write(1)
            admin = AdminClient({"bootstrap.servers": args.bootstrap})  # kept until its future resolves
            admin.create_topics([NewTopic(late, 1, 1)])[late].result(30)
            await (await app.topic(late, value_serializer="raw").send(value=b"x"))
            write(2)
            await asyncio.sleep(1.0)
            write(3)
            await app.producer.flush()
            print("done", flush=True)

    faust.Worker(app, loglevel="warn", redirect_stdouts=False).execute_from_commandline()


if __name__ == "__main__":
    main()
