"""The cost-aware DIMR objective: block outcomes by hand, pricing by a profile, the store's keys."""

import math

import pytest
import torch

from tests.conftest import tiny
from viasd_adapters.costs import CostModel
from viasd_adapters.routing import RoutingMask
from viasd_adapters.search import CalibrationSet, CalibrationText, EvaluationStore, ExpectedCost, MaskObjective, Reference
from viasd_adapters.search.objective import MaskMetrics, block_outcomes


def _log(rows):
    """[m, 3] log-distributions from rows of probabilities."""
    return torch.tensor(rows, dtype=torch.float32).log()


def test_block_outcomes_by_hand():
    # target's tokens: 0, 0, 1, 2
    q = _log([[0.9, 0.05, 0.05], [0.6, 0.3, 0.1], [0.1, 0.8, 0.1], [0.1, 0.1, 0.8]])
    u = _log([
        [0.95, 0.03, 0.02],  # agrees, confident: tier 1 accepts
        [0.50, 0.40, 0.10],  # agrees, not confident, max 0.5: escalates
        [0.05, 0.93, 0.02],  # agrees, confident: accepts
        [0.91, 0.05, 0.04],  # disagrees, confident: tier 2 rewrites (wrongly)
    ])
    settled, wrong = block_outcomes(q, u, tau_accept=0.9, tau_slim=0.9, block=2)
    # blocks [0,1]: first non-accepted is 1 (not confident) -> escalate; [1,2]: 1 -> escalate;
    # [2,3]: 2 accepted, 3 rewritten -> settled
    assert settled.tolist() == [False, False, True]
    assert wrong.tolist() == [False, False, False, True]
    settled, _ = block_outcomes(q, u, tau_accept=0.9, tau_slim=0.45, block=2)
    assert settled.tolist() == [True, True, True]  # position 1 is now a confident (correct) rewrite
    settled, _ = block_outcomes(q, u, tau_accept=0.9, tau_slim=0.9, block=5)
    assert settled.numel() == 0  # no block fits in 4 positions


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
    texts = [CalibrationText(f"t{i}", torch.randint(0, 256, (n,), generator=g).tolist(), m) for i, (n, m) in enumerate(CAL)]
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
