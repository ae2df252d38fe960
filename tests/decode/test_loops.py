import pytest
import torch

from tests.conftest import exact_marginals, perturbed, tiny
from tests.verify.statistics import P_MIN, POWER, chi_square_p, chi_square_power, sample_counts, total_variation
from viasd_adapters.decode import AutoregressiveDecoder, SpeculativeDecoder
from viasd_adapters.draft import ModelDrafter
from viasd_adapters.sampling import SamplingConfig
from viasd_adapters.verify import LosslessVerifier, acceptance

PROMPT = torch.tensor([[72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]])
N_SAMPLED = 1500  # generations per statistical test


def sd(draft_model, target_model, k=4):
    return SpeculativeDecoder(ModelDrafter(draft_model), LosslessVerifier(target_model), k)


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_sd_equals_greedy_ar_fp32(tiny_target, tiny_draft, k):
    ar = AutoregressiveDecoder(tiny_target.model).generate(PROMPT, 80)
    out = sd(tiny_draft, tiny_target.model, k).generate(PROMPT, 80)
    assert out.tokens == ar.tokens
    assert 0 < out.stats.acceptance_rate < 1  # the test exercises both accept and reject paths
    assert out.stats.model_calls["target"].calls < len(ar.tokens)


def test_draft_equal_to_target_accepts_everything(tiny_target):
    out = sd(tiny_target.model, tiny_target.model, k=4).generate(PROMPT, 40)
    assert out.stats.acceptance_rate == 1.0
    assert out.stats.mean_accepted_length == 5.0


def test_stop_token_and_budget_end_the_generation(tiny_target, tiny_draft):
    ar = AutoregressiveDecoder(tiny_target.model).generate(PROMPT, 30)
    stop = ar.tokens[7]
    first = ar.tokens.index(stop)
    for decoder in (AutoregressiveDecoder(tiny_target.model), sd(tiny_draft, tiny_target.model)):
        out = decoder.generate(PROMPT, 30, stop_token_ids=(stop,))
        assert out.tokens == ar.tokens[: first + 1]
        assert len(decoder.generate(PROMPT, 9).tokens) == 9


def test_seeded_sampling_is_reproducible(tiny_target, tiny_draft):
    decoder = sd(tiny_draft, tiny_target.model)
    run = lambda seed: decoder.generate(PROMPT, 40, SamplingConfig(temperature=1.0, seed=seed)).tokens
    assert run(7) == run(7)
    assert run(7) != run(8)


def sampling_pair():
    """A peaked 2-layer target and a draft that differs from it: sum min(p1, q1) = 0.37, so the first
    draft is kept in about a third of the generations and recovered from the residual otherwise."""
    target = tiny(seed=0, num_layers=2, init_std=0.5).model
    return target, perturbed(target, scale=0.02, seed=5)


def test_sd_sampling_reproduces_the_target_distribution():
    """Statistical: the first two sampled tokens under SD follow the target's exact marginals."""
    target, draft = sampling_pair()
    q, p = exact_marginals(target, PROMPT, 2), exact_marginals(draft, PROMPT, 2)  # [2, V] each
    counts, results = sample_counts(sd(draft, target, k=3), PROMPT, q.shape[1], 2, N_SAMPLED)
    drafted, accepted = sum(r.stats.drafted for r in results), sum(r.stats.accepted for r in results)
    assert N_SAMPLED // 4 < accepted < drafted - N_SAMPLED // 4  # drafts were kept and rejected
    for i in range(2):
        assert chi_square_power(q[i], p[i], N_SAMPLED) > POWER  # it tells the target from the draft
        assert chi_square_p(counts[i], q[i]) > P_MIN, (i, total_variation(counts[i], q[i]))


def recover_from_q(draft_tokens, p, q, sampler):
    """A lossy speculative step: the token after a rejection is drawn from q, not norm(max(0, q - p))."""
    for i, x in enumerate(draft_tokens.tolist()):
        if sampler.uniform() * float(p[i, x]) >= float(q[i, x]):
            return i, sampler.draw(q[i])
    return len(draft_tokens), None


def test_the_statistical_check_rejects_a_lossy_sampler(monkeypatch):
    """The check above, on SD with a classic bug: it over-weights the tokens the draft likes, and fails."""
    target, draft = sampling_pair()
    q1, p1 = exact_marginals(target, PROMPT, 1)[0], exact_marginals(draft, PROMPT, 1)[0]  # [V] each
    kept = torch.minimum(p1, q1)
    lossy = kept + (1 - kept.sum()) * q1  # the first token's marginal under the bug
    assert chi_square_power(q1, lossy, N_SAMPLED) > POWER
    monkeypatch.setattr(acceptance, "speculative_prefix", recover_from_q)
    counts, _ = sample_counts(sd(draft, target, k=3), PROMPT, q1.numel(), 2, N_SAMPLED)  # the 1st token is drafted
    assert chi_square_p(counts[0], q1) < P_MIN
    assert chi_square_p(counts[0], lossy) > P_MIN  # it samples what the bug's math says


def test_bad_input_raises_clear_errors(tiny_target, tiny_draft):
    decoder = sd(tiny_draft, tiny_target.model)
    with pytest.raises(ValueError, match="empty"):
        decoder.generate(PROMPT[:, :0], 5)
    with pytest.raises(ValueError, match="batch size 2"):
        decoder.generate(PROMPT.expand(2, -1), 5)
    with pytest.raises(ValueError, match="context window is 512"):
        decoder.generate(torch.zeros(1, 600, dtype=torch.long), 5)
    other_vocab = tiny(seed=0, vocab_size=300).model
    with pytest.raises(ValueError, match="vocabulary"):
        sd(other_vocab, tiny_target.model)


def test_budget_is_clamped_to_the_context_window(tiny_target, tiny_draft):
    long_prompt = torch.randint(0, 256, (1, 505), generator=torch.Generator().manual_seed(0))
    out = sd(tiny_draft, tiny_target.model).generate(long_prompt, 50)
    assert len(out.tokens) == 7
