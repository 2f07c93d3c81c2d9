"""The line errors of a rejected input file, written where the Batch API reads them.

A job's ``job_event`` carries one readable ``reason``; the full list (OpenAI's
``errors.data``: code, line, message, param; capped by the intake limits, with the total
count) goes to ``tenants/<tenant>/outputs/<job_id>/validation-errors.json`` in the blob store.
"""

from __future__ import annotations

import json
from typing import Any

from phaseroute.infra.blobstore import BlobStore, output_prefix
from phaseroute.streams.intake import IntakeScan

FILE_NAME = "validation-errors.json"


def validation_key(tenant: str, job_id: str) -> str:
    return output_prefix(tenant, job_id) + FILE_NAME


def write_validation_errors(store: BlobStore, tenant: str, job_id: str, scan: IntakeScan) -> None:
    report = {"total": scan.error_count, "data": [e.to_dict() for e in scan.errors]}
    store.put(validation_key(tenant, job_id), json.dumps(report).encode())


def read_validation_errors(store: BlobStore, tenant: str, job_id: str) -> dict[str, Any] | None:
    key = validation_key(tenant, job_id)
    if not store.exists(key):
        return None
    return dict(json.loads(store.get(key)))
