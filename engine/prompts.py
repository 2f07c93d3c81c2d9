"""Deterministic prompt sets of chosen token lengths, for the bench and the real-model tests.

Prompts are chat requests ("Summarize ...") over slices of a fixed English passage, so the
model generates real text; the same (lengths, seed) always gives the same token ids.
"""

from __future__ import annotations

from typing import Any

PASSAGE = (
    "The printing press changed how knowledge travelled. Before it, a book was copied by hand, "
    "letter by letter, and a single copy could take a scribe many months. Libraries were small, "
    "books were expensive, and errors crept in with every copy. When movable type arrived in "
    "Europe in the middle of the fifteenth century, a workshop could produce hundreds of identical "
    "pages in the time a scribe needed for one. Prices fell, print runs grew, and within fifty "
    "years presses were working in more than two hundred cities. Pamphlets, calendars, grammars "
    "and maps reached merchants, students and artisans who had never owned a book. Scholars could "
    "compare the same edition across cities and correct it in the next printing. Governments and "
    "churches learned to use the press for announcements, and critics learned to use it for "
    "arguments. The new trade needed paper mills, type founders, ink makers, binders and sellers, "
    "and it connected them in networks of credit that crossed borders. Standard spellings slowly "
    "emerged because printers wanted pages that readers in many places could understand. "
    "Railways did something similar for goods and people four centuries later. A journey that had "
    "taken a week by coach took a day by train, and fresh food could reach a city from farms far "
    "away. Towns along the lines grew quickly while others faded. Clocks were synchronized so that "
    "timetables could work, which is why standard time zones exist. Engineers had to solve new "
    "problems of bridges, tunnels, signals and brakes, and each accident taught a lesson that "
    "became a rule. Investors poured money into companies, some of which failed spectacularly, "
    "and the booms and busts of railway shares shaped early financial regulation. Workers moved "
    "to cities in search of jobs, and suburbs appeared where commuters could live away from the "
    "smoke. The telegraph ran beside the tracks, carrying messages faster than any train. "
    "Computers and networks are the latest chapter of the same story. A message that once crossed "
    "an ocean in weeks now arrives in a fraction of a second, and a small team can publish to "
    "millions of readers. Storage that filled a room now fits on a fingernail. Yet the old lessons "
    "still apply: new capacity creates new demand, standards matter more than any single machine, "
    "and the systems that last are the ones that measure what they do and adapt when the "
    "measurements change. Operators watch queues, latencies and error rates, and they plan "
    "capacity from what they observe rather than from what a specification promises."
)


def passage_ids(tokenizer: Any) -> list[int]:
    ids: list[int] = tokenizer.encode(PASSAGE, add_special_tokens=False)
    return ids


def chat_prompt_ids(tokenizer: Any, target_tokens: int, offset: int = 0) -> list[int]:
    """Chat-template token ids of ``target_tokens`` (+-1 at most, as far as the passage allows)."""
    corpus = passage_ids(tokenizer)
    body = max(1, target_tokens - len(_template(tokenizer, "")))
    ids: list[int] = []
    for _ in range(4):
        body = max(1, min(body, len(corpus)))
        start = offset % (len(corpus) - body + 1)
        ids = _template(tokenizer, tokenizer.decode(corpus[start : start + body], clean_up_tokenization_spaces=False))
        if len(ids) == target_tokens:
            break
        body -= len(ids) - target_tokens
    return ids


def _template(tokenizer: Any, text: str) -> list[int]:
    messages = [{"role": "user", "content": "Summarize this text in two sentences:\n" + text}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def mixed_workload(tokenizer: Any, n: int, lengths: list[int], max_tokens: list[int]) -> list[tuple[list[int], int]]:
    """``n`` (prompt ids, max_tokens) pairs cycling through ``lengths`` and ``max_tokens``."""
    out = []
    for i in range(n):
        ids = chat_prompt_ids(tokenizer, lengths[i % len(lengths)], offset=37 * i)
        out.append((ids, max_tokens[(i // len(lengths)) % len(max_tokens)]))
    return out
