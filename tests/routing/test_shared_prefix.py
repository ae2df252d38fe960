"""SharedPrefixRunner: layers [0, p) run once for the slim view and the full target (fp32)."""

import pytest
import torch

from tests.conftest import perturbed, tiny
from viasd_adapters.routing import RoutingMask, SharedPrefixRunner, SlimModel

IDS = torch.arange(10, 58)[None]  # [1, 48]
WRONG = torch.cat([IDS[:, :26], torch.tensor([[200, 201, 202]])], dim=1)  # a block rejected after 26

# (view, sequence, positions): slim passes, tier 1-2 commits the target never saw, escalations
# that catch up on them, a rejected block, a target call while the slim view lags (a block of
# zero drafts), and a request for positions both views already ran (the stored layer-p states
# were dropped: the prefix reruns from there).
SESSION = [
    ("slim", IDS[:, :20], 5),
    ("slim", IDS[:, :26], 7),
    ("target", IDS[:, :26], 3),  # catches up on 26 tokens: 20 + 6 committed by the slim tiers
    ("slim", WRONG, 4),
    ("target", WRONG, 4),
    ("target", IDS[:, :30], 1),  # rolls back to 26; runs the shared layers itself
    ("slim", IDS[:, :34], 5),  # catches up from 26 on the states the target's call left
    ("target", IDS[:, :34], 12),
    ("slim", IDS, 14),
    ("target", IDS, 1),
]


@pytest.fixture(scope="module")
def model():
    return tiny(seed=4, num_layers=4).model


def layer_tokens(model) -> tuple[list[int], list]:
    """Tokens each decoder layer processes, counted by forward hooks (removed by the caller)."""
    counts = [0] * len(model.model.layers)

    def hook(i):
        def count(module, args, kwargs):
            counts[i] += (args[0] if args else kwargs["hidden_states"]).shape[1]

        return count

    handles = [layer.register_forward_pre_hook(hook(i), with_kwargs=True) for i, layer in enumerate(model.model.layers)]
    return counts, handles


@pytest.mark.parametrize(
    "mask",
    [RoutingMask([2]), RoutingMask(skip_attention=[1]), RoutingMask([3], skip_mlp=[2]), RoutingMask.none()],
    ids=["layer2", "attention1", "mlp2-layer3", "none"],
)
def test_views_equal_plain_forwards_through_lag_and_rollback(model, mask):
    slim = SlimModel(model, mask)
    shared = SharedPrefixRunner(model, slim)
    with torch.no_grad():
        for name, ids, m in SESSION:
            got = getattr(shared, name).logits(ids, m)
            want = (slim if name == "slim" else model)(ids).logits[0, -m:]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=f"{name} {ids.shape[1]} {m}")
    assert shared.stats["slim"].calls == 5 and shared.stats["target"].calls == 5
    # tokens through each view's upper layers: T minus what its cache kept (at most T - m)
    assert shared.stats["slim"].tokens == 20 + 7 + 4 + (34 - 26) + (48 - 22)
    assert shared.stats["target"].tokens == 26 + 4 + (30 - 26) + 12 + (48 - 34)


def test_shared_layers_run_once_per_token(model):
    """Slim pass then escalation over the same tokens: layers [0, p) see each token once, the
    target's upper layers catch up on the lagging tokens and the block in one pass."""
    shared = SharedPrefixRunner(model, SlimModel(model, RoutingMask([2])))
    counts, handles = layer_tokens(model)
    try:
        shared.slim.logits(IDS[:, :20], 5)
        shared.slim.logits(IDS[:, :26], 7)  # 6 tokens committed without the target
        shared.target.logits(IDS[:, :30], 5)  # escalation after the slim pass over the block
    finally:
        for h in handles:
            h.remove()
    #            prefix [0, 2): once      layer 2: target only   layer 3: slim + target
    assert counts == [20 + 6 + 4, 20 + 6 + 4, 30, 20 + 7 + 30]
    assert shared.stats["target"].calls == 1 and shared.stats["target"].tokens == 30


def test_a_reset_starts_a_new_sequence(model):
    shared = SharedPrefixRunner(model, SlimModel(model, RoutingMask([2])))
    shared.slim.logits(WRONG, 3)
    shared.target.logits(WRONG, 3)
    shared.reset()
    assert shared.stats["slim"].calls == 0 and shared.pending is None
    with torch.no_grad():
        torch.testing.assert_close(shared.target.logits(IDS, 2), model(IDS).logits[0, -2:], rtol=1e-4, atol=1e-4)


def test_slim_must_be_a_view_of_the_target(model):
    with pytest.raises(ValueError, match="a SlimModel"):
        SharedPrefixRunner(model, perturbed(model, 0.01))
    other = tiny(seed=5, num_layers=4).model
    with pytest.raises(ValueError, match="view of another model"):
        SharedPrefixRunner(model, SlimModel(other, RoutingMask([2])))


def test_a_target_with_a_compiled_step_is_refused():
    """The shared stages bypass the target's decode step: on int8 that changed the host's output."""
    from viasd_adapters.models.compiled import attach_step

    target = tiny(seed=6, num_layers=4).model
    SharedPrefixRunner(target, SlimModel(target, RoutingMask([2])))  # no step, nothing bypassed
    assert attach_step(target, compile=False, warm_up=False) is not None  # the step's eager form: no compile
    with pytest.raises(ValueError, match="Set verifier.share_prefix=false"):
        SharedPrefixRunner(target, SlimModel(target, RoutingMask([2])))
