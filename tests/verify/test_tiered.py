"""TieredVerifier reductions and tier accounting on tiny random models (fp32)."""

import pytest
import torch

from tests.conftest import exact_marginals, perturbed, tiny
from tests.decode.test_loops import PROMPT
from tests.verify.statistics import P_MIN, POWER, chi_square_p, chi_square_power, total_variation
from viasd_adapters.decode import AutoregressiveDecoder, SpeculativeDecoder
from viasd_adapters.draft import ModelDrafter
from viasd_adapters.routing import RoutingMask, SlimModel
from viasd_adapters.runner import CausalLMRunner, common_prefix_length
from viasd_adapters.sampling import Sampler, SamplingConfig
from viasd_adapters.verify import ConfidencePolicy, LosslessVerifier, Tier, TieredVerifier

GREEDY = SamplingConfig()
SAMPLED = SamplingConfig(temperature=1.0, seed=3)


@pytest.fixture(scope="module")
def slim(tiny_target):
    return perturbed(tiny_target.model, scale=0.01, seed=9)


def decode(tiny_target, tiny_draft, verifier, sampling=GREEDY, n=60):
    decoder = SpeculativeDecoder(ModelDrafter(tiny_draft), verifier, num_draft_tokens=4)
    return decoder.generate(PROMPT, n, sampling)


def ar_tokens(tiny_target, n=60):
    """Greedy AR: the independent reference of every lossless greedy reduction."""
    return AutoregressiveDecoder(tiny_target.model).generate(PROMPT, n).tokens


def test_slim_tier_off_equals_greedy_ar(tiny_target, tiny_draft):
    off = decode(tiny_target, tiny_draft, TieredVerifier(tiny_target.model))
    assert off.tokens == ar_tokens(tiny_target)
    assert set(off.stats.model_calls) == {"draft", "target"}
    assert 0 < off.stats.accepted < off.stats.drafted  # both accept and reject paths ran


def test_slim_tier_off_sampling_reproduces_the_target_distribution():
    """Statistical: with the tiers off, the first two sampled tokens follow the target's marginals."""
    target = tiny(seed=0, num_layers=2, init_std=0.5).model
    draft = perturbed(target, scale=0.02, seed=5)  # sum min(p1, q1) = 0.37: drafts are often kept
    N = 1500
    q1, q2 = exact_marginals(target, PROMPT, 2)  # [V] each
    p1 = exact_marginals(draft, PROMPT, 1)[0]
    decoder = SpeculativeDecoder(ModelDrafter(draft), TieredVerifier(target), num_draft_tokens=3)
    counts = torch.zeros(2, q1.numel())
    accepted = 0
    for seed in range(N):
        out = decoder.generate(PROMPT, 2, SamplingConfig(temperature=1.0, seed=seed))
        counts[0, out.tokens[0]] += 1
        counts[1, out.tokens[1]] += 1
        accepted += out.stats.accepted
    assert chi_square_power(q1, p1, N) > POWER  # the check tells the target from the draft
    assert accepted > N // 4  # drafts were kept, not only resampled
    for i, q in enumerate((q1, q2)):
        assert chi_square_p(counts[i], q) > P_MIN, (i, total_variation(counts[i], q))


def test_everything_escalated_equals_greedy_ar(tiny_target, tiny_draft, slim):
    policy = ConfidencePolicy(tau_accept=1.0, tau_slim=1.0)
    tiered = decode(tiny_target, tiny_draft, TieredVerifier(tiny_target.model, slim, policy))
    assert tiered.tokens == ar_tokens(tiny_target)
    # every round but a last one of zero drafts (budget of one token) runs the slim verifier
    assert tiered.stats.model_calls["slim"].calls >= tiered.stats.steps - 1
    assert set(tiered.stats.tier_counts) == {"full"}
    assert 0 < tiered.stats.accepted < tiered.stats.drafted


def test_everything_escalated_sampling_equals_plain_sd(tiny_target, tiny_draft, slim):
    """The slim forward draws no random numbers: the sampled tokens are plain SD's, seed for seed."""
    policy = ConfidencePolicy(tau_accept=1.0, tau_slim=1.0)
    plain = decode(tiny_target, tiny_draft, LosslessVerifier(tiny_target.model), SAMPLED)
    tiered = decode(tiny_target, tiny_draft, TieredVerifier(tiny_target.model, slim, policy), SAMPLED)
    assert tiered.tokens == plain.tokens
    assert tiered.stats.model_calls["slim"].calls >= tiered.stats.steps - 1


def test_zero_drift_cap_equals_greedy_ar(tiny_target, tiny_draft, slim):
    verifier = TieredVerifier(tiny_target.model, slim, ConfidencePolicy(0.0, 0.0, 0.0), max_unverified=0)
    out = decode(tiny_target, tiny_draft, verifier)
    assert out.tokens == ar_tokens(tiny_target)
    assert set(out.stats.tier_counts) == {"full"}


def test_a_perfect_slim_verifier_is_lossless_without_the_full_model(tiny_target, tiny_draft):
    """u == q: tier 1 keeps exactly q's argmax, tier 2 writes it; the full model only runs
    when the drift cap forces it."""
    ar = AutoregressiveDecoder(tiny_target.model).generate(PROMPT, 60)
    verifier = TieredVerifier(tiny_target.model, tiny_target.model, ConfidencePolicy(0.0, 0.0, 0.0), max_unverified=20)
    out = decode(tiny_target, tiny_draft, verifier)
    assert out.tokens == ar.tokens
    assert out.stats.tier_counts["slim"] > 0 and out.stats.tier_counts["accept"] > 0
    assert out.stats.model_calls["target"].calls <= 60 // 20 + 1


@pytest.mark.parametrize("rejudge", [True, False])
def test_tiers_account_for_every_decided_token(tiny_target, tiny_draft, slim, rejudge):
    policy = ConfidencePolicy(tau_accept=0.15, tau_slim=0.3)  # all three tiers occur on the tiny pair
    verifier = TieredVerifier(tiny_target.model, slim, policy, max_unverified=6, rejudge=rejudge)
    out = decode(tiny_target, tiny_draft, verifier, n=80)
    counts = out.stats.tier_counts
    assert counts[Tier.ACCEPT] > 0 and counts[Tier.ESCALATE] > 0
    assert len(out.tokens) == 80
    assert sum(counts.values()) == 80  # every committed token once, bonus tokens included


@pytest.mark.parametrize("cap", [1, 3, 5])
def test_drift_cap_forces_the_full_model(tiny_target, tiny_draft, cap):
    """No more than `cap` tokens are ever committed without the full model, and the cap is reached."""
    verifier = TieredVerifier(tiny_target.model, tiny_target.model, ConfidencePolicy(0.0, 0.0, 0.0), cap)
    drafter, sampler = ModelDrafter(tiny_draft), Sampler(GREEDY)
    ids, unjudged, most = PROMPT, 0, 0
    verifier.reset()
    for _ in range(20):
        block = drafter.propose(ids, 4, sampler)
        verdict = verifier.verify(ids, block, sampler)
        ids = torch.cat([ids, verdict.tokens[None]], dim=1)
        # counted from the verdicts alone: a full-model verdict settles everything up to its own token
        unjudged = 0 if "full" in verdict.tier_counts else unjudged + len(verdict.tokens)
        assert unjudged <= cap
        assert verifier.unverified_length(ids) == unjudged
        most = max(most, unjudged)
    assert most == cap


def test_policy_assigns_tiers_from_confidence():
    u = torch.tensor([[0.95, 0.05, 0.0], [0.1, 0.85, 0.05], [0.4, 0.3, 0.3]])
    p = torch.full((3, 3), 1 / 3)
    tiers = ConfidencePolicy(tau_accept=0.9, tau_slim=0.8).assign(torch.tensor([0, 0, 0]), p, u)
    assert [Tier.of(t) for t in tiers] == [Tier.ACCEPT, Tier.SLIM, Tier.ESCALATE]


@pytest.mark.parametrize("kwargs", [{"tau_accept": 1.5}, {"tau_slim": -0.1}, {"tau_draft": 2.0}])
def test_thresholds_out_of_range_raise(kwargs):
    with pytest.raises(ValueError, match="must be in \\[0, 1\\]"):
        ConfidencePolicy(**kwargs)


def test_policy_without_slim_raises(tiny_target):
    with pytest.raises(ValueError, match="needs a slim verifier"):
        TieredVerifier(tiny_target.model, None, ConfidencePolicy())


# ----------------------------------------------------------------------------- share_prefix

MASKS = {
    "layer2": RoutingMask([2]),  # p = 2
    "layer0": RoutingMask([0]),  # p = 0: nothing to share, the plain runners
    "attention1": RoutingMask(skip_attention=[1]),  # p = 1, a sub-block mask
    "mlp2-layer3": RoutingMask([3], skip_mlp=[2]),  # p = 2
}
MIXED = ConfidencePolicy(tau_accept=0.1, tau_slim=0.25)  # on the tiny pair all three tiers occur


def routed(tiny_target, mask, policy=MIXED, share_prefix=True, **kw):
    model = tiny_target.model
    return TieredVerifier(
        model, SlimModel(model, MASKS[mask]), policy, max_unverified=6, share_prefix=share_prefix, **kw
    )


def model_calls(out):
    return {name: (c.calls, c.tokens) for name, c in out.stats.model_calls.items()}


@pytest.mark.parametrize(
    ("mask", "K", "sampling"),
    [
        ("layer2", 3, GREEDY),
        ("layer2", 6, GREEDY),
        ("layer0", 4, GREEDY),
        ("attention1", 5, GREEDY),
        ("mlp2-layer3", 2, GREEDY),
        ("layer2", 4, SAMPLED),
        ("attention1", 3, SAMPLED),
    ],
    ids=lambda v: "sampled" if v is SAMPLED else "greedy" if v is GREEDY else None,
)
def test_shared_prefix_changes_no_token_and_no_call(tiny_target, tiny_draft, mask, K, sampling):
    """Same tokens, tiers, calls and tokens per call as the plain runners; only the layer work of
    an escalation shrinks (see tests/routing/test_shared_prefix.py)."""

    def run(share_prefix):
        verifier = routed(tiny_target, mask, share_prefix=share_prefix)
        return SpeculativeDecoder(ModelDrafter(tiny_draft), verifier, num_draft_tokens=K).generate(PROMPT, 60, sampling)

    plain, shared = run(False), run(True)
    assert shared.tokens == plain.tokens
    assert shared.stats.tier_counts == plain.stats.tier_counts
    assert model_calls(shared) == model_calls(plain)
    if sampling is SAMPLED:
        assert run(True).tokens == shared.tokens


def test_shared_prefix_escalations_see_what_a_full_forward_sees(tiny_target, tiny_draft):
    """Through accepts, rewrites, rejected blocks and a lagging target, every logits call equals a
    plain forward of its model over the whole sequence."""
    model = tiny_target.model
    verifier = routed(tiny_target, "layer2", rejudge=False)  # tier-1 tokens stay counted as such
    slim = verifier.slim.model
    checked = {"slim": 0, "target": 0, "lagging": 0}

    def checking(runner, reference):
        logits = runner.logits

        def call(ids, m):
            if ids.shape[1] - m > common_prefix_length(runner.cached_ids, ids[0]):
                checked["lagging"] += 1
            got = logits(ids, m)
            torch.testing.assert_close(got, reference(ids).logits[0, -m:], rtol=1e-4, atol=1e-4)
            checked[runner.name] += 1
            return got

        runner.logits = call

    checking(verifier.target, model)
    checking(verifier.slim, slim)
    out = decode(tiny_target, tiny_draft, verifier, n=80)
    counts = out.stats.tier_counts
    assert counts["accept"] > 0 and counts["slim"] > 0 and counts["full"] > 0
    assert out.stats.accepted < out.stats.drafted  # some blocks were cut short
    assert checked["target"] > 0 and checked["slim"] > 0 and checked["lagging"] > 0


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_shared_prefix_everything_escalated_equals_plain_sd(tiny_target, tiny_draft, sampling):
    plain = decode(tiny_target, tiny_draft, LosslessVerifier(tiny_target.model), sampling)
    verifier = routed(tiny_target, "layer2", ConfidencePolicy(tau_accept=1.0, tau_slim=1.0))
    out = decode(tiny_target, tiny_draft, verifier, sampling)
    assert out.tokens == (ar_tokens(tiny_target) if sampling is GREEDY else plain.tokens)
    assert out.stats.model_calls["target"].calls == plain.stats.model_calls["target"].calls


def test_shared_prefix_with_a_perfect_slim_verifier_is_ar(tiny_target, tiny_draft):
    """The identity mask shares every layer (p = L): an escalation is the LM head alone."""
    model = tiny_target.model
    ar = AutoregressiveDecoder(model).generate(PROMPT, 60)
    verifier = TieredVerifier(
        model,
        SlimModel(model, RoutingMask.none()),
        ConfidencePolicy(0.0, 0.0, 0.0),
        max_unverified=20,
        share_prefix=True,
    )
    assert verifier.shared.num_prefix_layers == 4
    out = decode(tiny_target, tiny_draft, verifier)
    assert out.tokens == ar.tokens
    assert out.stats.model_calls["target"].calls <= 60 // 20 + 1


def test_shared_prefix_off_when_nothing_is_shared(tiny_target):
    model = tiny_target.model
    no_prefix = routed(tiny_target, "layer0")
    assert no_prefix.shared is None and isinstance(no_prefix.target, CausalLMRunner)
    tiers_off = TieredVerifier(model, share_prefix=True)
    assert tiers_off.shared is None and tiers_off.slim is None
    with pytest.raises(ValueError, match="a SlimModel"):
        TieredVerifier(model, model, MIXED, share_prefix=True)
