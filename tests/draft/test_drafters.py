import pytest
import torch

from tests.conftest import tiny
from tests.decode.test_loops import PROMPT
from viasd_adapters.decode import AutoregressiveDecoder, SpeculativeDecoder
from viasd_adapters.draft import CascadeDrafter, ModelDrafter, PromptLookupDrafter
from viasd_adapters.sampling import Sampler, SamplingConfig
from viasd_adapters.verify import LosslessVerifier

GREEDY = Sampler(SamplingConfig())


def test_lookup_copies_what_followed_the_latest_match():
    ids = torch.tensor([[5, 6, 7, 8, 1, 5, 6, 9, 2, 5, 6]])
    block = PromptLookupDrafter(max_ngram=2).propose(ids, 3, GREEDY)
    assert block.tokens.tolist() == [9, 2, 5]  # after the most recent earlier "5 6"
    assert block.probs is None and block.draft_probs(10)[0, 9] == 1.0


def test_lookup_backs_off_to_shorter_ngrams_and_runs_dry():
    ids = torch.tensor([[1, 2, 3, 4, 3]])
    assert PromptLookupDrafter(max_ngram=3).propose(ids, 2, GREEDY).tokens.tolist() == [4, 3]
    assert len(PromptLookupDrafter().propose(torch.tensor([[1, 2, 3]]), 4, GREEDY)) == 0


def test_lookup_rejects_bad_ngram_range():
    with pytest.raises(ValueError, match="min_ngram"):
        PromptLookupDrafter(max_ngram=1, min_ngram=2)


def test_lookup_sd_is_lossless():
    # A near-bigram target (one layer, tiny weights: the current token decides the next): its greedy
    # output revisits earlier tokens, so lookup's copies are sometimes right (on the tiny pair, never).
    target = tiny(seed=0, num_layers=1, init_std=0.002).model
    ar = AutoregressiveDecoder(target).generate(PROMPT, 60)
    out = SpeculativeDecoder(PromptLookupDrafter(), LosslessVerifier(target), 4).generate(PROMPT, 60)
    assert out.tokens == ar.tokens
    assert 0 < out.stats.accepted < out.stats.drafted  # both accept and reject paths ran


def test_cascade_drafts_exactly_what_its_model_would(tiny_target, tiny_draft):
    """Vertical cascade: lookup -> draft model is lossless w.r.t. the draft model."""
    plain = ModelDrafter(tiny_draft).propose(PROMPT, 6, GREEDY)
    cascade = CascadeDrafter(tiny_draft, PromptLookupDrafter(), lower_tokens=3)
    block = cascade.propose(PROMPT, 6, GREEDY)
    assert block.tokens.tolist() == plain.tokens.tolist()
    torch.testing.assert_close(block.probs, plain.probs, rtol=1e-4, atol=1e-5)


def test_cascade_sd_equals_ar(tiny_target, tiny_draft):
    ar = AutoregressiveDecoder(tiny_target.model).generate(PROMPT, 60)
    drafter = CascadeDrafter(tiny_draft, PromptLookupDrafter(), lower_tokens=3)
    out = SpeculativeDecoder(drafter, LosslessVerifier(tiny_target.model), 4).generate(PROMPT, 60)
    assert out.tokens == ar.tokens
    assert 0 < out.stats.accepted < out.stats.drafted  # both accept and reject paths ran
    assert set(out.stats.model_calls) == {"draft", "target"}
