"""The control core writing its store behind (``write_behind``, as the live control plane runs it):
the store is written by ``flush`` only (the Faust app flushes every second and before each
offset commit), once per changed record, and a core rebuilt from the last flush, given again
the events read after it (Kafka redelivers what was not committed, and the app commits only
after a flush), ends with every request counted once."""

from __future__ import annotations

from collections import Counter
from typing import Any

from phaseroute.schemas.enums import JobState
from phaseroute.streams.core import (
    ControlCore,
    CoreConfig,
    DictStore,
    Dispatch,
    FleetObserved,
    ProfilesUpdated,
    ResultReceived,
)
from phaseroute.streams.core.one_process import OneProcessControl
from phaseroute.streams.policy import ModelSpec

from .fleet import MODEL, Sink, admit, job, pool, table


class CountingDict(dict[str, Any]):
    """A dict that counts the writes of each key (a changelog record per write)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: Counter[str] = Counter()

    def __setitem__(self, key: str, value: Any) -> None:
        self.writes[key] += 1
        super().__setitem__(key, value)


def _store() -> DictStore:
    return DictStore(CountingDict(), CountingDict(), CountingDict())


def _core(store: DictStore, now: float, write_behind: bool) -> ControlCore:
    c = ControlCore(CoreConfig(models={MODEL: ModelSpec(MODEL, 4096)}), store, seed=1, write_behind=write_behind)
    c.handle(FleetObserved((pool("a", now), pool("b", now))), now)
    c.handle(ProfilesUpdated(table(["a", "b"], now)), now)
    return c


def _run(write_behind: bool, n: int = 400) -> tuple[DictStore, ControlCore]:
    """One job of ``n`` requests to completion: each tick dispatches, the results of the tick's
    dispatches come back one by one before the next tick, then the sink's receipt; a write-behind
    core is flushed every fourth tick (every second, as the live app does)."""
    now, store = 1000.0, _store()
    c = _core(store, now, write_behind)
    control, sink = OneProcessControl(c), Sink()
    admit(control, job("j", n, now), now)
    for step in range(1, 200):
        now += 0.25
        for d in control.tick(now):
            if isinstance(d, Dispatch):
                result = ResultReceived(d.work.request_id, "j", True, d.work.prompt_tokens, 8)
                control.handle(result, now)
                sink.write(result)
                control.handle(sink.receipt("j"), now)
        if c.jobs.jobs["j"].state.is_finished:
            c.tick(now + 0.25)
            c.flush()
            return store, c
        if step % 4 == 0:
            c.flush()
    raise AssertionError(f"job j is still {c.jobs.jobs['j'].state.name}")


def test_the_store_is_written_by_flush_only_once_per_changed_record() -> None:
    now, store = 1000.0, _store()
    c = _core(store, now, write_behind=True)
    admit(c, job("j", 8, now), now)
    c.tick(now + 0.25)
    assert not store.jobs and not store.requests and not store.tenants, "nothing is written before a flush"
    c.flush()
    assert store.jobs["j"]["state"] == "ADMITTED" and len(store.requests) == 8 and "acme" in store.tenants
    assert {r["status"] for r in store.requests.values()} == {"RUNNING"}
    assert set(store.requests.writes.values()) == {1}, "queued and dispatched between two flushes: one write each"
    c.flush()
    assert set(store.requests.writes.values()) == {1}, "a flush with nothing changed writes nothing"

    eager_store, eager = _run(write_behind=False)
    behind_store, behind = _run(write_behind=True)
    for c in (eager, behind):
        assert c.jobs.jobs["j"].state is JobState.COMPLETED and c.jobs.jobs["j"].done == 400
    assert behind_store.jobs["j"] == eager_store.jobs["j"], "the same final record either way"
    assert behind_store.requests == eager_store.requests == {}, "the finished job's requests are forgotten"
    eager_jobs, behind_jobs = eager_store.jobs.writes["j"], behind_store.jobs.writes["j"]
    eager_requests, behind_requests = sum(eager_store.requests.writes.values()), sum(behind_store.requests.writes.values())
    print(f"\n[figures] 400 requests: job record written {eager_jobs} times eagerly, {behind_jobs} behind; "
          f"request records {eager_requests} vs {behind_requests}")
    assert behind_jobs < eager_jobs / 4, (eager_jobs, behind_jobs)
    assert behind_requests < 0.8 * eager_requests, (eager_requests, behind_requests)


def test_a_core_rebuilt_from_its_last_flush_closes_each_redelivered_request_once() -> None:
    now, store = 1000.0, _store()
    c = _core(store, now, write_behind=True)
    admit(c, job("j", 10, now), now)
    sent = [d for d in c.tick(now + 0.25) if isinstance(d, Dispatch)]
    assert len(sent) == 10
    c.flush()
    results = [ResultReceived(d.work.request_id, "j", True, d.work.prompt_tokens, 8) for d in sent]
    for r in results[:4]:
        c.handle(r, now + 0.3)
    c.flush()  # the shell's commit: the first four results are committed with their state
    for r in results[4:7]:
        c.handle(r, now + 0.4)
    assert store.jobs["j"]["prefill_left"] == 6 * 50, "three results read after the flush are not in the store"

    again = ControlCore(c.config, DictStore(dict(store.jobs), dict(store.requests), dict(store.tenants)), seed=2,
                        write_behind=True)
    later = now + 1.0
    again.handle(FleetObserved((pool("a", later), pool("b", later))), later)
    again.handle(ProfilesUpdated(table(["a", "b"], later)), later)
    again.restore(later)
    for r in results[4:]:  # Kafka delivers again what was not committed, then the rest comes
        again.handle(r, later)
    record = again.jobs.jobs["j"]
    assert (record.prefill_left, record.decode_left) == (0, 0), "each request left the backlog once"
    assert "j" not in again.jobs.open
    assert not any(s.status.is_open for s in again.dispatch.requests.values())
