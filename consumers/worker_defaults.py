"""The data-plane worker's tuning defaults, stated once.

``WorkerOptions``, the prefill stage's ``MicroBatchLimits``, the phase handler's ``WorkerSpec`` and
the ``phaseroute worker`` command line all take their defaults from here. The module imports
nothing, so the command line shows them in its help without loading torch.
"""

PREFILL_MAX_BATCH = 8  # most requests in one prefill micro-batch
PREFILL_MAX_BATCH_TOKENS = 4096  # most prompt tokens in one prefill micro-batch
PREFILL_MAX_WAIT_S = 0.05  # longest the first request of a micro-batch waits for others
MAX_DECODE_BATCH = 32  # most sequences in the continuous decode batch
