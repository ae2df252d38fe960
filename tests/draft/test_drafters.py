import pytest
import torch

from tests.conftest import exact_marginals, tiny
from tests.decode.test_loops import N_SAMPLED, PROMPT, sampling_pair
from tests.verify.statistics import P_MIN, POWER, chi_square_p, chi_square_power, sample_counts, total_variation
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


def test_lookup_sampling_reproduces_the_target_distribution():
    """Statistical: a lookup draft is a point mass (p = one-hot), kept with probability q(x) and
    otherwise recovered from q without x; the first two sampled tokens follow q's marginals."""
    target, _ = sampling_pair()
    # PROMPT's last token once before, followed by 208: lookup drafts 208 first, which q gives 0.41
    prompt = torch.cat([torch.tensor([[100, 208]]), PROMPT], 1)
    q = exact_marginals(target, prompt, 2)  # [2, V]
    decoder = SpeculativeDecoder(PromptLookupDrafter(), LosslessVerifier(target), 3)
    counts, results = sample_counts(decoder, prompt, q.shape[1], 2, N_SAMPLED)
    drafted, accepted = sum(r.stats.drafted for r in results), sum(r.stats.accepted for r in results)
    assert N_SAMPLED // 4 < accepted < drafted - N_SAMPLED // 4  # copies were kept and rejected
    lossy = q[0] * (1 - q[0, 208])  # a lookup SD that recovered from q itself, 208 included
    lossy[208] += q[0, 208]
    assert chi_square_power(q[0], lossy, N_SAMPLED) > POWER
    for i in range(2):
        assert chi_square_p(counts[i], q[i]) > P_MIN, (i, total_variation(counts[i], q[i]))
