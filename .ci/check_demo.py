"""Read the main job's --json summary and fail loudly unless it is as it must be: one JSON
document; every job the demo expects to complete COMPLETED and the infeasible one REJECTED;
each completed job's output exactly one line per request (the demo's own checks, read back)."""

from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    with open(path, encoding="utf-8") as fh:
        doc = json.load(fh)  # fails on anything but exactly one JSON document
    checks = doc.get("checks")
    if not checks or not checks.get("jobs"):
        print(f"check_demo: {path} has no checks section", file=sys.stderr)
        return 1
    bad = [row for row in checks["jobs"] if not row["ok"]]
    for row in checks["jobs"]:
        extra = "".join(f" {k}={row[k][:5]}" for k in ("missing", "duplicated", "unexpected") if row.get(k))
        print(f"check_demo: {row['job_id']}: {row['state']} (want {row['want']}){extra}"
              f" {'ok' if row['ok'] else 'NOT OK'}", file=sys.stderr)
    if bad or not checks["ok"]:
        print(f"check_demo: {len(bad)} job(s) not as they must be", file=sys.stderr)
        return 1
    print(f"check_demo: all {len(checks['jobs'])} jobs as expected; {doc['output_tokens']} output tokens in "
          f"{doc['wall_s']} s ({doc['output_tokens_per_s']} tokens/s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
