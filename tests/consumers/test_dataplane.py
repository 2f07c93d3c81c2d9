"""The data plane end to end on the real broker, the real model and embedded ClickHouse.

Worker processes are real `phaseroute worker` processes; the sinks are real
`phaseroute sink` processes. Figures (throughput, KV bytes, micro-batch sizes) are printed
so `pytest -s` shows them; the issue note quotes them.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest
from confluent_kafka.admin import AdminClient

from phaseroute.config import settings
from phaseroute.consumers.query_server import remote_query
from phaseroute.infra import provision, topics

from .work import prefill_work, produce, prompts, read_all, start_worker, stop, wait_until_busy

pytestmark = [pytest.mark.kafka, pytest.mark.model, pytest.mark.slow]

N_REQUESTS = 50
MAX_TOKENS = 24


def _output(job_id: str) -> list[dict]:
    """The job's lines as the result sink wrote them into the blob store (tenant of work.py)."""
    from phaseroute.consumers.output_file import iter_part_lines
    from phaseroute.infra.blobstore import open_blob_store, output_prefix

    return list(iter_part_lines(open_blob_store(settings().blob_store), output_prefix("tenant-a", job_id)))


def _wait_for_split(bootstrap: str, group: str, client_ids: list[str], timeout_s: float) -> list[list[int]]:
    """The partitions the broker's group coordinator has assigned to each of ``client_ids``, once
    every one of them holds some and no partition is held twice (a rebalance has settled)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.time() + timeout_s
    held: dict[str, list[int]] = {}
    while time.time() < deadline:
        described = admin.describe_consumer_groups([group])[group].result(timeout=10)
        held = {m.client_id: sorted(tp.partition for tp in m.assignment.topic_partitions) for m in described.members}
        mine = [held.get(c, []) for c in client_ids]
        flat = [p for parts in mine for p in parts]
        if all(mine) and len(flat) == len(set(flat)):
            return mine
        time.sleep(0.5)
    raise AssertionError(f"{client_ids} did not each get partitions of group {group} within {timeout_s:.0f} s: {held}")


def _lines(job_id: str) -> list[dict]:
    return _output(job_id)


def _wait_for(job_id: str, n: int, timeout_s: float, procs: list[subprocess.Popen]) -> list[dict]:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        lines = _lines(job_id)
        if len(lines) >= n:
            return lines
        dead = [p.args for p in procs if p.poll() is not None]
        assert not dead, f"a process died: {dead}"
        time.sleep(0.5)
    raise AssertionError(f"job {job_id}: {len(_lines(job_id))}/{n} results after {timeout_s:.0f} s")


def _tokens(lines: list[dict]) -> dict[str, str]:
    return {ln["custom_id"]: ln["response"]["body"]["choices"][0]["message"]["content"] for ln in lines}


@pytest.fixture(scope="module")
def pools(bootstrap: str) -> dict[str, str]:
    tag = uuid.uuid4().hex[:6]
    names = {"prefill": f"pre-{tag}", "decode": f"dec-{tag}", "both": f"colo-{tag}"}
    specs = [s for pool in names.values() for s in topics.pool_topics(pool)]
    provision.provision(bootstrap, specs)
    return names


@pytest.fixture(scope="module")
def sinks(bootstrap: str, tmp_path_factory: pytest.TempPathFactory):
    logs = tmp_path_factory.mktemp("sink-logs")
    procs = []
    for kind in ("results", "telemetry"):
        log = open(logs / f"{kind}.log", "wb")
        procs.append(subprocess.Popen([sys.executable, "-m", "phaseroute.cli.main", "sink", kind],
                                      stdout=log, stderr=subprocess.STDOUT))
    yield procs
    for proc in procs:
        assert stop(proc) == 0, f"sink {proc.args} did not stop cleanly"


@pytest.fixture(scope="module")
def colocated_run(pools, sinks, bootstrap: str, tmp_path_factory) -> dict[str, str]:
    """Reference: the same prompts through one colocated worker."""
    job_id = f"colo-{uuid.uuid4().hex[:8]}"
    worker = start_worker(pools["both"], "both", log_dir=tmp_path_factory.mktemp("colo"))
    try:
        started = time.time()
        produce(bootstrap, f"prefill.{pools['both']}", [
            (f"{job_id}/r{i:04d}", "prefill_work",
             prefill_work(job_id, i, p, pools["both"], MAX_TOKENS, decode_pool=None, colocated=True))
            for i, p in enumerate(prompts(N_REQUESTS))
        ])
        lines = _wait_for(job_id, N_REQUESTS, 300, [worker, *sinks])
        elapsed = time.time() - started
    finally:
        assert stop(worker) == 0
    completion = sum(ln["response"]["body"]["usage"]["completion_tokens"] for ln in lines)
    print(f"\n[figures] colocated: {N_REQUESTS} requests, {completion} tokens in {elapsed:.1f} s "
          f"({completion / elapsed:.1f} output tokens/s, incl. ~model load)")
    return _tokens(lines)


def test_disaggregated_matches_colocated_token_for_token(pools, sinks, colocated_run, bootstrap, tmp_path) -> None:
    job_id = f"disagg-{uuid.uuid4().hex[:8]}"
    prefill = start_worker(pools["prefill"], "prefill", log_dir=tmp_path)
    decode = start_worker(pools["decode"], "decode", log_dir=tmp_path)
    try:
        started = time.time()
        produce(bootstrap, f"prefill.{pools['prefill']}", [
            (f"{job_id}/r{i:04d}", "prefill_work",
             prefill_work(job_id, i, p, pools["prefill"], MAX_TOKENS, decode_pool=pools["decode"], colocated=False))
            for i, p in enumerate(prompts(N_REQUESTS))
        ])
        lines = _wait_for(job_id, N_REQUESTS, 300, [prefill, decode, *sinks])
        elapsed = time.time() - started
    finally:
        assert stop(prefill) == 0 and stop(decode) == 0
    assert len(lines) == N_REQUESTS and len({ln["custom_id"] for ln in lines}) == N_REQUESTS
    assert _tokens(lines) == colocated_run
    kv_events = [r for r in read_all(bootstrap, "kv.ready", "kv_ready") if r["job_id"] == job_id]
    kv_bytes = sum(r["kv_bytes"] for r in {r["request_id"]: r for r in kv_events}.values())
    completion = sum(ln["response"]["body"]["usage"]["completion_tokens"] for ln in lines)
    print(f"\n[figures] disaggregated: {completion} tokens in {elapsed:.1f} s ({completion / elapsed:.1f} output tokens/s, "
          f"incl. ~model load), KV moved {kv_bytes} bytes for {len(kv_events)} kv.ready events")


def test_kill9_decode_worker_five_times_loses_and_duplicates_nothing(pools, sinks, colocated_run, bootstrap, tmp_path) -> None:
    job_id = f"kill-{uuid.uuid4().hex[:8]}"
    rng = random.Random(7)
    prefill = start_worker(pools["prefill"], "prefill", log_dir=tmp_path)
    decode_args = ("--max-decode-batch", "4")  # several waves: every life of the worker has work to lose
    decode = start_worker(pools["decode"], "decode", *decode_args, log_dir=tmp_path)
    kills, busy_at_kill = 0, []
    try:
        produce(bootstrap, f"prefill.{pools['prefill']}", [
            (f"{job_id}/r{i:04d}", "prefill_work",
             prefill_work(job_id, i, p, pools["prefill"], MAX_TOKENS, decode_pool=pools["decode"], colocated=False))
            for i, p in enumerate(prompts(N_REQUESTS))
        ])
        while kills < 5:
            beat = wait_until_busy(bootstrap, pools["decode"])  # its heartbeat says: sequences in flight
            time.sleep(rng.uniform(0.0, 1.0))
            decode.send_signal(signal.SIGKILL)
            decode.wait(10)
            kills += 1
            busy_at_kill.append(beat["batch_in_flight"])
            decode = start_worker(pools["decode"], "decode", *decode_args, log_dir=tmp_path)
        lines = _wait_for(job_id, N_REQUESTS, 300, [prefill, decode, *sinks])
        time.sleep(3)  # let any late replay arrive: it must not add a line
        lines = _lines(job_id)
    finally:
        stop(prefill)
        stop(decode)
    per_id = Counter(ln["custom_id"] for ln in lines)
    lost = N_REQUESTS - len(per_id)
    duplicated = sum(c - 1 for c in per_id.values())
    raw = Counter(r["request_id"] for r in read_all(bootstrap, "results", "result") if r["job_id"] == job_id)
    print(f"\n[figures] kill -9 x{kills} (in flight at each kill: {busy_at_kill}): lost={lost} duplicated={duplicated}; "
          f"results produced on the topic: "
          f"{sum(raw.values())} for {len(raw)} requests (replays dropped by the sink)")
    assert (lost, duplicated) == (0, 0)
    assert _tokens(lines) == colocated_run  # replays after a crash give the same answers


def test_poison_message_goes_to_dead_letter_and_worker_keeps_running(pools, sinks, bootstrap, tmp_path) -> None:
    job_id = f"poison-{uuid.uuid4().hex[:8]}"
    worker = start_worker(pools["both"], "both", log_dir=tmp_path)
    try:
        huge = prompts(1)[0].replace("What", "word " * 9000 + "What")  # far beyond the 8192-token context
        poison = prefill_work(job_id, 0, huge, pools["both"], MAX_TOKENS, decode_pool=None, colocated=True)
        good = prefill_work(job_id, 1, prompts(2)[1], pools["both"], MAX_TOKENS, decode_pool=None, colocated=True)
        produce(bootstrap, f"prefill.{pools['both']}", [(poison["request_id"], "prefill_work", poison),
                                                        (good["request_id"], "prefill_work", good)])
        lines = _wait_for(job_id, 1, 180, [worker, *sinks])
        assert [ln["custom_id"] for ln in lines] == ["req-1"]
        assert worker.poll() is None, "the worker must keep running after a poison message"
    finally:
        assert stop(worker) == 0
    letters = [d for d in read_all(bootstrap, "deadletter", "dead_letter") if d["source_topic"] == f"prefill.{pools['both']}"]
    assert len(letters) == 1
    assert letters[0]["error_class"] == "PromptTooLongError"
    assert "8192" in letters[0]["reason"] and "tokens" in letters[0]["reason"]


def test_telemetry_of_every_batch_is_in_clickhouse(pools, sinks, colocated_run, bootstrap) -> None:
    ours = set(pools.values())
    produced = {r["batch_id"]: r for r in read_all(bootstrap, "telemetry.phase", "phase_telemetry") if r["pool"] in ours}
    assert produced, "the workers emitted no telemetry"
    pool_list = ", ".join(f"'{p}'" for p in sorted(ours))
    sql = f"SELECT count(DISTINCT batch_id) FROM phaseroute.phase_telemetry WHERE pool IN ({pool_list})"
    deadline = time.time() + 15
    stored = -1
    while time.time() < deadline:
        stored = remote_query(settings().telemetry_port, sql)["rows"][0][0]
        if stored == len(produced):
            break
        time.sleep(0.5)
    assert stored == len(produced)
    recent = (f"SELECT count(DISTINCT batch_id) FROM phaseroute.phase_telemetry WHERE pool IN ({pool_list}) "
              "AND at > now64(3) - INTERVAL 2 HOUR AND at <= now64(3) + INTERVAL 1 MINUTE")
    assert remote_query(settings().telemetry_port, recent)["rows"][0][0] == stored, "timestamps must be stored as times"
    sizes = Counter(r["batch_size"] for r in produced.values() if r["phase"] == "PREFILL")
    decode = [r for r in produced.values() if r["phase"] == "DECODE"]
    print(f"\n[figures] telemetry: {len(produced)} batches in ClickHouse; prefill micro-batch sizes {dict(sorted(sizes.items()))}; "
          f"decode windows {len(decode)}, mean batch {sum(r['batch_size'] for r in decode) / max(1, len(decode)):.1f}")


def test_decode_workers_split_partitions_and_a_joining_worker_rebalances(pools, sinks, colocated_run, bootstrap, tmp_path) -> None:
    job_id = f"scale-{uuid.uuid4().hex[:8]}"
    decode_pool = f"scale-{uuid.uuid4().hex[:6]}"
    provision.provision(bootstrap, list(topics.pool_topics(decode_pool)))
    args = ("--max-decode-batch", "2")  # small batches: work waits in Kafka for the joining worker
    prefill = start_worker(pools["prefill"], "prefill", log_dir=tmp_path)
    decoders = [start_worker(decode_pool, "decode", *args, "--worker-id", f"{decode_pool}-{i}", log_dir=tmp_path) for i in range(2)]
    try:
        started = time.time()
        produce(bootstrap, f"prefill.{pools['prefill']}", [
            (f"{job_id}/r{i:04d}", "prefill_work",
             prefill_work(job_id, i, p, pools["prefill"], MAX_TOKENS, decode_pool=decode_pool, colocated=False))
            for i, p in enumerate(prompts(N_REQUESTS))
        ])
        group = f"phaseroute.decode.{decode_pool}"
        split = _wait_for_split(bootstrap, group, [f"{decode_pool}-{i}" for i in range(2)], 120)
        _wait_for(job_id, 8, 300, [prefill, *decoders, *sinks])
        joined_at = time.time()
        decoders.append(start_worker(decode_pool, "decode", *args, "--worker-id", f"{decode_pool}-2", log_dir=tmp_path))
        joiner_partitions = _wait_for_split(bootstrap, group, [f"{decode_pool}-{i}" for i in range(3)], 120)[2]
        _wait_for(job_id, N_REQUESTS, 300, [prefill, *decoders, *sinks])
        time.sleep(3)
        lines = _lines(job_id)
    finally:
        for proc in [prefill, *decoders]:
            assert stop(proc) == 0
    per_id = Counter(ln["custom_id"] for ln in lines)
    assert len(per_id) == N_REQUESTS and max(per_id.values()) == 1
    assert _tokens(lines) == colocated_run
    decode_batches = [r for r in read_all(bootstrap, "telemetry.phase", "phase_telemetry")
                      if r["pool"] == decode_pool and r["phase"] == "DECODE"]
    before = {r["worker_id"] for r in decode_batches if r["at"] / 1000 < joined_at}
    after = {r["worker_id"] for r in decode_batches if r["at"] / 1000 >= joined_at}
    print(f"\n[figures] scaling: partitions of the two first workers {split}; workers decoding before the join "
          f"{sorted(before)}, after {sorted(after)}; the joining worker was assigned partitions {joiner_partitions}; "
          f"{N_REQUESTS} results exactly once in {time.time() - started:.0f} s")
    # The group's assignment is the fact: decode telemetry flushes per 16-step window, so which
    # workers show up in it before the join depends on the machine's speed, and whether the
    # joiner also decodes depends on the work left on its partitions when the group settles.
    assert all(split) and not set(split[0]) & set(split[1]), "two workers of one pool must split its partitions"
    assert joiner_partitions, "the joining worker must receive partitions after the rebalance"
