"""Subprocess side of the cross-process tests (run as a script, not collected by pytest).

    python kv_worker.py prefill STORE_DIR '{"name": [token ids], ...}' MAX_TOKENS
        -> prints {"name": {"location", "first_token", "prompt_len"}} (one batch-1 prefill per prompt)
    python kv_worker.py decode STORE_DIR '{"name": {"location", "first_token"}, ...}' MAX_TOKENS
        -> prints {"name": {"tokens": [...], "logprobs": [...], "finish_reason"}} (one session per prompt)
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main(mode: str, store_dir: str, spec: str, max_tokens: int) -> dict:
    from phaseroute.engine import kv_codec
    from phaseroute.engine.kv_store import open_store
    from phaseroute.engine.protocol import DecodeRequest, PrefillItem
    from phaseroute.engine.registry import build_executor

    ex = build_executor("smollm2-135m", "fp32", threads=2)
    store = open_store(store_dir)
    out = {}
    for name, value in json.loads(spec).items():
        if mode == "prefill":
            [res] = ex.prefill([PrefillItem(name, max_tokens, token_ids=tuple(value))])
            location = store.put(f"xproc/{name}", kv_codec.encode_parts(res.kv))
            out[name] = {"location": location, "first_token": res.first_token, "prompt_len": res.prompt_len}
        else:
            kv = kv_codec.decode(store.get(value["location"]))
            session = ex.decode_session(max_batch=1, return_logprobs=1)
            session.add(DecodeRequest(name, kv, value["first_token"], max_tokens))
            done = []
            while session.running():
                done += session.step()
            seq = done[0]
            out[name] = {"tokens": seq.token_ids, "logprobs": [lp.logprob for lp in seq.logprobs], "finish_reason": seq.finish_reason}
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))))
