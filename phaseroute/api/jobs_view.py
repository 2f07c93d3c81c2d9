"""The jobs as the API sees them: ``jobs.state`` (the compacted snapshot: every job, its latest
state) and ``jobs.events`` (every transition still retained: when each stage began), followed
from the beginning in background threads. Read-only state, rebuilt from Kafka at each start,
so any number of API processes can run side by side."""

from __future__ import annotations

import threading
from typing import Any

from phaseroute.api.status_map import JobTrack
from phaseroute.infra.topics import spec_for

STATE_TOPIC = spec_for("jobs.state").name
EVENTS_TOPIC = spec_for("jobs.events").name


class JobsView:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tracks: dict[str, JobTrack] = {}
        self._followers: list[Any] = []

    def on_event(self, event: dict[str, Any]) -> None:
        with self._lock:
            track = self._tracks.get(event["job_id"])
            if track is None:
                self._tracks[event["job_id"]] = track = JobTrack(event)
                track.note(event)
            else:
                track.update(event)

    def get(self, job_id: str) -> JobTrack | None:
        with self._lock:
            track = self._tracks.get(job_id)
            return None if track is None else JobTrack(dict(track.latest), dict(track.first_at))

    @property
    def caught_up(self) -> bool:
        return all(f.caught_up.is_set() for f in self._followers)

    def start(self, bootstrap: str, wait_s: float = 30.0) -> None:
        from phaseroute.api.kafka_io import QUIET_CLIENT
        from phaseroute.infra.topic_follower import TopicFollower

        self._followers = [TopicFollower(bootstrap, topic, "job_event", self.on_event, service="api-jobs-view",
                                         settings=QUIET_CLIENT)
                           for topic in (STATE_TOPIC, EVENTS_TOPIC)]
        for follower in self._followers:
            follower.start()
        for follower in self._followers:
            follower.caught_up.wait(wait_s)

    def stop(self) -> None:
        for follower in self._followers:
            follower.stop()
