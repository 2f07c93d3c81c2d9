"""``/v1/batches``: create (idempotent), retrieve, list (cursor pages), cancel.

A create checks the request (endpoint, completion window, metadata), claims its idempotency
record, stores the batch, and publishes a ``job_submitted`` whose ``input_file`` is the blob
key of the tenant's own file; validation of the file's lines happens at admission (the batch
is ``validating`` until then, ``failed`` with ``errors`` if the file or the window is refused).
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request

from phaseroute.api.auth import authenticate
from phaseroute.api.batch_options import BatchOptions, batch_options, check_metadata
from phaseroute.api.batch_view import FINAL, batch_view
from phaseroute.api.errors import ERROR_RESPONSES, ApiError, not_found
from phaseroute.api.file_store import new_id
from phaseroute.api.kafka_io import BrokerUnavailable
from phaseroute.api.wire import Batch, BatchList, CreateBatch
from phaseroute.infra.blobstore import file_key, output_prefix

router = APIRouter(prefix="/v1/batches", tags=["batches"], responses=ERROR_RESPONSES)
Tenant = Annotated[str, Depends(authenticate)]
DEFAULT_MAX_TOKENS = 256


def first_line_model(state: Any, tenant: str, file_id: str) -> str | None:
    """``body.model`` of the file's first line (the batch's model), if it says one."""
    with state.store.reader(file_key(tenant, file_id)) as fh:
        line = fh.readline(1 << 20)
    try:
        model = json.loads(line)["body"]["model"]
    except (ValueError, KeyError, TypeError):
        return None
    return model if isinstance(model, str) and model else None


def job_record(batch: dict[str, Any], options: BatchOptions, now_ms: int) -> dict[str, Any]:
    return {
        "job_id": batch["id"], "tenant": batch["tenant"], "priority": options.priority, "submitted_at": now_ms,
        "deadline": now_ms + int(options.window_s * 1000), "model": batch["model"],
        "quality_tier": options.quality_tier, "quality_tolerance": options.quality_tolerance,
        "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "max_tokens": DEFAULT_MAX_TOKENS, "seed": None,
                     "stop": []},
        "requests": [], "input_file": file_key(batch["tenant"], batch["input_file_id"]),
        "output_file": output_prefix(batch["tenant"], batch["id"]),
        "metadata": {"endpoint": batch["endpoint"], "input_file_id": batch["input_file_id"]},
    }


@router.post("", response_model=Batch)
def create_batch(request: Request, tenant: Tenant, body: CreateBatch,
                 idempotency_key: Annotated[str | None, Header(alias="Idempotency-Key", max_length=256)] = None) -> Batch:
    state = request.app.state
    metadata = check_metadata(body.metadata)
    options = batch_options(body.completion_window, metadata)
    file = state.files.get(tenant, body.input_file_id)
    if file is None:
        raise not_found("file", body.input_file_id)
    if file["purpose"] != "batch":
        raise ApiError(400, f"file {body.input_file_id!r} has purpose {file['purpose']!r}; a batch input needs 'batch'",
                       "invalid_input_file", "input_file_id")
    now = time.time()
    canonical = body.model_dump(mode="json")
    try:
        batch_id, owner = state.batches.claim(tenant, idempotency_key, canonical, new_id("batch_", int(now * 1000)), now)
    except ValueError as exc:
        raise ApiError(400, str(exc), "idempotency_key_reused", "Idempotency-Key") from None
    if not owner:
        return batch_view(state, _wait_for_record(state, tenant, batch_id))
    record = {"id": batch_id, "tenant": tenant, "endpoint": body.endpoint, "input_file_id": body.input_file_id,
              "completion_window": body.completion_window, "metadata": metadata, "created_at": int(now),
              "expires_at": int(now + options.window_s),
              "model": first_line_model(state, tenant, body.input_file_id) or state.settings_default_model}
    state.batches.put(record)
    try:
        state.publish([("jobs.submitted", batch_id, "job_submitted", job_record(record, options, int(now * 1000)))])
    except (BrokerUnavailable, RuntimeError) as exc:
        state.batches.delete(tenant, batch_id)
        state.batches.release(tenant, idempotency_key, canonical)
        raise ApiError(503, f"the batch could not be queued: {exc}", "service_unavailable") from None
    return batch_view(state, record)


def _wait_for_record(state: Any, tenant: str, batch_id: str, wait_s: float = 5.0) -> dict[str, Any]:
    deadline = time.time() + wait_s
    while True:
        record: dict[str, Any] | None = state.batches.get(tenant, batch_id)
        if record is not None:
            return record
        if time.time() > deadline:
            raise ApiError(503, f"batch {batch_id!r} is still being created by another request; retry",
                           "service_unavailable")
        time.sleep(0.05)


@router.get("", response_model=BatchList)
def list_batches(request: Request, tenant: Tenant, after: str | None = None,
                 limit: Annotated[int, Query(ge=1, le=100)] = 20) -> BatchList:
    records, more = request.app.state.batches.page(tenant, after, limit)
    data = [batch_view(request.app.state, r) for r in records]
    return BatchList(data=data, first_id=data[0].id if data else None, last_id=data[-1].id if data else None,
                     has_more=more)


def _batch(request: Request, tenant: str, batch_id: str) -> dict[str, Any]:
    record: dict[str, Any] | None = request.app.state.batches.get(tenant, batch_id)
    if record is None:
        raise not_found("batch", batch_id)
    return record


@router.get("/{batch_id}", response_model=Batch)
def retrieve_batch(request: Request, tenant: Tenant, batch_id: str) -> Batch:
    return batch_view(request.app.state, _batch(request, tenant, batch_id))


@router.post("/{batch_id}/cancel", response_model=Batch)
def cancel_batch(request: Request, tenant: Tenant, batch_id: str) -> Batch:
    state = request.app.state
    record = _batch(request, tenant, batch_id)
    current = batch_view(state, record)
    if current.status in FINAL:
        raise ApiError(400, f"batch {batch_id!r} is {current.status}; only an unfinished batch can be cancelled",
                       "batch_not_cancellable")
    if not record.get("cancelling_at"):
        record = dict(record, cancelling_at=int(time.time()))
        try:
            state.send_cancel(record)
        except (BrokerUnavailable, RuntimeError) as exc:
            raise ApiError(503, f"the cancel could not be sent: {exc}", "service_unavailable") from None
    return batch_view(state, state.batches.get(tenant, batch_id) or record)
