"""A minimal Faust app for ``test_faust_fixes.py`` (run as a subprocess).

One agent prints ``record <partition> <offset>`` for every input record it processes; nothing is
committed (the commit interval is an hour), so the input partitions stay never-committed. Once
``--rewind-after`` records were processed, the app does what Faust does after every rebalance,
``consumer.perform_seek()`` (seek back to the committed offsets), prints ``rewound`` and goes
on. ``--as-is`` leaves Faust as shipped; otherwise the control plane's corrections
(``streams/faust_fixes.py``) are applied as ``build_app`` applies them."""

from __future__ import annotations

import argparse

import faust

from phaseroute.streams.faust_fixes import drain_table_writes_before_commits, read_uncommitted_partitions_from_the_start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("app_id")
    parser.add_argument("topic")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rewind-after", type=int, required=True)
    parser.add_argument("--as-is", action="store_true")
    args = parser.parse_args()
    app = faust.App(args.app_id, broker=f"kafka://{args.bootstrap}", store="memory://", web_enabled=False,
                    topic_partitions=args.partitions, topic_replication_factor=1, consumer_auto_offset_reset="earliest",
                    broker_commit_interval=3600.0, broker_commit_every=1_000_000)
    if not args.as_is:
        drain_table_writes_before_commits(app)
        read_uncommitted_partitions_from_the_start(app)
    processed = {"n": 0, "rewound": False}

    @app.agent(app.topic(args.topic, key_serializer="raw", value_serializer="raw"))
    async def process(stream: faust.StreamT) -> None:
        async for event in stream.events():
            processed["n"] += 1
            print(f"record {event.message.partition} {event.message.offset}", flush=True)

    @app.timer(interval=1.0)
    async def rewind_once() -> None:
        if not processed["rewound"] and processed["n"] >= args.rewind_after:
            processed["rewound"] = True
            await app.consumer.perform_seek()
            print("rewound", flush=True)

    faust.Worker(app, loglevel="info", redirect_stdouts=False).execute_from_commandline()


if __name__ == "__main__":
    main()
