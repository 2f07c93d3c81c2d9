"""Building a canary reference, and running canaries in one process (no Kafka).

``build_reference`` runs on the reference configuration (an fp32 executor, colocated): a free
greedy run gives the reference tokens, a teacher-forced scoring pass picks the top-K ids per
position, and a traced forced run through the same prefill + decode-session path the workers
use records their log-probs (so an fp32 pool measured through a worker reads KL ~0, not the
difference between two kernels). ``run_in_process`` runs a canary set on any executor the
same way a pool's real path does and returns the drift, for ``phaseroute drift measure``.
"""

from __future__ import annotations

import importlib.metadata as md
from typing import Any

from phaseroute.engine.canaries import Canary, CanarySet
from phaseroute.engine.drift import CanaryDrift, DriftMetrics, aggregate, canary_drift
from phaseroute.engine.protocol import DecodeRequest, FinishedSequence, PrefillItem, TokenProbe

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about rain.",
    "Explain what a queue is in one sentence.",
    "What is 12 times 7?",
    "Why is the sky blue?",
    "Give me a tip for learning to cook.",
    "What does a compiler do?",
    "Name three colours of the rainbow.",
)


def run_batch(executor: Any, prompts: list[tuple[int, ...]], max_tokens: list[int],
              probes: list[TokenProbe | None]) -> list[FinishedSequence]:
    """Prefill the prompts together, decode them in one continuous batch; results in input order."""
    items = [PrefillItem(f"c{i}", m, token_ids=p, probe=probe) for i, (p, m, probe) in enumerate(zip(prompts, max_tokens, probes))]
    results = executor.prefill(items)
    session = executor.decode_session(max_batch=len(items))
    for item, res in zip(items, results):
        session.add(DecodeRequest(item.request_id, res.kv, res.first_token, item.max_tokens,
                                  probe=item.probe, first_trace=res.first_trace))
    done: dict[str, FinishedSequence] = {}
    while session.running():
        done.update({seq.request_id: seq for seq in session.step()})
    return [done[item.request_id] for item in items]


def build_reference(executor: Any, model: str, version: str, max_tokens: int = 16, top_k: int = 32,
                    questions: tuple[str, ...] = QUESTIONS) -> CanarySet:
    """The canary set of ``model`` computed on ``executor`` (which must be the fp32 reference)."""
    if executor.variant != "fp32":
        raise ValueError(f"the reference configuration is fp32, colocated; got variant {executor.variant!r}")
    prompt_ids = [tuple(executor.apply_chat_template([{"role": "user", "content": q}])) for q in questions]
    texts = [executor.tokenizer.decode(list(ids), skip_special_tokens=False) for ids in prompt_ids]
    for text, ids in zip(texts, prompt_ids):
        again = executor.encode_item(PrefillItem("check", 1, prompt=text))
        if tuple(again) != ids:
            raise ValueError(f"prompt text does not re-tokenize to its ids: {text!r}")
    canaries = []
    for i, (text, ids) in enumerate(zip(texts, prompt_ids)):  # one at a time: no batch-shape noise in the reference
        [seq] = run_batch(executor, [ids], [max_tokens], [None])
        tops = tuple(s.top_ids for s in executor.score(list(ids), seq.token_ids, top_k=top_k))
        [run] = run_batch(executor, [ids], [len(seq.token_ids)], [TokenProbe(tuple(seq.token_ids), tops)])
        if run.trace is None or [t.argmax_id for t in run.trace] != seq.token_ids:
            raise AssertionError(f"canary {i}: the traced forced run left the greedy path")
        canaries.append(Canary(f"{i:02d}", text, ids, tuple(seq.token_ids), tops, tuple(t.probe_logprobs for t in run.trace)))
    built_with = {p: md.version(p) for p in ("torch", "transformers")}
    return CanarySet(model, version, executor.variant, top_k, max_tokens, tuple(canaries), built_with)


def canary_drifts(canary_set: CanarySet, greedy: list[FinishedSequence], forced: list[FinishedSequence]) -> list[CanaryDrift]:
    drifts = []
    for canary, free, run in zip(canary_set.canaries, greedy, forced):
        trace = run.trace or []
        drifts.append(canary_drift(canary.canary_id, canary.tokens, canary.top_logprobs, free.token_ids,
                                   [t.argmax_id for t in trace], [t.probe_logprobs for t in trace]))
    return drifts


def run_in_process(executor: Any, canary_set: CanarySet) -> DriftMetrics:
    """Drift of ``executor`` against the reference, both runs of every canary in one batch each."""
    canaries: list[Canary] = list(canary_set.canaries)
    prompts = [c.prompt_ids for c in canaries]
    greedy = run_batch(executor, prompts, [canary_set.max_tokens] * len(canaries), [None] * len(canaries))
    forced = run_batch(executor, prompts, [len(c.tokens) for c in canaries], [c.forced_probe() for c in canaries])
    return aggregate(canary_drifts(canary_set, greedy, forced))
