"""A finished batch's output and error files, assembled from the result sink's part objects.

The sink writes lines as they come (``tenants/<t>/outputs/<batch>/part-*.jsonl``); once the
batch is final the API streams those parts once, keeps the first line per custom id, and
writes two files of purpose ``batch_output``: successes to the output file, every other line
(``request_failed``, ``batch_cancelled``, ``batch_expired``...) to the error file. A file with
no lines is not made (its id stays null, as at OpenAI). ``assembled.json`` records how many
parts went in: if more appear later (late lines of a cancelled batch), the files are made
again. File ids are derived from the batch id, so two API processes make the same files.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from phaseroute.api.file_store import FileStore
from phaseroute.consumers.output_file import (
    PART_PREFIX,
    as_text_completion,
    is_error_line,
    iter_part_lines,
    unique_lines,
)
from phaseroute.infra.blobstore import (
    BlobNotFoundError,
    BlobStore,
    file_key,
    output_prefix,
)

MARKER = "assembled.json"


def output_file_ids(batch_id: str) -> tuple[str, str]:
    stamp = batch_id.removeprefix("batch_")[:11]
    output_id, errors_id = (f"file-{stamp}{hashlib.sha256(f'{batch_id}/{kind}'.encode()).hexdigest()[:12]}"
                            for kind in ("output", "errors"))
    return output_id, errors_id


def assemble(store: BlobStore, files: FileStore, batch: dict[str, Any], finished_at: int) -> tuple[str | None, str | None]:
    """(output_file_id, error_file_id) of a final batch, making the files when needed."""
    tenant, batch_id = batch["tenant"], batch["id"]
    prefix = output_prefix(tenant, batch_id)
    parts = [k for k in store.list(prefix) if k.rsplit("/", 1)[-1].startswith(PART_PREFIX)]
    try:
        marker = json.loads(store.get(prefix + MARKER))
        if marker["parts"] == len(parts):
            return marker["output_file_id"], marker["error_file_id"]
    except BlobNotFoundError:
        pass
    out_id, err_id = output_file_ids(batch_id)
    completions = batch.get("endpoint") == "/v1/completions"
    counts = {out_id: 0, err_id: 0}
    sizes = {out_id: 0, err_id: 0}
    with store.writer(file_key(tenant, out_id)) as out, store.writer(file_key(tenant, err_id)) as err:
        for line in unique_lines(iter_part_lines(store, prefix)):
            error = is_error_line(line)
            if not error and completions:
                line = as_text_completion(line)
            data = (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")
            target = err_id if error else out_id
            (err if error else out).write(data)
            counts[target] += 1
            sizes[target] += len(data)
    made: dict[str, str | None] = {}
    for file_id, kind in ((out_id, "output"), (err_id, "error")):
        if counts[file_id]:
            files.write_meta(tenant, file_id, sizes[file_id], f"{batch_id}_{kind}.jsonl", "batch_output", finished_at)
            made[kind] = file_id
        else:
            files.delete(tenant, file_id)
            made[kind] = None
    store.put(prefix + MARKER, json.dumps({"parts": len(parts), "output_file_id": made["output"],
                                           "error_file_id": made["error"]}).encode())
    return made["output"], made["error"]
