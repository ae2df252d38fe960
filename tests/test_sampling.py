import pytest
import torch

from viasd_adapters.sampling import Sampler, SamplingConfig


def test_greedy_picks_argmax_and_keeps_softmax():
    logits = torch.tensor([0.0, 3.0, 1.0])
    token, probs = Sampler(SamplingConfig()).choose(logits)
    assert token == 1
    torch.testing.assert_close(probs, torch.softmax(logits, -1))


def test_top_k_and_top_p_zero_the_tail():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = Sampler(SamplingConfig(temperature=1.0, top_k=2)).probs(logits)
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    probs = Sampler(SamplingConfig(temperature=1.0, top_p=0.8)).probs(logits)
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_same_seed_same_draws():
    probs = torch.full((50,), 1 / 50)
    a, b = Sampler(SamplingConfig(1.0, seed=3)), Sampler(SamplingConfig(1.0, seed=3))
    assert [a.draw(probs) for _ in range(20)] == [b.draw(probs) for _ in range(20)]


@pytest.mark.parametrize("kwargs", [{"temperature": -1.0}, {"top_p": 0.0}, {"top_p": 1.5}, {"top_k": -2}])
def test_out_of_range_settings_raise(kwargs):
    with pytest.raises(ValueError):
        SamplingConfig(**kwargs)
