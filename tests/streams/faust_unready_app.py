"""A minimal Faust app for ``test_faust_stop_before_ready.py`` (run as a subprocess): an agent whose events
wait until the app is ready, as the control plane's agents wait for the restored core.

The agent prints ``holding <partition> <offset>`` when it takes an input record, waits until
``--ready-after`` seconds after start (never, by default), then prints ``record <partition>
<offset>``. It waits with ``hold_until_ready``; ``--as-is`` waits in a plain loop instead, as the
control plane did before, which leaves Faust's stop waiting for the held event."""

from __future__ import annotations

import argparse
import asyncio
import time

import faust

from phaseroute.streams.faust_fixes import hold_until_ready


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bootstrap")
    parser.add_argument("app_id")
    parser.add_argument("topic")
    parser.add_argument("--ready-after", type=float, default=float("inf"))
    parser.add_argument("--as-is", action="store_true")
    args = parser.parse_args()
    app = faust.App(args.app_id, broker=f"kafka://{args.bootstrap}", store="memory://", web_enabled=False,
                    topic_partitions=1, topic_replication_factor=1, consumer_auto_offset_reset="earliest",
                    broker_commit_interval=1.0)
    started = time.time()

    def ready() -> bool:
        return time.time() - started >= args.ready_after

    @app.agent(app.topic(args.topic, key_serializer="raw", value_serializer="raw"))
    async def process(stream: faust.StreamT) -> None:
        async for event in stream.events():
            print(f"holding {event.message.partition} {event.message.offset}", flush=True)
            if args.as_is:
                while not ready():
                    await asyncio.sleep(0.1)
            else:
                await hold_until_ready(app, event, ready)
            print(f"record {event.message.partition} {event.message.offset}", flush=True)

    faust.Worker(app, loglevel="info", redirect_stdouts=False).execute_from_commandline()


if __name__ == "__main__":
    main()
