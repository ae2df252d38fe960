"""Sampling with the tiers on: what tiers 1-2 settle follows u exactly, what escalates follows q.

Statistical (fp32, fixed seeds): Pearson's chi-square against the exact marginals of the first
sampled tokens, each test at p > 1e-3 (`tests/verify/statistics.py`).
"""

import pytest
import torch

from tests.conftest import exact_marginals, perturbed, tiny
from tests.decode.test_loops import PROMPT
from tests.verify.statistics import P_MIN, chi_square_p, total_variation
from viasd_adapters.decode import SpeculativeDecoder
from viasd_adapters.draft import ModelDrafter
from viasd_adapters.sampling import Sampler, SamplingConfig
from viasd_adapters.verify import ConfidencePolicy, Tier, TieredVerifier
from viasd_adapters.verify.decision import SlimScores, decide

N = 1000  # generations per test


@pytest.fixture(autouse=True, scope="module")
def _single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: more threads only add overhead on a shared host
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target():
    return tiny(seed=0, num_layers=2, init_std=0.5).model


def sample(decoder, steps: int, temperature: float = 1.0):
    """[steps, V] counts of the first `steps` tokens over N seeded generations, and their tier counts."""
    counts, tiers = None, {}
    for seed in range(N):
        out = decoder.generate(PROMPT, steps, SamplingConfig(temperature=temperature, seed=seed))
        if counts is None:
            counts = torch.zeros(steps, decoder.verifier.vocab_size)
        counts[torch.arange(steps), torch.tensor(out.tokens)] += 1
        for tier, n in out.stats.tier_counts.items():
            tiers[tier] = tiers.get(tier, 0) + n
    return counts, tiers


@pytest.mark.parametrize("draft_kind", ["target", pytest.param("perturbed", marks=pytest.mark.slow)])
def test_tiers_with_a_perfect_slim_verifier_sample_the_target(target, draft_kind):
    """u = q: whatever the tiers settle, the output is distributed as the target's (an earlier
    rule gave the top first token 0.64 against the target's 0.39 with draft = slim = target)."""
    draft = target if draft_kind == "target" else perturbed(target, scale=0.1, seed=5)
    verifier = TieredVerifier(target, target, ConfidencePolicy(tau_accept=0.3, tau_slim=0.3))
    counts, tiers = sample(SpeculativeDecoder(ModelDrafter(draft), verifier, 3), steps=3)
    exact = exact_marginals(target, PROMPT, 3)  # [3, V]
    # the check has teeth: the top token is far from certain, u settled tokens and q others
    assert 0.2 < float(exact[0].max()) < 0.6
    assert tiers[Tier.ACCEPT] > N // 4 and tiers[Tier.ESCALATE] > N // 20
    if draft_kind == "perturbed":
        assert tiers[Tier.SLIM] > N // 4  # u's rewrites from the residual norm(max(0, u - p))
    for i in range(3):
        assert chi_square_p(counts[i], exact[i]) > P_MIN, (i, total_variation(counts[i], exact[i]))


@pytest.mark.slow  # the default run must stay under 15 min (pyproject.toml)
def test_tokens_the_slim_tier_settles_follow_u(target):
    """u != q and thresholds 0: u settles every token with a draft to judge, so the first two tokens
    are distributed as u's own sampling, rewrites and bonus tokens included. (A round of zero drafts,
    the budget's last token, goes to the full model: token 3 may be q's.)"""
    slim = perturbed(target, scale=0.15, seed=7)
    draft = perturbed(target, scale=0.15, seed=5)
    verifier = TieredVerifier(target, slim, ConfidencePolicy(0.0, 0.0, 0.0), max_unverified=16)
    decoder = SpeculativeDecoder(ModelDrafter(draft), verifier, 3)
    counts, tiers = sample(decoder, steps=3)
    exact_u, exact_q = exact_marginals(slim, PROMPT, 2), exact_marginals(target, PROMPT, 2)
    assert (exact_u - exact_q).abs().max() > 0.05  # u's distribution is not q's: the test tells them apart
    assert tiers[Tier.SLIM] > N // 4 and tiers[Tier.ACCEPT] > N // 4
    for i in range(2):
        assert chi_square_p(counts[i], exact_u[i]) > P_MIN, (i, total_variation(counts[i], exact_u[i]))


def test_thresholds_read_the_raw_distribution_whatever_the_temperature():
    """A top-1 probability of 0.6 at temperature 1 is 0.6 at every temperature for the policy."""
    logits = torch.tensor([[0.0, -0.41, -9.0], [0.0, -0.41, -9.0]])  # softmax: top ~0.60
    u_raw_top = float(torch.softmax(logits[0], -1).max())
    assert 0.59 < u_raw_top < 0.61
    cold = Sampler(SamplingConfig(temperature=0.2, seed=0))
    assert float(cold.probs(logits[0]).max()) > 0.85  # tempered, u looks confident
    draft, p = torch.tensor([0]), torch.tensor([[0.5, 0.5, 0.0]])
    for tau, settled in [(0.7, False), (0.5, True)]:
        policy = ConfidencePolicy(tau, 0.0, tau)
        decision = decide(policy, draft, p, SlimScores.of(logits, cold), cold, room=16)
        assert (decision.tier != Tier.ESCALATE) == settled
        greedy = decide(
            policy, draft, p, SlimScores.of(logits, Sampler(SamplingConfig())), Sampler(SamplingConfig()), 16
        )
        assert (greedy.tier != Tier.ESCALATE) == settled  # the same thresholds, the same positions


def test_sampling_escalation_keeps_the_tokens_u_accepted(target):
    """Once u accepted x_0 the full model judges from x_1 on: re-judging x_0 would bias q's rule."""
    verifier = TieredVerifier(target, target, ConfidencePolicy(0.0, 0.0, 0.0), max_unverified=12, rejudge=True)
    verifier.reset()
    sampler = Sampler(SamplingConfig(temperature=1.0, seed=0))
    drafter = ModelDrafter(target)
    block = drafter.propose(PROMPT, 3, sampler)
    # the prompt (12 tokens) leaves room for one token: position 0 is u's, positions 1.. are q's
    verdict = verifier.verify(PROMPT, block, sampler)
    assert verdict.tier_counts[Tier.ACCEPT] == 1 and verdict.tier_counts[Tier.ESCALATE] == verdict.tokens.numel() - 1
    assert verdict.last_tier == Tier.ESCALATE
