import torch

from tests.decode.test_loops import PROMPT
from viasd_adapters.decode import AutoregressiveDecoder, SpeculativeDecoder
from viasd_adapters.draft import ModelDrafter
from viasd_adapters.sampling import Sampler, SamplingConfig
from viasd_adapters.verify import LosslessVerifier, SpeculativeCascadeVerifier, token_deferral


def test_deferral_rule_on_hand_made_distributions():
    p = torch.tensor([[0.9, 0.1, 0.0], [0.4, 0.3, 0.3]])
    q = torch.tensor([[0.8, 0.2, 0.0], [0.0, 1.0, 0.0]])
    assert token_deferral(p, q, alpha=0.5).tolist() == [False, True]
    assert token_deferral(p, q, alpha=10.0).tolist() == [False, False]


def test_never_deferring_follows_the_drafter(tiny_target, tiny_draft):
    draft_only = AutoregressiveDecoder(tiny_draft).generate(PROMPT, 40)
    verifier = SpeculativeCascadeVerifier(tiny_target.model, alpha=1e9)
    out = SpeculativeDecoder(ModelDrafter(tiny_draft), verifier, 4).generate(PROMPT, 40)
    assert out.tokens[:4] == draft_only.tokens[:4]  # then a bonus token from q changes the context
    assert out.stats.acceptance_rate == 1.0
    # every draft is the drafter's decision; the full model chose only each block's bonus token
    assert out.stats.tier_counts["draft"] == out.stats.drafted and out.stats.tier_counts["full"] == out.stats.steps


def test_cascade_accepts_at_least_what_plain_sd_accepts(tiny_target, tiny_draft):
    """Greedy, alpha = 0: where the cascade defers it judges as SD does, elsewhere it keeps the
    draft's own argmax; so on the same context and block it keeps at least SD's prefix."""
    ar = AutoregressiveDecoder(tiny_target.model).generate(PROMPT, 40).tokens
    drafter, sampler = ModelDrafter(tiny_draft), Sampler(SamplingConfig())
    cascade = SpeculativeCascadeVerifier(tiny_target.model, alpha=0.0)
    plain = LosslessVerifier(tiny_target.model)
    kept = {"cascade": 0, "sd": 0}
    for t in range(0, 40, 2):  # contexts along the target's own output
        ids = torch.cat([PROMPT, PROMPT.new_tensor([ar[:t]])], dim=1)
        block = drafter.propose(ids, 4, sampler)
        n_cascade = cascade.verify(ids, block, sampler).num_accepted
        n_sd = plain.verify(ids, block, sampler).num_accepted
        assert n_cascade >= n_sd
        kept["cascade"] += n_cascade
        kept["sd"] += n_sd
    assert 0 < kept["sd"] < kept["cascade"]  # SD rejects some drafts the cascade keeps
