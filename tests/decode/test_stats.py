"""DecodeStats: what one round adds, and the settled count (rounds the slim tier settled) as the loop sees each verdict."""

from tests.conftest import perturbed
from tests.decode.test_loops import PROMPT
from viasd_adapters.decode import DecodeStats, SpeculativeDecoder
from viasd_adapters.draft import ModelDrafter
from viasd_adapters.verify import ConfidencePolicy, LosslessVerifier, Tier, TieredVerifier


def test_settled_rounds_are_the_rounds_without_a_full_forward(tiny_target, tiny_draft):
    slim = perturbed(tiny_target.model, scale=0.01, seed=9)
    verifier = TieredVerifier(tiny_target.model, slim, ConfidencePolicy(tau_accept=0.5, tau_slim=0.3))
    out = SpeculativeDecoder(ModelDrafter(tiny_draft), verifier, num_draft_tokens=4).generate(PROMPT, 60)
    s = out.stats
    assert 0 < s.settled < s.steps  # both kinds of round ran
    # without a shared prefix every escalated round is one forward of the target, a settled one none
    assert s.settled == s.steps - s.model_calls["target"].calls
    plain = SpeculativeDecoder(ModelDrafter(tiny_draft), LosslessVerifier(tiny_target.model), num_draft_tokens=4)
    assert plain.generate(PROMPT, 20).stats.settled == 0


def test_a_round_adds_its_drafts_kept_tokens_tiers_and_whether_it_settled():
    stats = DecodeStats()
    stats.add_round(4, 2, {Tier.ACCEPT: 2, Tier.SLIM: 1}, settled=True)
    stats.add_round(3, 0, {Tier.ESCALATE: 1})
    assert (stats.steps, stats.drafted, stats.accepted, stats.settled) == (2, 7, 2, 1)
    assert stats.tier_counts == {"accept": 2, "slim": 1, "full": 1}
    assert stats.acceptance_rate == 2 / 7
    stats.add_round(3, 3, {Tier.ACCEPT: 3})  # kept whole: three successes and no failure
    assert stats.rejections == 2
    assert stats.per_token_acceptance == 5 / 7  # the truncated-geometric MLE: kept / (kept + rejections)
