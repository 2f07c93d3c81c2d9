"""pick_batch: which waiting prompts form the next prefill micro-batch (pure, no model)."""

from __future__ import annotations

import pytest

from phaseroute.consumers.prefill_stage import pick_batch


def test_the_oldest_prompt_is_always_taken_with_those_nearest_its_length():
    # arrival order cycles through lengths, as the bench's mixed prompts do
    lengths = [256, 48, 512, 256, 64, 384, 240]
    picked = pick_batch(lengths, max_items=8, budget_tokens=800)
    assert picked == [0, 3, 6]  # 256, 256, 240: 752 tokens, padding 2%
    assert pick_batch(lengths[1:], max_items=8, budget_tokens=800) == [0, 3]  # 48 with 64, nothing longer


def test_the_budget_and_the_item_cap_bound_the_batch():
    lengths = [100] * 10
    assert pick_batch(lengths, max_items=4, budget_tokens=10_000) == [0, 1, 2, 3]
    assert pick_batch(lengths, max_items=8, budget_tokens=350) == [0, 1, 2]
    assert pick_batch([900, 100], max_items=8, budget_tokens=350) == [0]  # the head runs even over budget


def test_padding_stays_within_its_share_so_a_short_prompt_never_rides_with_a_long_one():
    lengths = [512, 48, 64, 400]
    picked = pick_batch(lengths, max_items=8, budget_tokens=4096)
    assert picked == [0, 3]  # 512 + 400 pad 11%; adding 64 would pad 40%
    for batch in (pick_batch(lengths, 8, 4096, share) for share in (0.0, 0.1, 0.25, 0.5)):
        width = max(lengths[i] for i in batch)
        assert 0 in batch and sum(lengths[i] for i in batch) <= 4096 and width * len(batch) >= sum(lengths[i] for i in batch)
    assert pick_batch(lengths, 8, 4096, max_padding_share=0.0) == [0]
    assert pick_batch(lengths, 8, 4096, max_padding_share=1.0) == [0, 1, 2, 3]


def test_nothing_waiting_gives_an_empty_batch():
    assert pick_batch([], max_items=8, budget_tokens=100) == []


@pytest.mark.parametrize("seed", range(20))
def test_every_prompt_is_taken_exactly_once_and_the_oldest_first(seed):
    import random

    rng = random.Random(seed)
    waiting = [(i, rng.choice([48, 64, 96, 128, 192, 256, 384, 512])) for i in range(40)]
    taken: list[int] = []
    while waiting:
        picked = pick_batch([n for _, n in waiting], max_items=8, budget_tokens=rng.choice([200, 800, 4096]))
        assert picked[0] == 0 and picked == sorted(set(picked))
        taken += [waiting[i][0] for i in picked]
        waiting = [w for i, w in enumerate(waiting) if i not in set(picked)]
    assert sorted(taken) == list(range(40))


def test_a_prompt_joins_only_while_the_padding_it_adds_is_worth_a_forward_pass():
    lengths = [512, 384, 512, 48]
    assert pick_batch(lengths, 8, 4096) == [0, 1, 2]  # the share alone: 384 rides with 512 (pad 8%)
    assert pick_batch(lengths, 8, 4096, max_added_padding=50) == [0, 2]  # 384 would add 128 padded positions
    assert pick_batch([64, 48, 64], 8, 4096, max_added_padding=50) == [0, 1, 2]  # 48 adds 16
    assert pick_batch([48, 64, 64], 8, 4096, max_added_padding=50) == [0, 1, 2]  # widening to 64 adds 16, then 0
    assert pick_batch([48, 64], 8, 4096, max_added_padding=0) == [0]


def test_the_padding_rule_fits_the_fixed_cost_of_a_pass_from_the_batches_run():
    from phaseroute.consumers.prefill_budget import PaddingRule

    rule = PaddingRule()
    assert rule.break_even_positions() is None  # nothing run yet
    fixed_s, per_s = 0.11, 450.0
    for positions in (39, 64, 400, 1024, 2048, 4096):
        rule.observe(positions, fixed_s + positions / per_s)
    assert rule.break_even_positions() == pytest.approx(fixed_s * per_s, rel=1e-6)  # ~50 positions
    same = PaddingRule()
    for _ in range(8):
        same.observe(512, 1.3)
    assert same.break_even_positions() is None  # one batch size: nothing to fit
    free = PaddingRule()
    for positions in (100, 200, 400, 800):
        free.observe(positions, positions / per_s - 0.01)  # no fixed cost (the fit's is below 0): padding never pays
    assert free.break_even_positions() == 0.0
    window = PaddingRule(window=4)
    for positions in (10, 20, 40, 80, 160, 320):
        window.observe(positions, 1.0 + positions / per_s)
    assert [p for p, _ in window.batches] == [40, 80, 160, 320]
    one = PaddingRule(window=1)
    one.observe(10, 1.0)
    one.observe(20, 1.0)
    assert one.batches == [(20, 1.0)]
