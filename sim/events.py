"""Request statuses (one ordered life cycle) and event kinds of the simulator."""

NEW, QUEUED_PREFILL, PREFILL, TRANSFER, QUEUED_DECODE, DECODE, DONE, LOST, GAVE_UP, CANCELLED = range(10)
"""A request's status: NEW -> QUEUED_PREFILL -> PREFILL -> (TRANSFER -> QUEUED_DECODE ->) DECODE -> DONE;
LOST while a retry waits; GAVE_UP when the driver stops retrying; CANCELLED when its twin
(a speculative copy, or the original) finished first."""

ARRIVE, WAKE, XFER, RELEASE, REFRESH, SAMPLE, FLEET, FAIL, REPAIR, RETRY, TICK = range(11)
"""Event kinds. TICK is the clock of a driver that runs its own control loop (the control core's
dispatch tick, ``sim/core_driver.py``); the others belong to the simulated fleet."""

DEFERRED = object()
"""``Driver.on_lost`` answer: the driver takes the lost request from here (its control loop
places it again, or fails it), so the engine schedules no retry of its own."""
