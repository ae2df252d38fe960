import torch

from viasd_adapters.runner import CausalLMRunner, common_prefix_length


def test_common_prefix_length():
    a = torch.tensor([1, 2, 3, 4])
    assert common_prefix_length(a, torch.tensor([1, 2, 9])) == 2
    assert common_prefix_length(a, torch.tensor([1, 2])) == 2
    assert common_prefix_length(a, torch.tensor([7])) == 0


def test_rollback_and_catch_up_match_a_fresh_forward(tiny_target):
    model = tiny_target.model
    ids = torch.arange(10, 40)[None]
    fresh = model(ids).logits[0]  # [T, V]
    runner = CausalLMRunner(model)
    runner.logits(ids[:, :20], 1)
    # A rejected branch: the cache holds tokens that are not in the sequence any more.
    wrong = torch.cat([ids[:, :15], torch.tensor([[200, 201, 202]])], dim=1)
    runner.logits(wrong, 3)
    assert runner.cached_length == 18
    # Rolling back to 15 and catching up on 15 tokens happens in one call.
    out = runner.logits(ids, 6)
    assert runner.stats.tokens == 20 + 3 + 15
    torch.testing.assert_close(out, fresh[-6:], rtol=1e-4, atol=1e-4)
