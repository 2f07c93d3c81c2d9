"""The result sink's file and receipts, without Kafka: one line per custom id, and a receipt
per job in each batch that counts the lines already fsynced."""

from __future__ import annotations

import json
from pathlib import Path

from phaseroute.consumers.handler import WorkItem
from phaseroute.consumers.result_sink import RECEIPT_TOPIC, ResultSinkHandler
from phaseroute.schemas.examples import example


def _item(offset: int, job_id: str, custom_id: str) -> WorkItem:
    record = dict(example("result"), job_id=job_id, custom_id=custom_id, request_id=f"{job_id}/{custom_id}")
    return WorkItem(("results", 0), offset, "result", record, received_at=0.0, produced_at=0.0)


def _receipts(done) -> list[dict]:
    return [out.record for c in done for out in c.outputs if out.topic == RECEIPT_TOPIC]


def test_each_batch_sends_one_receipt_per_job_with_the_lines_on_disk(tmp_path: Path) -> None:
    sink = ResultSinkHandler(tmp_path, writer="result-sink.test")
    done = sink.admit([_item(0, "job-a", "q0"), _item(1, "job-b", "q0"), _item(2, "job-a", "q1"),
                       _item(3, "job-a", "q0")])  # a speculative copy of job-a/q0: dropped by custom id
    receipts = {r["job_id"]: r for r in _receipts(done)}
    assert {k: r["lines"] for k, r in receipts.items()} == {"job-a": 2, "job-b": 1}
    assert receipts["job-a"]["path"] == str(tmp_path / "job-a.jsonl") and receipts["job-a"]["writer"] == "result-sink.test"
    assert done[3].outputs and not done[0].outputs, "the receipt rides on the job's last item, produced before its commit"
    lines = (tmp_path / "job-a.jsonl").read_text().splitlines()
    assert [json.loads(line)["custom_id"] for line in lines] == ["q0", "q1"]
    assert (sink.written, sink.duplicates) == (3, 1)


def test_a_restarted_sink_replaying_its_tail_receipts_the_whole_file(tmp_path: Path) -> None:
    first = ResultSinkHandler(tmp_path, writer="result-sink.1")
    first.admit([_item(0, "job-a", "q0"), _item(1, "job-a", "q1")])
    first.close()
    again = ResultSinkHandler(tmp_path, writer="result-sink.2")  # offsets were not committed: the tail comes back
    done = again.admit([_item(1, "job-a", "q1"), _item(2, "job-a", "q2")])
    assert [r["lines"] for r in _receipts(done)] == [3]
    assert len((tmp_path / "job-a.jsonl").read_text().splitlines()) == 3


def test_a_job_id_that_cannot_name_a_file_is_dead_lettered_without_a_receipt(tmp_path: Path) -> None:
    sink = ResultSinkHandler(tmp_path, writer="result-sink.test")
    done = sink.admit([_item(0, "../escape", "q0")])
    assert done[0].dead_letter_reason == "job id '../escape' cannot name an output file"
    assert _receipts(done) == []
