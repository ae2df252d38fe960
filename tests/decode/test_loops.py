import pytest
import torch

from tests.conftest import exact_marginals, perturbed, tiny
from viasd_adapters.decode import AutoregressiveDecoder, SpeculativeDecoder
from viasd_adapters.draft import ModelDrafter
from viasd_adapters.sampling import SamplingConfig
from viasd_adapters.verify import LosslessVerifier

PROMPT = torch.tensor([[72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100]])


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


def test_sd_sampling_reproduces_the_target_distribution():
    """Statistical: the marginal of the 2nd sampled token under SD equals the target's."""
    target = tiny(seed=0, num_layers=2, init_std=0.5).model
    draft = perturbed(target, scale=0.1, seed=5)
    N = 1500
    q1, exact = exact_marginals(target, PROMPT, 2)  # [V] each: the 1st and 2nd token's marginals
    p1 = exact_marginals(draft, PROMPT, 1)[0]
    V = q1.numel()
    decoder = sd(draft, target, k=3)
    counts = torch.zeros(V)
    for seed in range(N):
        tokens = decoder.generate(PROMPT, 2, SamplingConfig(temperature=1.0, seed=seed)).tokens
        counts[tokens[1]] += 1
    assert exact.max() > 0.05 and (p1 - q1).abs().max() > 0.1  # the check has teeth
    # 4.5 standard errors of a frequency at N = 1500 is at most 0.058
    assert (counts / N - exact).abs().max() < 0.058


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
