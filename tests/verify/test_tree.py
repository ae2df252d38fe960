"""Draft trees: their layout, the routed view's tree forward, and TieredVerifier judging trees as chains."""

import pytest
import torch

from tests.conftest import tiny
from viasd_adapters.draft.base import DraftBlock
from viasd_adapters.routing import RoutingMask, SlimModel
from viasd_adapters.runner import CausalLMRunner
from viasd_adapters.sampling import Sampler, SamplingConfig
from viasd_adapters.verify import ConfidencePolicy, LosslessVerifier, Tier, TieredVerifier, greedy_match
from viasd_adapters.verify.gate import DraftConfidenceGate
from viasd_adapters.verify.tree import DraftTree, TreeAcceptance, TreeJudge, keep_path, score_tree

PROMPT = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
GREEDY = Sampler(SamplingConfig())


@pytest.fixture(scope="module")
def target():
    return tiny(seed=0, num_layers=4).model


class GreedyPathJudge(TreeJudge):
    """A lossless greedy tree judge: the target scores every path (no cache), the longest match wins."""

    def __init__(self, model):
        self.model, self.read, self.calls = model, 0, 0

    @property
    def cached_length(self) -> int:
        return self.read

    @torch.no_grad()
    def judge(self, input_ids, tree, sampler):
        self.calls += 1
        T = input_ids.shape[1]
        best = None
        for path in tree.paths:
            logits = self.model(torch.cat([input_ids, tree.tokens[path][None]], 1)).logits[0, T - 1 :]
            outcome = greedy_match(tree.tokens[path], logits)
            if best is None or outcome.num_accepted > best[1].num_accepted:
                best = path, outcome
        path, outcome = best
        self.read = T + outcome.num_accepted
        return TreeAcceptance(path[: outcome.num_accepted], outcome.next_token)


def _greedy(model, ids, n):
    """n greedy tokens of `model` after ids [1, T]."""
    out = []
    for _ in range(n):
        token = int(model(ids).logits[0, -1].argmax())
        out.append(token)
        ids = torch.cat([ids, torch.tensor([[token]])], 1)
    return out


# ----------------------------------------------------------------------------- layout
def test_a_chain_is_a_tree_with_one_path():
    tree = DraftTree.chain(torch.tensor([4, 5, 6]))
    assert tree.depth.tolist() == [1, 2, 3] and tree.max_depth == 3
    assert [p.tolist() for p in tree.paths] == [[0, 1, 2]]
    assert torch.equal(tree.attention, torch.ones(3, 3, dtype=torch.bool).tril())


def test_tree_depth_paths_and_layout_by_hand():
    tree = DraftTree(torch.tensor([20, 21, 22, 23, 24]), torch.tensor([-1, -1, 0, 0, 2]))
    assert tree.depth.tolist() == [1, 1, 2, 2, 3]
    assert [p.tolist() for p in tree.paths] == [[1], [0, 3], [0, 2, 4]]  # leaves in draft order
    positions, attend = tree.layout(start=2, end=5)  # committed positions 2, 3, 4 lag behind the cache
    assert positions.tolist() == [2, 3, 4, 5, 5, 6, 6, 7]
    assert attend[3:, :3].all() and not attend[:3, 3:].any()  # drafts see every lagging token, not vice versa
    assert attend[3 + 4].tolist() == [True] * 3 + [True, False, True, False, True]  # draft 4: 0, 2 and itself
    assert not attend[3 + 1, 3 + 0]  # siblings do not see each other


# ----------------------------------------------------------------------------- the routed view over a tree
@pytest.mark.parametrize(
    "mask",
    [RoutingMask.none(), RoutingMask(skip_layers=(1,)), RoutingMask(skip_mlp=(2,)), RoutingMask(skip_attention=(0,))],
    ids=["none", "layer", "mlp", "attention"],
)
def test_a_tree_forward_scores_each_draft_as_its_path_would(target, mask):
    """One mask, one executor: row n + 1 of the tree forward is what the chain forward of the path to
    draft n gives, with lagging tokens read first; `keep_path` leaves a cache the chain path continues."""
    view = SlimModel(target, mask)
    tree = DraftTree(torch.tensor([20, 21, 22, 23, 24]), torch.tensor([-1, -1, 0, 0, 2]))
    runner = CausalLMRunner(view, "slim")
    runner.logits(PROMPT[:, :4], 1)  # the cache lags three committed tokens behind
    logits, features = score_tree(runner, PROMPT, tree)
    assert logits.shape == (6, target.config.vocab_size) and features.shape == (1, 6, target.config.hidden_size)
    assert runner.stats.tokens == 4 + 3 + 5
    fresh = CausalLMRunner(view, "chain")
    for n in range(5):
        path = tree.attention[n].nonzero()[:, 0]
        chain = fresh.logits(torch.cat([PROMPT, tree.tokens[path][None]], 1), path.numel() + 1)
        rows = torch.cat([torch.zeros(1, dtype=torch.long), path + 1])
        torch.testing.assert_close(logits[rows], chain, rtol=1e-4, atol=1e-4)  # other shapes, other rounding
    keep_path(runner, PROMPT, tree, torch.tensor([0, 2]))
    assert runner.cached_ids.tolist() == PROMPT[0].tolist() + [20, 22]
    following = torch.cat([PROMPT, torch.tensor([[20, 22, 3]])], 1)
    torch.testing.assert_close(runner.logits(following, 1), fresh.logits(following, 1), rtol=1e-4, atol=1e-4)
    assert runner.stats.tokens == 4 + 8 + 1  # only the new token was fed: the kept path's KV was reused


# ----------------------------------------------------------------------------- TieredVerifier over trees
def _tiered(target, **kw):
    kw.setdefault("policy", ConfidencePolicy(0.0, 0.0, 0.0))
    return TieredVerifier(target, SlimModel(target, RoutingMask.none()), **kw)


def _greedy_tree(target):
    """A tree whose first path is the target's greedy continuation (u = q accepts it whole)."""
    a, b, c = _greedy(target, PROMPT, 3)
    return DraftTree(torch.tensor([(a + 1) % 50, a, b, (b + 1) % 50, c]), torch.tensor([-1, -1, 1, 1, 2]))


def test_tiers_off_a_tree_is_its_judges(target):
    tree = _greedy_tree(target)
    for verifier in (LosslessVerifier(target), TieredVerifier(target)):
        judge = GreedyPathJudge(target)
        verdict = verifier.verify_tree(PROMPT, tree, GREEDY, judge)
        assert judge.calls == 1 and verdict.features is None and verdict.last_tier == Tier.ESCALATE
        assert verdict.path.tolist() == [1, 2, 4] and verdict.tier_counts == {Tier.ESCALATE: 4}
        assert verdict.tokens.tolist() == _greedy(target, PROMPT, 4) and verdict.num_drafted == 3


def test_a_perfect_slim_verifier_settles_the_tree_as_the_target_would(target):
    verifier = _tiered(target)
    judge = GreedyPathJudge(target)
    verdict = verifier.verify_tree(PROMPT, _greedy_tree(target), GREEDY, judge)
    assert judge.calls == 0 and verdict.last_tier == Tier.SLIM  # u's bonus token after the path
    assert verdict.tier_counts == {Tier.ACCEPT: 3, Tier.SLIM: 1}
    assert verdict.tokens.tolist() == _greedy(target, PROMPT, 4)
    assert verdict.features.shape == (1, 4, target.config.hidden_size)  # the root's and the 3 kept drafts'
    assert verifier.stats["slim"].calls == 1 and verifier.slim.cached_ids.numel() == PROMPT.shape[1] + 3


@pytest.mark.parametrize("tau", [0.0, 0.99])
def test_one_verifier_judges_a_chain_and_the_same_chain_as_a_tree_alike(target, tau):
    """The counts, the tiers and the room are one rule: `verify` on a block and `verify_tree` on it."""
    draft = torch.tensor(_greedy(target, PROMPT, 2) + [7, 8])  # two right, then wrong
    chain, tree = (
        _tiered(target, policy=ConfidencePolicy(tau, 0.0, tau)),
        _tiered(target, policy=ConfidencePolicy(tau, 0.0, tau)),
    )
    a = chain.verify(PROMPT, DraftBlock(draft, None), GREEDY)
    b = tree.verify_tree(PROMPT, DraftTree.chain(draft), GREEDY, GreedyPathJudge(target))
    assert (a.tokens.tolist(), a.num_accepted, a.num_drafted, a.tier_counts, a.last_tier) == (
        b.tokens.tolist(),
        b.num_accepted,
        b.num_drafted,
        b.tier_counts,
        b.last_tier,
    )


def test_the_drift_cap_and_a_closed_gate_send_the_tree_to_the_judge(target):
    V = target.config.vocab_size
    probs = torch.full((5, V), 0.5 / (V - 1))
    tree = _greedy_tree(target)
    probs[torch.arange(5), tree.tokens] = 0.5
    tree = DraftTree(tree.tokens, tree.parents, probs)
    for verifier in (_tiered(target, max_unverified=0), _tiered(target, gate=DraftConfidenceGate(0.6))):
        judge = GreedyPathJudge(target)
        assert verifier.verify_tree(PROMPT, tree, GREEDY, judge).last_tier == Tier.ESCALATE
        assert judge.calls == 1 and verifier.stats["slim"].calls == 0
    opened = _tiered(target, gate=DraftConfidenceGate(0.4))
    assert opened.verify_tree(PROMPT, tree, GREEDY, GreedyPathJudge(target)).last_tier == Tier.SLIM
    # the lag counts against the room: the judge has read 3 fewer committed tokens than there are
    capped, judge = _tiered(target, max_unverified=4), GreedyPathJudge(target)
    judge.read = PROMPT.shape[1] - 3  # a lag of 2: room for two drafts
    verdict = capped.verify_tree(PROMPT, tree, GREEDY, judge)  # the third is the full model's: it re-judges all
    assert verdict.tier_counts == {Tier.ESCALATE: 4} and judge.calls == 1


def test_without_rejudge_tier_one_drafts_are_kept_and_the_next_position_is_the_full_models(target):
    good = _greedy(target, PROMPT, 2)
    tree = DraftTree.chain(torch.tensor(good + [7]))
    policy = ConfidencePolicy(0.0, 0.0, 0.0)
    policy.assign = lambda tokens, p, u: torch.tensor([1, 1, 3])  # tier 1, tier 1, escalate
    verifier, judge = _tiered(target, policy=policy, rejudge=False), GreedyPathJudge(target)
    verdict = verifier.verify_tree(PROMPT, tree, GREEDY, judge)
    assert verdict.tokens.tolist() == good and verdict.tier_counts == {Tier.ACCEPT: 2} and judge.calls == 0
    assert verdict.last_tier == Tier.ACCEPT  # a settled round: the full model ran no forward
    after = torch.cat([PROMPT, verdict.tokens[None]], 1)
    nxt = verifier.verify_tree(after, DraftTree.chain(torch.tensor([7])), GREEDY, judge)
    assert judge.calls == 1 and nxt.last_tier == Tier.ESCALATE and verifier.stats["slim"].calls == 1
    rejudging, judge = _tiered(target, policy=policy), GreedyPathJudge(target)
    assert rejudging.verify_tree(PROMPT, tree, GREEDY, judge).tier_counts == {Tier.ESCALATE: 3}
    assert judge.calls == 1
