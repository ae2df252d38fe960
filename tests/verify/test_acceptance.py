"""Acceptance rules on hand-made distributions (vLLM's test_rejection_sampler is the model)."""

import torch

from viasd_adapters.sampling import Sampler, SamplingConfig
from viasd_adapters.verify import greedy_match, rejection_sample


def one_hot_logits(tokens, vocab=8):
    logits = torch.zeros(len(tokens), vocab)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


def test_greedy_all_accepted_gives_bonus():
    outcome = greedy_match(torch.tensor([1, 2, 3]), one_hot_logits([1, 2, 3, 4]))
    assert (outcome.num_accepted, outcome.next_token) == (3, 4)


def test_greedy_early_mismatch_recovers_target_token():
    outcome = greedy_match(torch.tensor([1, 2, 3]), one_hot_logits([6, 2, 3, 4]))
    assert (outcome.num_accepted, outcome.next_token) == (0, 6)


def test_greedy_empty_block_is_one_ar_step():
    outcome = greedy_match(torch.tensor([], dtype=torch.long), one_hot_logits([5]))
    assert (outcome.num_accepted, outcome.next_token) == (0, 5)


def test_identical_distributions_accept_everything():
    p = torch.softmax(torch.randn(3, 8, generator=torch.Generator().manual_seed(0)), -1)
    q = torch.cat([p, p[:1]])
    sampler = Sampler(SamplingConfig(temperature=1.0, seed=0))
    for _ in range(50):
        assert rejection_sample(torch.tensor([0, 1, 2]), p, q, sampler).num_accepted == 3


def test_zero_target_probability_always_rejects():
    p = torch.full((1, 4), 0.25)
    q = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25] * 4])
    sampler = Sampler(SamplingConfig(temperature=1.0, seed=0))
    for _ in range(50):
        outcome = rejection_sample(torch.tensor([0]), p, q, sampler)
        assert outcome.num_accepted == 0 and outcome.next_token in (1, 2)


def test_rejection_sampling_reproduces_the_target_distribution():
    """The first committed token of speculative sampling is distributed as q_1 (statistical)."""
    V, K, N = 6, 3, 20000
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(K, V, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(K + 1, V, generator=g) * 2, -1)
    sampler = Sampler(SamplingConfig(temperature=1.0, seed=1))
    counts = torch.zeros(V)
    for _ in range(N):
        drafts = torch.multinomial(p, 1, generator=g)[:, 0]  # x_i ~ p_i
        outcome = rejection_sample(drafts, p, q, sampler)
        first = drafts[0] if outcome.num_accepted > 0 else outcome.next_token
        counts[first] += 1
    empirical = counts / N
    # 4 standard errors of a frequency estimate at N = 20000 is under 0.015.
    assert (empirical - q[0]).abs().max() < 0.015, (empirical, q[0])
    # and not merely the draft distribution
    assert (p[0] - q[0]).abs().max() > 0.05
