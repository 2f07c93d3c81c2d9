"""Request statuses (one ordered life cycle) and event kinds of the simulator."""

NEW, QUEUED_PREFILL, PREFILL, TRANSFER, QUEUED_DECODE, DECODE, DONE, LOST, GAVE_UP, CANCELLED = range(10)
"""A request's status: NEW -> QUEUED_PREFILL -> PREFILL -> (TRANSFER -> QUEUED_DECODE ->) DECODE -> DONE;
LOST while a retry waits; GAVE_UP when the driver stops retrying; CANCELLED when its twin
(a speculative copy, or the original) finished first."""

ARRIVE, WAKE, XFER, RELEASE, REFRESH, SAMPLE, FLEET, FAIL, REPAIR, RETRY = range(10)
