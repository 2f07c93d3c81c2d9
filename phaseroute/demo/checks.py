"""What must be true at the end of the main job; CI fails when any of it is not.

- every job the demo expects to run was admitted and reached COMPLETED (the infeasible one
  REJECTED with an earliest feasible deadline, the resubmitted id run once);
- each admitted job's output file holds exactly one line per request: none missing, none twice.
(That no process exited early is checked while the demo runs: it stops with the process's log.)
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from phaseroute.consumers.output_file import iter_part_lines
from phaseroute.demo.workload import DemoJob
from phaseroute.infra.blobstore import open_blob_store, output_prefix


def output_lines(blob_store_url: str, tenant: str, job_id: str) -> Counter[str]:
    """How many lines each custom id has across the job's output parts in the blob store (as
    written: a duplicate the sink let through would count twice here)."""
    store = open_blob_store(blob_store_url)
    return Counter(line["custom_id"] for line in iter_part_lines(store, output_prefix(tenant, job_id)))


def check(jobs: list[DemoJob], states: dict[str, dict[str, Any]], blob_store_url: str) -> dict[str, Any]:
    """Per job: expected and actual state, missing and duplicated output lines; ``ok`` overall."""
    rows, ok = [], True
    for job in jobs:
        state = states.get(job.job_id, {})
        infeasible = job.deadline.endswith("s") and int(job.deadline[:-1]) < 60
        want = "REJECTED" if infeasible else "COMPLETED"
        row: dict[str, Any] = {"job_id": job.job_id, "want": want, "state": state.get("state")}
        if want == "REJECTED":
            row["ok"] = row["state"] == "REJECTED" and state.get("earliest_feasible_deadline") is not None
        else:
            lines = output_lines(blob_store_url, job.tenant, job.job_id)
            expected = {f"{job.tenant}-{i}" for i in range(job.requests)}
            row["missing"] = sorted(expected - set(lines))
            row["duplicated"] = sorted(c for c, n in lines.items() if n > 1)
            row["unexpected"] = sorted(set(lines) - expected)
            row["ok"] = (row["state"] == want and not row["missing"] and not row["duplicated"]
                         and not row["unexpected"])
        ok &= bool(row["ok"])
        rows.append(row)
    return {"ok": ok, "jobs": rows}


def failures(result: dict[str, Any]) -> str:
    """One line per job that is not as it must be."""
    out = []
    for row in result["jobs"]:
        if not row["ok"]:
            extra = "".join(f", {k}: {row[k][:5]}" for k in ("missing", "duplicated", "unexpected") if row.get(k))
            out.append(f"{row['job_id']}: {row['state']} (want {row['want']}){extra}")
    return "; ".join(out)
