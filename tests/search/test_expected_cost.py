"""The cost-aware DIMR objective: block outcomes by hand and as the verifier decides them, pricing by a
profile, the store's keys."""

import math

import pytest
import torch

from tests.conftest import tiny
from viasd_adapters.costs import CostModel
from viasd_adapters.routing import RoutingMask
from viasd_adapters.sampling import Sampler, SamplingConfig
from viasd_adapters.search import (
    CalibrationSet,
    CalibrationText,
    EvaluationStore,
    ExpectedCost,
    MaskObjective,
    Reference,
)
from viasd_adapters.search.objective import MaskMetrics, block_outcomes
from viasd_adapters.verify.decision import SlimScores, decide
from viasd_adapters.verify.policy import ConfidencePolicy, Tier


def _log(rows):
    """[m, 3] log-distributions from rows of probabilities."""
    return torch.tensor(rows, dtype=torch.float32).log()


def test_block_outcomes_by_hand():
    # target's tokens: 0, 0, 1, 2
    q = _log([[0.9, 0.05, 0.05], [0.6, 0.3, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    u = _log(
        [
            [0.95, 0.03, 0.02],  # agrees, confident: tier 1 accepts
            [0.50, 0.40, 0.10],  # agrees, not confident, max 0.5: escalates
            [0.05, 0.93, 0.02],  # agrees, confident: accepts
            [0.91, 0.05, 0.04],  # disagrees, confident: tier 2 rewrites (wrongly)
        ]
    )
    settled, wrong = block_outcomes(q, u, ConfidencePolicy(tau_accept=0.9, tau_slim=0.9), block=2)
    # blocks [0,1]: first non-accepted is 1 (not confident) -> escalate; [1,2]: 1 -> escalate;
    # [2,3]: 2 accepted, 3 rewritten -> settled
    assert settled.tolist() == [False, False, True]
    assert wrong.tolist() == [False, False, False, True]
    settled, _ = block_outcomes(q, u, ConfidencePolicy(tau_accept=0.9, tau_slim=0.45), block=2)
    assert settled.tolist() == [True, True, True]  # position 1 is now a confident (correct) rewrite
    settled, _ = block_outcomes(q, u, ConfidencePolicy(tau_accept=0.9, tau_slim=0.9), block=5)
    assert settled.numel() == 0  # no block fits in 4 positions


def _logits(m: int, V: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[m, V] log q and log u: u mostly follows q, sometimes confidently elsewhere, q sometimes flat."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(m, V, generator=g) * torch.rand(m, 1, generator=g) * 6  # [m, V], confidence varies
    u = q + torch.randn(m, V, generator=g)  # [m, V]
    other = torch.rand(m, generator=g) < 0.25  # u confident on another token there
    u[other, torch.randint(V, (int(other.sum()),), generator=g)] += 8
    return torch.log_softmax(q, -1), torch.log_softmax(u, -1)


@pytest.mark.parametrize(
    "policy",
    [
        ConfidencePolicy(0.5, 0.0, 0.5),
        ConfidencePolicy(0.6, 0.7, 0.9),
        ConfidencePolicy(0.3, 0.5, 1.0),
        ConfidencePolicy(0.8, 1.0, 0.6),
    ],
)
def test_settled_blocks_are_the_blocks_the_verifiers_decision_settles(policy):
    """The objective must count what `TieredVerifier` would do with a draft that agrees with the
    target (p = q): one decision per block, by the policy's own rule, tau_draft included."""
    log_q, log_u = _logits(60, 7, seed=3)
    block = 3
    settled, wrong = block_outcomes(log_q, log_u, policy, block)
    sampler = Sampler(SamplingConfig(), torch.device("cpu"))
    x, q = log_q.argmax(-1), log_q.exp()
    for start in range(len(settled)):
        rows = slice(start, start + block + 1)  # the block's K positions and the one after it
        drafts = slice(start, start + block)
        decision = decide(policy, x[drafts], q[drafts], SlimScores.of(log_u[rows], sampler), sampler, room=100)
        assert bool(settled[start]) == (decision.tier != Tier.ESCALATE), start
    y = log_u.argmax(-1)
    for i in range(len(x)):  # wrong: u rewrites with its own token, or would accept it if drafted
        one = slice(i, i + 1)
        acts = (
            policy.assign(x[one], q[one], log_u[one].exp())[0] == Tier.SLIM.code
            or policy.assign(y[one], q[one], log_u[one].exp())[0] == Tier.ACCEPT.code
        )
        assert bool(wrong[i]) == (bool(y[i] != x[i]) and acts), i
    assert 0 < int(settled.sum()) < len(settled)  # both outcomes occur: the comparison means something


def test_the_drafts_own_threshold_changes_what_the_slim_tier_settles():
    log_q, log_u = _logits(60, 7, seed=3)
    loose, _ = block_outcomes(log_q, log_u, ConfidencePolicy(0.5, 0.0, 0.9), block=3)
    strict, _ = block_outcomes(log_q, log_u, ConfidencePolicy(0.5, 0.6, 0.9), block=3)
    assert (strict != loose).any()  # ignoring tau_draft would leave these equal
    costs = CostModel.synthetic(6, 0.1)
    assert ExpectedCost(costs, tau_draft=0.6).key() != ExpectedCost(costs).key()  # stored rows kept apart


def _profile(num_layers=6):
    # target: 1 ms per call fixed, 1 ms per layer; tokens cost nothing
    return CostModel.synthetic(num_layers, draft_ratio=0.1, per_layer_share=6 / 7)


def test_ratios_price_slim_and_shared_prefix_escalation_by_layers():
    expected = ExpectedCost(_profile(), block=3)
    late = RoutingMask([4, 5], num_layers=6)
    slim, escalate = expected.ratios(late, 6)
    assert slim == pytest.approx(5 / 7)  # 1 + 4 layers of 1 + 6
    assert escalate == pytest.approx(3 / 7)  # head + layers 4..5 re-run over the stored layer-4 states
    no_share = ExpectedCost(_profile(), block=3, share_prefix=False)
    assert no_share.ratios(late, 6) == pytest.approx((5 / 7, 1.0))
    assert expected.key() != no_share.key()


CAL = [(40, 16), (25, 10), (33, 20)]


def calibration() -> CalibrationSet:
    g = torch.Generator().manual_seed(0)
    texts = [
        CalibrationText(f"t{i}", torch.randint(0, 256, (n,), generator=g).tolist(), m) for i, (n, m) in enumerate(CAL)
    ]
    return CalibrationSet(texts, key="test")


@pytest.fixture(scope="module")
def reference():
    return Reference(tiny(seed=5, num_layers=6).model, calibration(), progress=False)


def test_identity_mask_settles_every_block_and_costs_one_slim_pass(reference):
    expected = ExpectedCost(_profile(), tau_accept=0.0, tau_slim=0.0, block=4)
    m = MaskObjective(reference, expected)(RoutingMask.none(6))
    assert m.settled == 1.0 and m.wrong == 0.0
    assert m.block_cost == pytest.approx(1.0) and m.expected == pytest.approx(1.0)
    assert m.cost("expected") == m.expected


def test_expected_cost_combines_settled_share_ratios_and_penalty(reference):
    expected = ExpectedCost(_profile(), tau_accept=0.05, tau_slim=0.05, block=2, max_wrong=0.0, penalty=3.0)
    mask = RoutingMask([3, 4], num_layers=6)
    m = MaskObjective(reference, expected)(mask)
    slim, escalate = expected.ratios(mask, 6)
    assert m.block_cost == pytest.approx(slim + (1 - m.settled) * escalate)
    assert m.expected == pytest.approx(m.block_cost + 3.0 * m.wrong)
    assert 0 < m.top1 < 1 and 0 <= m.settled <= 1 and not math.isnan(m.wrong)
    plain = MaskObjective(reference)(mask)
    assert plain.expected is None and (plain.kl, plain.top1) == (m.kl, m.top1)
    with pytest.raises(ValueError, match="ExpectedCost"):
        plain.cost("expected")


def test_store_keeps_evaluations_of_other_cost_settings_apart(reference, tmp_path):
    store = EvaluationStore(tmp_path / "evals.jsonl")
    mask = RoutingMask([2], num_layers=6)
    kl_only = store.attach(MaskObjective(reference))
    kl_only(mask)
    priced = store.attach(MaskObjective(reference, ExpectedCost(_profile(), block=2)))
    assert not priced.memo  # the KL-only row lacks expected-cost fields: not reused
    first = priced(mask)
    again = store.attach(MaskObjective(reference, ExpectedCost(_profile(), block=2)))
    assert again.memo and again(mask) == first and again.evaluations == 0
    assert MaskMetrics.from_dict(first.to_dict()) == first
