"""Leviathan's expected speedup, the draft-length choice and the adaptive schedule in the SD loop."""

import pytest

from tests.conftest import perturbed, tiny
from viasd_adapters.decode import AutoregressiveDecoder, SpeculativeDecoder
from viasd_adapters.decode.schedule import (
    AdaptiveDraftLength,
    DraftCosts,
    FixedDraftLength,
    acceptance_from_rounds,
    best_draft_length,
    expected_speedup,
    expected_tokens_per_round,
)
from viasd_adapters.draft import ModelDrafter
from viasd_adapters.verify import LosslessVerifier

from .test_loops import PROMPT

# Costs in units of one target step, measured with 2 threads on two CPUs:
# Intel AMX, bf16: 1.5B 216 / 223 / 242 ms for 1 / 8 / 16 tokens, 0.5B draft 101 ms;
# AMD Zen 3, bf16: 1.5B 287 / 832 / 1530 / 2756 ms for 1 / 4 / 8 / 16 tokens, 0.5B 98 ms.
AMX = DraftCosts(101 / 216, tuple(1 + (223 / 216 - 1) * (n - 1) / 7 for n in range(1, 10)))
AMD = DraftCosts(98 / 287, tuple((287 + (832 - 287) * (n - 1) / 3) / 287 for n in range(1, 5)) + (1530 / 287,))


def test_tokens_per_round_is_the_truncated_geometric_mean():
    assert expected_tokens_per_round(0.5, 3) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert expected_tokens_per_round(1.0, 4) == 5.0
    assert expected_tokens_per_round(0.0, 4) == 1.0
    with pytest.raises(ValueError, match="acceptance"):
        expected_tokens_per_round(1.5, 2)


def test_expected_speedup_is_leviathans_formula():
    flat = DraftCosts(0.1, (1.0,) * 8)
    assert expected_speedup(0.8, 4, flat) == pytest.approx((1 - 0.8**5) / (0.2 * (4 * 0.1 + 1)))
    assert expected_speedup(0.8, 0, flat) == 1.0  # K = 0 is AR
    # v beyond the table grows by its last step
    costs = DraftCosts(0.5, (1.0, 1.2, 1.5))
    assert costs.verify_cost(5) == pytest.approx(2.1)


def test_the_hardware_decides_the_draft_length():
    # Nearly free verification (AMX): at a = 0.9 blocks of 3 pay, 1.42x.
    assert best_draft_length(0.9, AMX, 8) == 3
    assert expected_speedup(0.9, 3, AMX) == pytest.approx(1.42, abs=0.01)
    # The same pair at a = 0.6: the 0.47-step draft makes K = 1 best, and K = 5 slower than AR.
    assert best_draft_length(0.6, AMX, 8) == 1
    assert expected_speedup(0.6, 5, AMX) < 1.0 < expected_speedup(0.6, 1, AMX)
    # A verify that costs almost M single steps (AMD, bf16): no K beats AR even at a = 0.9.
    assert max(expected_speedup(0.9, k, AMD) for k in range(1, 9)) < 1.0
    # A cheaper draft (a tenth of a step) -> longer blocks.
    cheap = DraftCosts(0.1, AMX.verify)
    assert best_draft_length(0.9, cheap, 8) > best_draft_length(0.9, AMX, 8)


def test_acceptance_estimate_counts_rejections_per_round():
    assert acceptance_from_rounds(accepted=6, rejections=2) == 0.75
    assert acceptance_from_rounds(0, 0) == 0.0


CHEAP = DraftCosts(0.1, AMX.verify)


def test_adaptive_schedule_follows_recent_rounds():
    schedule = AdaptiveDraftLength(CHEAP, k_max=8, prior_acceptance=0.6, prior_rounds=2, window=8)
    start = schedule.next()
    assert start == best_draft_length(0.6, CHEAP, 8)
    for _ in range(8):  # every draft kept
        k = schedule.next()
        schedule.update(drafted=k, accepted=k)
    assert schedule.acceptance > 0.9 and schedule.next() == 8
    for _ in range(8):  # the first draft rejected every round: the window forgets the good rounds
        schedule.update(drafted=schedule.next(), accepted=0)
    assert schedule.acceptance == pytest.approx(3 / (3 + 2 + 8))  # prior: 3 kept, 2 rejections
    assert schedule.next() < start
    schedule.reset()
    assert schedule.next() == start and schedule.acceptance == pytest.approx(0.6)


def test_a_schedule_that_stopped_drafting_drafts_again_within_its_window():
    # k_min = 0 (method=auto): a bad stretch makes K = 0, AR steps, which say nothing about a.
    schedule = AdaptiveDraftLength(AMX, k_max=8, k_min=0, prior_acceptance=0.8, prior_rounds=2, window=8)
    start = schedule.next()
    assert start > 0
    for _ in range(8):
        schedule.update(drafted=max(schedule.next(), 1), accepted=0)
    assert schedule.next() == 0
    for _ in range(8):  # eight AR steps: the bad rounds age out
        schedule.update(drafted=0, accepted=0)
    assert schedule.acceptance == pytest.approx(0.8) and schedule.next() == start


def test_adaptive_schedule_reads_costs_at_the_thread_count_of_the_generation(monkeypatch):
    seen = []
    schedule = AdaptiveDraftLength(lambda threads: seen.append(threads) or AMX)
    monkeypatch.setattr("torch.get_num_threads", lambda: 3)
    schedule.reset()
    assert seen[-1] == 3 and schedule.costs is AMX


class Recording(AdaptiveDraftLength):
    """The adaptive schedule, remembering the K of every round."""

    def reset(self):
        super().reset()
        self.ks = []

    def next(self):
        k = super().next()
        self.ks.append(k)
        return k


def test_adaptive_sd_equals_greedy_ar_and_varies_k():
    target = tiny(seed=0).model
    draft = perturbed(target, scale=0.05, seed=4)  # accepts some rounds, rejects others
    ar = AutoregressiveDecoder(target).generate(PROMPT, 60)
    schedule = Recording(CHEAP, k_max=8, prior_acceptance=0.6, window=4)
    out = SpeculativeDecoder(ModelDrafter(draft), LosslessVerifier(target), draft_length=schedule).generate(PROMPT, 60)
    assert out.tokens == ar.tokens
    assert 0 < out.stats.acceptance_rate < 1
    assert len(set(schedule.ks)) > 1  # K moved with the acceptance


def test_fixed_draft_length_rejects_nonsense():
    with pytest.raises(ValueError, match="num_draft_tokens must be >= 1"):
        FixedDraftLength(0)
    with pytest.raises(ValueError, match="k_min <= k_max"):
        AdaptiveDraftLength(AMX, k_max=2, k_min=3)
