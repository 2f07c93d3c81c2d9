"""One realistic example record per message kind, all telling the same story: tenant acme
submits a two-request job on SmolLM2-135M-Instruct; request q-0001 is prefilled on pool
cpu-fp32-a, its KV moves to pool cpu-int8-b for decode, and the result comes back.

Tests (unit and integration) take their records from here: `example(kind)` returns a fresh
deep copy, so a test may mutate it freely.
"""

from __future__ import annotations

import copy
from typing import Any

from phaseroute.schemas.ids import attempt_id, job_event_id, request_id

T0 = 1_795_953_600_000  # 2026-11-29T12:00:00Z in epoch milliseconds
JOB_ID = "acme-eval-2026-11-29-001"
TENANT = "acme"
MODEL = "SmolLM2-135M-Instruct"
CUSTOM_ID = "q-0001"
REQUEST_ID = request_id(JOB_ID, CUSTOM_ID)
PREFILL_ATTEMPT = attempt_id(REQUEST_ID, "prefill", 0)
DECODE_ATTEMPT = attempt_id(REQUEST_ID, "decode", 0)
DEADLINE = T0 + 3_600_000
PROMPT = "<|im_start|>user\nName three prime numbers.<|im_end|>\n<|im_start|>assistant\n"
KV_LOCATION = f"file:///var/lib/phaseroute/kv/{REQUEST_ID}/prefill-0.safetensors"
KV_BYTES = 21 * 46_080  # 21 prompt tokens x 46,080 bytes/token (fp32 SmolLM2-135M)
KV_CHECKSUM = "sha256:9f2c1e7a4b0d3c5e8f6a1b2c3d4e5f60718293a4b5c6d7e8f9a0b1c2d3e4f5a6"
SAMPLING = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": 64, "seed": 1234, "stop": ["<|im_end|>"]}

_EXAMPLES: dict[str, dict[str, Any]] = {
    "job_submitted": {
        "job_id": JOB_ID, "tenant": TENANT, "priority": 1, "submitted_at": T0, "deadline": DEADLINE,
        "model": MODEL, "quality_tier": "APPROXIMATE", "quality_tolerance": 0.02, "sampling": SAMPLING,
        "requests": [
            {"custom_id": CUSTOM_ID, "prompt": None, "max_tokens": 32,
             "messages": [{"role": "user", "content": "Name three prime numbers."}]},
            {"custom_id": "q-0002", "prompt": "The capital of France is", "messages": None, "max_tokens": None},
        ],
        "input_file": None, "output_file": None, "metadata": {"project": "eval-smoke"},
    },
    "job_command": {"job_id": JOB_ID, "tenant": TENANT, "command": "CANCEL", "at": T0 + 60_000,
                    "reason": "superseded by acme-eval-2026-11-29-002"},
    "job_event": {
        "event_id": job_event_id(JOB_ID, "PROGRESS", 1), "job_id": JOB_ID, "tenant": TENANT,
        "kind": "PROGRESS", "state": "RUNNING", "reason": None, "earliest_feasible_deadline": None,
        "model": MODEL, "priority": 1, "submitted_at": T0, "deadline": DEADLINE,
        "requests_total": 2, "requests_done": 1, "requests_failed": 0, "tokens_in": 21, "tokens_out": 9,
        "deadline_missed": False, "lines_written": 1, "output_file": f"tenants/{TENANT}/outputs/{JOB_ID}/",
        "at": T0 + 4_200,
    },
    "request": {
        "request_id": REQUEST_ID, "job_id": JOB_ID, "tenant": TENANT, "custom_id": CUSTOM_ID, "priority": 1,
        "submitted_at": T0, "deadline": DEADLINE, "model": MODEL, "prompt": PROMPT, "prompt_tokens": 21,
        "max_tokens": 32, "sampling": SAMPLING, "quality_tier": "APPROXIMATE", "quality_tolerance": 0.02,
        "pinned_prefill_pool": None, "pinned_decode_pool": None, "canary": None,
    },
    "prefill_work": {
        "attempt_id": PREFILL_ATTEMPT, "request_id": REQUEST_ID, "job_id": JOB_ID, "tenant": TENANT,
        "custom_id": CUSTOM_ID, "attempt": 0, "pool": "cpu-fp32-a", "model": MODEL, "prompt": PROMPT,
        "prompt_tokens": 21, "max_tokens": 32, "sampling": SAMPLING, "priority": 1, "deadline": DEADLINE,
        "colocated": False, "decode_pool": "cpu-int8-b", "quality_tier": "APPROXIMATE", "dispatched_at": T0 + 250,
        "canary": None,
    },
    "kv_ready": {
        "attempt_id": PREFILL_ATTEMPT, "request_id": REQUEST_ID, "job_id": JOB_ID, "tenant": TENANT,
        "custom_id": CUSTOM_ID, "attempt": 0, "prefill_pool": "cpu-fp32-a", "worker_id": "cpu-fp32-a-0",
        "model": MODEL, "variant": "fp32", "kv_location": KV_LOCATION, "kv_bytes": KV_BYTES,
        "kv_checksum": KV_CHECKSUM, "kv_layout_version": 1, "prompt_tokens": 21, "first_token": 504,
        "max_tokens": 32, "sampling": SAMPLING, "priority": 1, "deadline": DEADLINE,
        "quality_tier": "APPROXIMATE", "decode_pool": "cpu-int8-b", "prefill_time_s": 0.041,
        "queue_wait_s": 0.012, "created_at": T0 + 310,
    },
    "decode_work": {
        "attempt_id": DECODE_ATTEMPT, "request_id": REQUEST_ID, "job_id": JOB_ID, "tenant": TENANT,
        "custom_id": CUSTOM_ID, "attempt": 0, "pool": "cpu-int8-b", "model": MODEL, "source_pool": "cpu-fp32-a",
        "prefill_attempt_id": PREFILL_ATTEMPT, "kv_location": KV_LOCATION, "kv_bytes": KV_BYTES,
        "kv_checksum": KV_CHECKSUM, "kv_layout_version": 1, "prompt_tokens": 21, "first_token": 504,
        "max_tokens": 32, "sampling": SAMPLING, "priority": 1, "deadline": DEADLINE,
        "quality_tier": "APPROXIMATE", "prefill_time_s": 0.041, "dispatched_at": T0 + 330,
        "canary": None, "canary_trace": None,
    },
    "result": {
        "request_id": REQUEST_ID, "job_id": JOB_ID, "tenant": TENANT, "custom_id": CUSTOM_ID,
        "attempt_id": DECODE_ATTEMPT, "attempt": 0, "model": MODEL, "status": "OK",
        "output_text": "2, 3 and 5.", "output_token_ids": [504, 28, 216, 46, 284, 216, 47, 30, 2],
        "finish_reason": "STOP", "prompt_tokens": 21, "completion_tokens": 9, "prefill_pool": "cpu-fp32-a",
        "decode_pool": "cpu-int8-b", "colocated": False, "prefill_time_s": 0.041, "decode_time_s": 0.118,
        "kv_transfer_s": 0.0031, "kv_bytes": KV_BYTES, "error": None, "error_code": None, "completed_at": T0 + 480,
        "canary": None, "canary_trace": None,
    },
    "output_written": {
        "job_id": JOB_ID, "lines": 1, "ok": 1, "failed": 0, "tokens_in": 21, "tokens_out": 9,
        "path": f"tenants/{TENANT}/outputs/{JOB_ID}/",
        "writer": "result-sink.4242", "at": T0 + 510,
    },
    "job_admission": {
        "job_id": JOB_ID, "tenant": TENANT, "model": MODEL, "priority": 1, "submitted_at": T0, "deadline": T0 + 3_600_000,
        "quality_tier": "EXACT", "state": "ADMITTED", "reason": "estimated completion 2026-12-06T10:00:40Z",
        "requests_total": 1, "prefill_left": 21, "decode_left": 64, "estimated_completion": T0 + 40_000,
        "submissions": 1, "desk": "control-1@host:4242", "at": T0 + 120,
    },
    "load_snapshot": {
        "at": T0 + 1_000, "dispatcher": "control-1@host:4242", "admissions_through": T0 + 120, "queued_requests": 1,
        "backlog": [{"job_id": JOB_ID, "tenant": TENANT, "model": MODEL, "deadline": T0 + 3_600_000,
                     "prefill_left": 21, "decode_left": 64}],
        "fleet": [{"model": MODEL, "prefill_tokens_per_s": 412.5, "decode_tokens_per_s": 96.0}],
    },
    "phase_telemetry": {
        "batch_id": "cpu-int8-b-0/000173", "pool": "cpu-int8-b", "worker_id": "cpu-int8-b-0", "model": MODEL,
        "phase": "DECODE", "variant": "int8-dynamic", "batch_size": 8, "tokens_in": 0, "tokens_out": 72,
        "seq_len_mean": 29.5, "seq_len_max": 41, "queue_wait_s": 0.004, "exec_time_s": 0.118, "steps": 9,
        "step_latency_s": 0.0131, "step_latency_s_max": 0.0172, "kv_bytes": KV_BYTES, "kv_transfer_s": 0.0031,
        "source_pool": "cpu-fp32-a", "status": "OK", "error_class": None, "at": T0 + 480,
    },
    "attempt_failed": {
        "attempt_id": DECODE_ATTEMPT, "request_id": REQUEST_ID, "job_id": JOB_ID, "tenant": TENANT, "attempt": 0,
        "phase": "DECODE", "pool": "cpu-int8-b", "worker_id": "cpu-int8-b-0", "error_class": "KVIntegrityError",
        "error": "KV blob at file:///var/lib/phaseroute/kv/x.kv: CRC-32 0x1c291ca3 does not match 0x00000000",
        "retryable": True, "at": T0 + 470,
    },
    "pool_heartbeat": {
        "pool": "cpu-int8-b", "worker_id": "cpu-int8-b-0", "phase": "DECODE", "variant": "int8-dynamic",
        "device": "cpu", "models": [MODEL], "queue_depth": 3, "consumer_lag": 5, "batch_in_flight": 8,
        "max_batch": 32, "memory_bytes": 812_000_000, "kv_free_bytes": 1_500_000_000,
        "kv_capacity_bytes": 4_000_000_000,
        "kv_format": "SmolLM2-135M-Instruct|float32|30x3x64|v1", "host": "node-2",
        "pid": 41_877, "status": "UP", "started_at": T0 - 600_000, "interval_s": 5.0, "at": T0 + 500,
    },
    "profile_row": {
        "model": MODEL, "phase": "DECODE", "pool": "cpu-int8-b", "variant": "int8-dynamic", "source_pool": None,
        "source": "TELEMETRY",
        "batch_curve": [{"batch_size": 1, "tokens_per_s": 38.0}, {"batch_size": 8, "tokens_per_s": 152.0},
                        {"batch_size": 32, "tokens_per_s": 396.0}],
        "step_latency_s_p50": 0.013, "step_latency_s_p90": 0.016, "step_latency_s_p99": 0.024,
        "tokens_per_s": 152.0, "mem_bytes_per_token": 23_040.0, "kv_bytes_per_token": 46_080.0,
        "transfer_bytes_per_s": None, "transfer_latency_s": None, "error_rate": 0.001, "quality_score": 0.97,
        "samples": 1_843, "window_s": 900.0, "updated_at": T0 + 60_000, "path_quality": None,
    },
    "drift_measurement": {
        "measurement_id": f"{MODEL}|cpu-fp32-a|cpu-int8-b|12", "model": MODEL, "prefill_pool": "cpu-fp32-a",
        "decode_pool": "cpu-int8-b", "colocated": False, "prefill_variant": "fp32", "decode_variant": "int8-dynamic",
        "canary_set": "smollm2-135m/v1", "round": 12, "canaries_sent": 16, "canaries_received": 16, "positions": 120,
        "greedy_agreement": 0.0417, "top1_agreement": 0.6167, "mean_kl": 0.7036, "max_kl": 2.4818,
        "first_divergence_mean": 0.125, "first_divergence_min": 0, "quality_score": 0.6167, "exact_ok": False,
        "state": "DEMOTED", "reason": "mean KL 0.7036 nats > 1e-06 (EXACT)", "at": T0 + 90_000,
    },
    "quality_alert": {
        "alert_id": f"{MODEL}|cpu-fp32-a|cpu-int8-b|DEMOTED|12", "model": MODEL, "prefill_pool": "cpu-fp32-a",
        "decode_pool": "cpu-int8-b", "colocated": False, "kind": "DEMOTED",
        "reason": "mean KL 0.7036 nats > 1e-06 (EXACT) in 1 consecutive round(s)", "greedy_agreement": 0.0417,
        "top1_agreement": 0.6167, "mean_kl": 0.7036, "max_kl": 2.4818,
        "measurement_id": f"{MODEL}|cpu-fp32-a|cpu-int8-b|12", "at": T0 + 90_000,
    },
    "tenant": {
        "name": TENANT, "weight": 2.0, "max_in_flight": 64, "max_queued_tokens": 2_000_000, "max_running_jobs": 10,
        "keys": [{"key_id": "3f9a1c0b7d2e", "key_hash": "sha256:3f9a1c0b7d2e" + "0" * 52, "created_at": T0 - 86_400_000,
                  "revoked_at": None}],
        "disabled": False, "updated_at": T0 - 86_400_000,
    },
    "dead_letter": {
        "source_topic": "jobs.submitted", "partition": 0, "offset": 1_207, "key": JOB_ID.encode(),
        "value": b'{"job_id": "acme-eval-2026-11-29-001"}',
        "reason": "not Avro single-object encoding: first bytes 0x7b226a6f625f6964223a "
                  "('{\"job_id\":': looks like text or JSON); expected 0xC3 0x01 + 8-byte fingerprint",
        "error_class": "NotSingleObjectError", "stage": "DECODE", "expected_kind": "job_submitted",
        "traceback": None, "service": "admission", "at": T0 + 5_000,
    },
}

KINDS: tuple[str, ...] = tuple(_EXAMPLES)


def example(kind: str) -> dict[str, Any]:
    """A fresh, complete example record of `kind` (every field set, so it round-trips equal)."""
    try:
        return copy.deepcopy(_EXAMPLES[kind])
    except KeyError:
        raise KeyError(f"no example for kind {kind!r}; examples exist for {', '.join(KINDS)}") from None
