"""The front door: an OpenAI-compatible Batch API (Files + Batches) with per-tenant keys.

Life of a batch through this package: a producer uploads its input file (``files_routes``:
stored under the tenant's prefix in the blob store), creates a batch (``batches_routes``:
a ``job_submitted`` record on ``jobs.submitted`` whose ``input_file`` is a blob key), and polls
it (``jobs_view`` follows the compacted ``jobs.state`` topic; ``status_map`` turns a job state
into one of the eight OpenAI statuses). When the job is final, ``outputs`` assembles the output
and error files from the lines the result sink wrote, and the producer downloads them.
Every route authenticates a bearer key against the tenant registry (``registry``), and every
lookup goes through the caller's own prefix, so another tenant's objects are simply not found.
"""
