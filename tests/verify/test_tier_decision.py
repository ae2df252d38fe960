"""`decide`, the one tier decision of chains and trees, on hand-made distributions."""

import pytest
import torch

from tests.decode.test_loops import PROMPT
from viasd_adapters.draft import ModelDrafter
from viasd_adapters.hosts.pearl import VerifierJudge
from viasd_adapters.sampling import Sampler, SamplingConfig
from viasd_adapters.verify import ConfidencePolicy, Tier, TieredVerifier
from viasd_adapters.verify.decision import SlimScores, decide

GREEDY = Sampler(SamplingConfig())
POLICY = ConfidencePolicy(tau_accept=0.9, tau_slim=0.8)
V = 4


def scores(*rows, sampler=GREEDY):
    """SlimScores of rows given as {token: probability} (the rest spread evenly)."""
    probs = torch.zeros(len(rows), V)
    for i, row in enumerate(rows):
        rest = (1 - sum(row.values())) / (V - len(row))
        probs[i] = rest
        for token, prob in row.items():
            probs[i, token] = prob
    return SlimScores.of(probs.log(), sampler)


def one_hot(tokens):
    return torch.nn.functional.one_hot(torch.tensor(tokens), V).float()


CONFIDENT_BLOCK = [{0: 0.95}, {1: 0.95}]  # u agrees with drafts [0, 1], confidently


def test_greedy_block_kept_whole_adds_u_confident_bonus_token():
    d = decide(POLICY, torch.tensor([0, 1]), one_hot([0, 1]), scores(*CONFIDENT_BLOCK, {2: 0.85}), GREEDY, room=16)
    assert (d.tier, d.num_accepted, d.token) == (Tier.ACCEPT, 2, 2)
    assert d.counts() == {Tier.ACCEPT: 2, Tier.SLIM: 1} and d.last_tier == Tier.SLIM


def test_greedy_block_kept_whole_without_a_confident_bonus():
    d = decide(POLICY, torch.tensor([0, 1]), one_hot([0, 1]), scores(*CONFIDENT_BLOCK, {2: 0.5}), GREEDY, room=16)
    assert (d.tier, d.num_accepted, d.token) == (Tier.ACCEPT, 2, None)
    assert d.counts() == {Tier.ACCEPT: 2} and d.last_tier == Tier.ACCEPT


def test_greedy_slim_rewrite_and_escalation():
    rewrite = decide(POLICY, torch.tensor([0, 3]), one_hot([0, 3]), scores({0: 0.95}, {1: 0.85}, {}), GREEDY, 16)
    assert (rewrite.tier, rewrite.num_accepted, rewrite.token) == (Tier.SLIM, 1, 1)
    unsure = decide(POLICY, torch.tensor([0, 3]), one_hot([0, 3]), scores({0: 0.95}, {1: 0.6}, {}), GREEDY, 16)
    assert (unsure.tier, unsure.num_accepted, unsure.token) == (Tier.ESCALATE, 1, None)


@pytest.mark.parametrize(
    "room, want",
    [
        (3, (Tier.ACCEPT, 2, 2)),
        (2, (Tier.ACCEPT, 2, None)),
        (1, (Tier.ESCALATE, 1, None)),
        (0, (Tier.ESCALATE, 0, None)),
    ],
)
def test_room_caps_what_the_slim_tier_settles(room, want):
    """Committing through position i adds i + 1 to the full model's lag: positions >= room escalate."""
    for sampler in (GREEDY, Sampler(SamplingConfig(temperature=1.0, seed=0))):
        u = scores(*CONFIDENT_BLOCK, {2: 0.99}, sampler=sampler)
        # p = u: speculative sampling accepts every draft, so greedy and sampling agree here
        d = decide(POLICY, torch.tensor([0, 1]), u.probs[:2], u, sampler, room)
        assert (d.tier, d.num_accepted, d.token is None) == (want[0], want[1], want[2] is None)


def test_sampling_rejection_draws_from_the_residual():
    """p puts all its mass on the draft, which u gives 0.9 (> the thresholds): rejected w.p. 0.1, and
    then u's token comes from norm(max(0, u - p)), never the draft."""
    counts = torch.zeros(V)
    for seed in range(400):
        sampler = Sampler(SamplingConfig(temperature=1.0, seed=seed))
        d = decide(
            ConfidencePolicy(0.5, 0.0, 0.5),
            torch.tensor([0]),
            one_hot([0]),
            scores({0: 0.9}, {}, sampler=sampler),
            sampler,
            16,
        )
        if d.tier == Tier.SLIM:
            counts[d.token] += 1
        else:
            assert d.tier == Tier.ACCEPT and d.num_accepted == 1
    assert counts[0] == 0 and 15 < counts.sum() < 70


def test_verdict_and_pearl_judgement_say_who_chose_the_bonus(tiny_target):
    """A block tier 1 kept whole, then u's bonus token: counted (slim) in the verdict, and PEARL's
    judge reads the tier off the verdict (its engine counts the bonus when a draft is judged by it)."""
    model = tiny_target.model
    verifier = TieredVerifier(model, model, ConfidencePolicy(0.0, 0.0, 0.0))
    verifier.reset()
    block = ModelDrafter(model).propose(PROMPT, 3, GREEDY)  # the target's own greedy tokens
    verdict = verifier.verify(PROMPT, block, GREEDY)
    assert verdict.tokens.numel() == 4 and verdict.num_accepted == 3
    assert verdict.tier_counts == {Tier.ACCEPT: 3, Tier.SLIM: 1} and verdict.last_tier == Tier.SLIM
    verifier.reset()
    judgement = VerifierJudge(verifier, GREEDY).judge(PROMPT, block.tokens, None)
    assert judgement.next_token_tier == Tier.SLIM and judgement.counts == {Tier.ACCEPT: 3}


def test_tier_names_are_the_record_keys():
    assert [str(t) for t in Tier] == ["accept", "slim", "full"]
    assert [t.code for t in Tier] == [1, 2, 3] and Tier.of(2) is Tier.SLIM
    assert {Tier.SLIM: 1}["slim"] == 1  # records (JSON) and reports keep reading names
