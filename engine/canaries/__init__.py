"""Canary sets: fixed prompts per model with reference outputs, stored in the repository.

``<model>.json`` (package data beside this file) holds, per canary, the prompt (chat template
applied, the text a ``prefill_work`` carries) and its token ids, the reference greedy tokens,
and per generated position the reference's top-K token ids and log-probs. The reference was
computed on the reference configuration (fp32, colocated, in one process) by
``phaseroute drift reference`` (``engine.canaries.build``); the file records the versions it was
built with. ``load_canaries(model)`` reads it; ``engine.drift`` compares pool runs against it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from phaseroute.engine.errors import UnknownNameError
from phaseroute.engine.protocol import TokenProbe


@dataclass(frozen=True)
class Canary:
    """One fixed prompt and its reference run."""

    canary_id: str
    prompt: str
    prompt_ids: tuple[int, ...]
    tokens: tuple[int, ...]  # reference greedy tokens (the prefill token first; EOS included if it ended)
    top_ids: tuple[tuple[int, ...], ...]  # per position: reference top-K token ids, most likely first
    top_logprobs: tuple[tuple[float, ...], ...]  # their reference log-probs

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if not n or len(self.top_ids) != n or len(self.top_logprobs) != n:
            raise ValueError(f"canary {self.canary_id!r}: {n} tokens, {len(self.top_ids)} top-id rows, "
                             f"{len(self.top_logprobs)} log-prob rows (must be equal and > 0)")

    def forced_probe(self) -> TokenProbe:
        """Teacher forcing on the reference tokens, probing the reference top-K at each position."""
        return TokenProbe(self.tokens, self.top_ids)

    def to_json(self) -> dict[str, Any]:
        return {"canary_id": self.canary_id, "prompt": self.prompt, "prompt_ids": list(self.prompt_ids),
                "tokens": list(self.tokens), "top_ids": [list(r) for r in self.top_ids],
                "top_logprobs": [[round(v, 7) for v in r] for r in self.top_logprobs]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Canary:
        return cls(data["canary_id"], data["prompt"], tuple(data["prompt_ids"]), tuple(data["tokens"]),
                   tuple(tuple(r) for r in data["top_ids"]), tuple(tuple(r) for r in data["top_logprobs"]))


@dataclass(frozen=True)
class CanarySet:
    """A model's canaries and how their reference was made."""

    model: str
    version: str  # changes whenever the prompts or the reference change
    reference_variant: str
    top_k: int
    max_tokens: int
    canaries: tuple[Canary, ...]
    built_with: dict[str, str] = field(default_factory=dict)

    def by_id(self) -> dict[str, Canary]:
        return {c.canary_id: c for c in self.canaries}

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "version": self.version, "reference_variant": self.reference_variant,
                "top_k": self.top_k, "max_tokens": self.max_tokens, "built_with": self.built_with,
                "canaries": [c.to_json() for c in self.canaries]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CanarySet:
        return cls(data["model"], data["version"], data["reference_variant"], int(data["top_k"]), int(data["max_tokens"]),
                   tuple(Canary.from_json(c) for c in data["canaries"]), dict(data.get("built_with") or {}))


def canary_file(model: str) -> Path:
    return Path(str(resources.files("phaseroute.engine") / "canaries" / f"{model}.json"))


@lru_cache(maxsize=8)
def load_canaries(model: str) -> CanarySet:
    """The stored canary set of ``model``; UnknownNameError names the models that have one."""
    path = canary_file(model)
    if not path.exists():
        known = sorted(p.stem for p in path.parent.glob("*.json"))
        raise UnknownNameError(f"no canary set for model {model!r} ({path}); canary sets exist for {known}; "
                               "build one with `phaseroute drift reference --model MODEL`")
    return CanarySet.from_json(json.loads(path.read_text()))


def write_canaries(canary_set: CanarySet, path: Path | None = None) -> Path:
    """Write ``canary_set`` as JSON (one canary per line, readable in a diff); return the path."""
    path = path or canary_file(canary_set.model)
    head = {k: v for k, v in canary_set.to_json().items() if k != "canaries"}
    lines = [json.dumps(c.to_json(), separators=(",", ":")) for c in canary_set.canaries]
    text = json.dumps(head, indent=1)[:-2] + ',\n "canaries": [\n' + ",\n".join(lines) + "\n ]\n}\n"
    json.loads(text)  # never write a file that does not read back
    path.write_text(text)
    load_canaries.cache_clear()
    return path
