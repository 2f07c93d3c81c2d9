"""The result sink's outputs and receipts, without Kafka: one line per custom id in the job's
blob-store prefix, and a receipt per job in each batch that counts the lines already written
and tallies them (success and error lines, tokens in and out)."""

from __future__ import annotations

from pathlib import Path

import pytest

from phaseroute.consumers.handler import WorkItem
from phaseroute.consumers.output_file import JobOutput, OutputTally, is_error_line, iter_part_lines, openai_batch_line
from phaseroute.consumers.result_sink import RECEIPT_TOPIC, ResultSinkHandler
from phaseroute.infra.blobstore import BlobStore, output_prefix
from phaseroute.schemas.examples import example
from phaseroute.schemas.records import OutputWritten
from phaseroute.schemas.serde import decode, encode

FAILED = {"status": "FAILED", "output_text": "", "finish_reason": "ERROR", "error": "cancelled by the tenant"}


def _item(offset: int, job_id: str, custom_id: str, tenant: str = "acme", **extra) -> WorkItem:
    record = dict(example("result"), job_id=job_id, custom_id=custom_id, request_id=f"{job_id}/{custom_id}",
                  tenant=tenant, **extra)
    return WorkItem(("results", 0), offset, "result", record, received_at=0.0, produced_at=0.0)


def _receipts(done) -> list[dict]:
    return [out.record for c in done for out in c.outputs if out.topic == RECEIPT_TOPIC]


def _ids(store: BlobStore, job_id: str, tenant: str = "acme") -> list[str]:
    return [line["custom_id"] for line in iter_part_lines(store, output_prefix(tenant, job_id))]


@pytest.fixture(params=["dir", "memory"])
def store(request, tmp_path: Path) -> BlobStore:
    """The same sink on a local directory and on fsspec's memory filesystem."""
    return BlobStore(str(tmp_path / "blobs")) if request.param == "dir" else BlobStore(f"memory://sink-{tmp_path.name}")


def test_each_batch_sends_one_receipt_per_job_with_the_lines_written(store: BlobStore) -> None:
    sink = ResultSinkHandler(store, writer="result-sink.test")
    done = sink.admit([_item(0, "job-a", "q0"), _item(1, "job-b", "q0"), _item(2, "job-a", "q1"),
                       _item(3, "job-a", "q0")])  # a speculative copy of job-a/q0: dropped by custom id
    receipts = {r["job_id"]: r for r in _receipts(done)}
    assert {k: r["lines"] for k, r in receipts.items()} == {"job-a": 2, "job-b": 1}
    assert receipts["job-a"]["path"] == "tenants/acme/outputs/job-a/" and receipts["job-a"]["writer"] == "result-sink.test"
    assert done[3].outputs and not done[0].outputs, "the receipt rides on the job's last item, produced before its commit"
    assert _ids(store, "job-a") == ["q0", "q1"]
    assert (sink.written, sink.duplicates) == (3, 1)


def test_a_restarted_sink_replaying_its_tail_receipts_every_line(store: BlobStore) -> None:
    first = ResultSinkHandler(store, writer="result-sink.1")
    first.admit([_item(0, "job-a", "q0"), _item(1, "job-a", "q1")])
    first.close()
    again = ResultSinkHandler(store, writer="result-sink.2")  # offsets were not committed: the tail comes back
    done = again.admit([_item(1, "job-a", "q1"), _item(2, "job-a", "q2")])
    assert [r["lines"] for r in _receipts(done)] == [3]
    assert sorted(_ids(store, "job-a")) == ["q0", "q1", "q2"]


def test_a_job_id_that_cannot_name_a_key_is_dead_lettered_without_a_receipt(store: BlobStore) -> None:
    sink = ResultSinkHandler(store, writer="result-sink.test")
    done = sink.admit([_item(0, "../escape", "q0"), _item(1, "job-x", "q0", tenant="../../etc")])
    assert done[0].dead_letter_reason == "job id '../escape' of tenant 'acme' cannot name an output in the blob store"
    assert done[1].dead_letter_reason is not None and "'../../etc'" in done[1].dead_letter_reason
    assert _receipts(done) == []


def test_failed_results_become_error_lines_with_their_error_code(store: BlobStore) -> None:
    sink = ResultSinkHandler(store, writer="result-sink.test")
    sink.admit([_item(0, "job-c", "q0"), _item(1, "job-c", "q1", **FAILED),
                _item(2, "job-c", "q2", **FAILED, error_code="batch_cancelled")])
    lines = {line["custom_id"]: line for line in iter_part_lines(store, output_prefix("acme", "job-c"))}
    assert not is_error_line(lines["q0"]) and lines["q0"]["response"]["body"]["object"] == "chat.completion"
    assert lines["q1"]["error"] == {"code": "request_failed", "message": "cancelled by the tenant"}
    assert lines["q2"]["error"]["code"] == "batch_cancelled" and lines["q2"]["response"] is None


def _line(custom_id: str, prompt_tokens: int = 21, completion_tokens: int = 9, **extra) -> dict:
    return openai_batch_line(_item(0, "job-t", custom_id, prompt_tokens=prompt_tokens,
                                   completion_tokens=completion_tokens, **extra).record)


def test_the_tally_counts_each_custom_id_once_and_error_lines_without_tokens(store: BlobStore) -> None:
    out = JobOutput(store, "acme", "job-t")
    assert out.tally == OutputTally()
    assert out.write_part(0, 0, [_line("q0", 10, 3), _line("q1", **FAILED), _line("q0", 99, 99)]) == 2
    assert out.write_part(0, 3, [_line("q0", 10, 3), _line("q2", 7, 5), _line("q1", **FAILED)]) == 1
    assert out.write_part(0, 6, [_line("q2", 7, 5)]) == 0  # all duplicates: no part, no count
    assert out.tally == OutputTally(lines=3, ok=2, failed=1, tokens_in=17, tokens_out=8)
    assert out.tally.lines == len(out.written)

    again = JobOutput(store, "acme", "job-t")  # a restarted sink counts the same from the parts
    assert again.tally == out.tally and again.written == out.written


def test_a_success_line_without_a_token_count_is_written_and_counts_no_tokens(store: BlobStore) -> None:
    bad = _line("q0")
    bad["response"]["body"]["usage"]["completion_tokens"] = "9"
    out = JobOutput(store, "acme", "job-t")
    assert out.write_part(0, 0, [bad]) == 1  # a line is never refused for its usage
    assert out.tally == OutputTally(lines=1, ok=1, tokens_in=out.tally.tokens_in, tokens_out=0)
    assert _ids(store, "job-t") == ["q0"]


def test_receipts_carry_the_tallies_and_encode_with_the_avro_schema(store: BlobStore) -> None:
    sink = ResultSinkHandler(store, writer="result-sink.1")
    first = _receipts(sink.admit([_item(0, "job-a", "q0", prompt_tokens=10, completion_tokens=4),
                                  _item(1, "job-a", "q1", **FAILED)]))
    assert [(r["lines"], r["ok"], r["failed"], r["tokens_in"], r["tokens_out"]) for r in first] == [(2, 1, 1, 10, 4)]
    sink.close()

    again = ResultSinkHandler(store, writer="result-sink.2")  # replays q1, adds q2
    (receipt,) = _receipts(again.admit([_item(1, "job-a", "q1", **FAILED),
                                        _item(2, "job-a", "q2", prompt_tokens=6, completion_tokens=2)]))
    kind, decoded = decode(encode("output_written", receipt), expected_kind="output_written")
    assert kind == "output_written" and decoded == receipt
    typed = OutputWritten.from_dict(decoded)
    assert (typed.lines, typed.ok, typed.failed, typed.tokens_in, typed.tokens_out) == (3, 2, 1, 16, 6)
