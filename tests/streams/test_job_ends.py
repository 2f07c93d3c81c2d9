"""How a job ends, between records: cancellation (the open requests fail once, late ones at
once), completion only on the receipt of the whole output (the job's counters are its output's),
and a dispatcher that reads the last result after the sink wrote it. These drive the live code
path without Faust or Kafka (``plane_fixture.py``): the tracker completes and cancels, the
dispatcher acts on the final states it reads from ``jobs.state``."""

from __future__ import annotations

import time

from .plane_fixture import admit_all, finish, job, plane, prefill, result_of, states, written


def test_cancel_fails_every_open_request_once_and_the_job_ends_when_its_output_is_whole(model_info) -> None:
    """Cancel: CANCELLED at once; queued requests leave the fair queue; every request not yet
    finished gets exactly one failed result with batch_cancelled (a line in the error file); the
    job's counters go on, and a last CANCELLED event says when its output is whole."""
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    admit_all(cp, job("j-c", "acme", 50, 3600, now), now)
    first = [s.record for s in prefill(cp.tick(now + 0.5))]
    assert 0 < len(first) < 50
    done = first[0]
    finish(cp, done, now + 0.8, receipt=False)
    cancel = {"job_id": "j-c", "tenant": "acme", "command": "CANCEL", "at": 0, "reason": "changed my mind"}
    assert cp.record("job_command", dict(cancel, tenant="mallory"), now + 0.9) == [], "another tenant's cancel"
    sends = cp.record("job_command", cancel, now + 1)
    assert states(sends) == ["CANCELLED"]
    failures = [s.record for s in sends if s.topic == "results"]
    assert len(failures) == 49 and {f["error_code"] for f in failures} == {"batch_cancelled"}
    assert done["request_id"] not in {f["request_id"] for f in failures}
    assert not prefill(cp.tick(now + 2)), "nothing of a cancelled job is dispatched"
    for record in failures:  # the failed results come back from the results topic
        cp.record("result", record, now + 3)
    cp.record("result", result_of(first[1], now + 3), now + 3)  # a running attempt finished late: ignored
    last = written(cp, "j-c", 50, now + 4)  # the job's counters are its output's: one line per request
    assert cp.job("j-c")["failed"] == 49 and cp.job("j-c")["done"] == 1
    assert states(last) == ["CANCELLED"] and cp.core.dispatch.by_job.get("j-c") is None


def test_requests_of_a_cancelled_job_read_after_the_cancel_end_at_once_and_keep_no_text(model_info) -> None:
    """A big job cancelled while most of its requests are still on requests.pending: each one read
    later gets its one batch_cancelled line, is never dispatched, and its prompt is not stored."""
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    pending = [s.record for s in cp.submit(job("j-late", "acme", 20, 3600, now), now) if s.topic == "requests.pending"]
    for record in pending[:5]:
        cp.record("request", record, now)
    cancel = {"job_id": "j-late", "tenant": "acme", "command": "CANCEL", "at": 0, "reason": "too big"}
    assert states(cp.record("job_command", cancel, now + 1)) == ["CANCELLED"]
    late = [s for record in pending[5:] for s in cp.record("request", record, now + 2)]
    assert [s.record["error_code"] for s in late if s.topic == "results"] == ["batch_cancelled"] * 15
    assert not set(cp.shell.prompts) & {r["request_id"] for r in pending[5:]}, "no text kept for a request that cannot run"
    assert not prefill(cp.tick(now + 3))


def test_job_completes_only_when_the_sink_has_written_every_line(model_info) -> None:
    """Every result read is not enough: the job's counters and state move with the sink's receipts
    (RUNNING on the first), and COMPLETED waits for the receipt that the output file holds a line
    per request, so a reader of the final event finds the file whole."""
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    admit_all(cp, job("j-w", "acme", 3, 3600, now), now)
    works = [s.record for s in prefill(cp.tick(now + 0.1))]
    assert len(works) == 3
    sends = []
    for i, work in enumerate(works):
        sends += finish(cp, work, now + 1 + i, receipt=False)
    assert "COMPLETED" not in states(sends) and cp.job("j-w")["state"] == "ADMITTED"
    assert states(written(cp, "j-w", 2, now + 5)) == ["RUNNING"] and cp.job("j-w")["done"] == 2
    assert states(written(cp, "j-w", 3, now + 6)) == ["COMPLETED"]
    assert cp.job("j-w")["finished_at"] == now + 6
    assert written(cp, "j-w", 3, now + 7) == [], "a replayed receipt changes nothing"
    assert not cp.requests() and not cp.shell.prompts, "a finished job's requests and texts are forgotten"


def test_a_receipt_ahead_of_the_dispatchers_last_result_completes_the_job_and_the_result_is_forgotten(model_info) -> None:
    """Receipts and results come on different topics, read by different parts: the sink may have
    written every line while the dispatcher has not read the last result yet. The receipt
    completes the job; a replayed receipt with an older count never lowers what is known to be
    written; the dispatcher forgets the last request when it reads its result."""
    now = time.time()
    cp = plane(model_info, {"colo": "BOTH"}, now)
    admit_all(cp, job("j-r", "acme", 2, 3600, now), now)
    works = [s.record for s in prefill(cp.tick(now + 0.1))]
    finish(cp, works[0], now + 1, receipt=False)
    cp.lines["j-r"][works[1]["request_id"]] = result_of(works[1], now + 1)  # the sink read it, the dispatcher not yet
    assert "COMPLETED" in states(written(cp, "j-r", 2, now + 2))
    assert written(cp, "j-r", 1, now + 3) == []  # an older receipt, replayed
    assert cp.job("j-r")["lines_written"] == 2 and cp.job("j-r")["state"] == "COMPLETED"
    assert [r.request_id for r in cp.requests()] == [works[1]["request_id"]], "still running, for the dispatcher"
    assert finish(cp, works[1], now + 4, receipt=False) == [] and not cp.requests() and not cp.shell.prompts
