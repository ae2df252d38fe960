import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    DynamicCache,
    Gemma2Config,
    Gemma3TextConfig,
    GemmaConfig,
    GPT2Config,
    MistralConfig,
    Qwen3Config,
)

from tests.conftest import tiny
from viasd_adapters.routing import RoutingMask, SlimModel
from viasd_adapters.runner import CausalLMRunner

IDS = torch.arange(10, 58)[None]  # [1, 48]


def rollback_session(runner: CausalLMRunner) -> list[torch.Tensor]:
    """Prefill, decode, verify a block, reject part of it, catch up: every call's logits."""
    wrong = torch.cat([IDS[:, :25], torch.tensor([[200, 201, 202, 203]])], dim=1)
    return [
        runner.logits(IDS[:, :20], 1),
        runner.logits(IDS[:, :21], 1),
        runner.logits(wrong, 5),  # a draft block that will be rejected after token 25
        runner.logits(IDS[:, :30], 6),  # rollback to 25 and catch up in one call
        runner.logits(IDS, 8),
    ]


def manual_reference(model, ids: torch.Tensor, mask: RoutingMask) -> torch.Tensor:
    """Logits computed by hand: embeddings, rotary, the kept layers' own forwards, norm, head."""
    body = model.model
    T = ids.shape[1]
    hidden = body.embed_tokens(ids)
    position_ids = torch.arange(T)[None]
    rotary = body.rotary_emb(hidden, position_ids)
    for i, layer in enumerate(body.layers):
        if i in mask.skip_layers:
            continue
        if i in mask.skip_attention or i in mask.skip_mlp:
            if i not in mask.skip_attention:
                a = layer.self_attn(layer.input_layernorm(hidden), position_embeddings=rotary, attention_mask=None)[0]
                hidden = hidden + a
            if i not in mask.skip_mlp:
                hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            continue
        hidden = layer(hidden, attention_mask=None, position_ids=position_ids, position_embeddings=rotary)
    return model.lm_head(body.norm(hidden))[0]  # [T, V]


@pytest.mark.parametrize("architecture", ["llama", "qwen2"])
def test_empty_mask_equals_full_model_exactly(architecture):
    model = tiny(seed=3, architecture=architecture).model
    slim = SlimModel(model, RoutingMask.none())
    with torch.no_grad():
        assert torch.equal(slim(IDS).logits, model(IDS).logits)
    full_calls = rollback_session(CausalLMRunner(model))
    slim_calls = rollback_session(CausalLMRunner(slim))
    for a, b in zip(full_calls, slim_calls):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "mask",
    [
        RoutingMask([1]),
        RoutingMask([0, 2]),  # layer 0 skipped: positions must not come from layer 0's cache
        RoutingMask(skip_attention=[0], skip_mlp=[2]),
        RoutingMask([3], skip_attention=[1]),
    ],
    ids=lambda m: m.describe(),
)
def test_slim_equals_manual_reference_through_rollback(mask):
    model = tiny(seed=1, num_layers=4).model
    slim = SlimModel(model, mask)
    with torch.no_grad():
        reference = manual_reference(model, IDS, mask)
        torch.testing.assert_close(slim(IDS).logits[0], reference, rtol=1e-4, atol=1e-4)
    calls = rollback_session(CausalLMRunner(slim))
    torch.testing.assert_close(calls[-1], reference[-8:], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(calls[0], reference[19:20], rtol=1e-4, atol=1e-4)
    # The full model's logits differ: the mask did something.
    assert not torch.allclose(calls[-1], model(IDS).logits[0, -8:])


def test_slim_and_full_side_by_side():
    model = tiny(seed=2).model
    runners = {
        "full": CausalLMRunner(model),
        "slim1": CausalLMRunner(SlimModel(model, RoutingMask([1]))),
        "slim02": CausalLMRunner(SlimModel(model, RoutingMask([0, 2]))),
    }
    alone = {name: rollback_session(CausalLMRunner(r.model)) for name, r in runners.items()}
    # Interleave the three views call by call on one set of weights.
    interleaved = {name: [] for name in runners}
    steps = zip(*[rollback_session_steps(r) for r in runners.values()])
    for outs in steps:
        for name, out in zip(runners, outs):
            interleaved[name].append(out)
    for name in runners:
        for a, b in zip(alone[name], interleaved[name]):
            assert torch.equal(a, b)
    # Each view's cache holds only the layers it runs.
    slim_cache = runners["slim02"].cache
    assert slim_cache.get_seq_length(0) == 0 and slim_cache.get_seq_length(2) == 0
    assert slim_cache.get_seq_length(1) == IDS.shape[1] == runners["full"].cache.get_seq_length(0)


def rollback_session_steps(runner):
    """rollback_session, one call at a time (a generator)."""
    wrong = torch.cat([IDS[:, :25], torch.tensor([[200, 201, 202, 203]])], dim=1)
    for ids, m in ((IDS[:, :20], 1), (IDS[:, :21], 1), (wrong, 5), (IDS[:, :30], 6), (IDS, 8)):
        yield runner.logits(ids, m)


def test_no_parameter_is_copied():
    model = tiny(seed=0).model
    target_ptrs = {p.data_ptr() for p in model.parameters()}
    slim = SlimModel(model, RoutingMask([1, 2]))
    slim_params = list(slim.parameters())
    assert slim_params and all(p.data_ptr() in target_ptrs for p in slim_params)
    assert slim.lm_head.weight.data_ptr() == model.lm_head.weight.data_ptr()
    assert slim.embed_tokens is model.model.embed_tokens
    assert slim.layers["3"] is model.model.layers[3]
    assert "1" not in slim.layers and "2" not in slim.layers
    # The runner-facing attributes are the target's.
    assert slim.device == model.device and slim.config is model.config
    assert CausalLMRunner(slim).vocab_size == CausalLMRunner(model).vocab_size


def test_mask_that_does_not_fit():
    model = tiny(num_layers=4).model
    with pytest.raises(ValueError, match="does not fit the 4-layer target"):
        SlimModel(model, RoutingMask([12], num_layers=28))
    with pytest.raises(ValueError, match="out of range"):
        SlimModel(model, RoutingMask([4]))
    with pytest.raises(ValueError, match="skips all 4"):
        SlimModel(model, RoutingMask([0, 1, 2, 3]))


def test_unsupported_architecture():
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=100))
    with pytest.raises(ValueError, match="does not support GPT2LMHeadModel.*supported model types: gemma"):
        SlimModel(gpt2, RoutingMask.none())


def test_prefix_reuse_runs_shared_layers_once():
    """Layers [0, p) run once for both views; the full model may lag behind the slim one."""
    model = tiny(seed=4, num_layers=4).model
    slim = SlimModel(model, RoutingMask([2]))
    full = SlimModel(model, RoutingMask.none())
    p = slim.num_prefix_layers
    assert p == 2
    with torch.no_grad():
        want_u = slim(IDS).logits[0]
        want_q = model(IDS).logits[0]
        full_cache, slim_cache = DynamicCache(), DynamicCache()  # full_cache also holds the shared layers

        # Round 1: the prompt (30 tokens) through the prefix once, then both suffixes.
        prefix = full.run_layers(full.embed(IDS[:, :30], 0), full_cache, stop=p)
        u = slim.head(slim.run_layers(prefix, slim_cache), 1)[0]
        q = full.head(full.run_layers(prefix, full_cache), 1)[0]
        torch.testing.assert_close(u, want_u[29:30], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(q, want_q[29:30], rtol=1e-4, atol=1e-4)

        # Round 2: 6 tokens the slim tier commits alone: prefix + slim suffix; the full suffix lags.
        lag = full.run_layers(full.embed(IDS[:, 30:36], 30), full_cache, stop=p)
        u = slim.head(slim.run_layers(lag, slim_cache), 6)[0]
        torch.testing.assert_close(u, want_u[30:36], rtol=1e-4, atol=1e-4)
        assert full_cache.get_seq_length(0) == 36 and full_cache.get_seq_length(p) == 30

        # Round 3: escalation: 8 new tokens through the prefix, the full suffix catches up on 6 + 8.
        new = full.run_layers(full.embed(IDS[:, 36:44], 36), full_cache, stop=p)
        q = full.head(full.run_layers(lag.cat(new), full_cache), 8)[0]
        torch.testing.assert_close(q, want_q[36:44], rtol=1e-4, atol=1e-4)

        # Rollback: crop every cache to 40 (the shared prefix layers included) and go on.
        full_cache.crop(40)
        slim_cache.crop(36)
        with pytest.raises(ValueError, match="crop or catch up"):
            slim.run_layers(new.positions(40), slim_cache)
        u = slim.head(slim.run_layers(new.positions(36, 40), slim_cache), 4)[0]
        torch.testing.assert_close(u, want_u[36:40], rtol=1e-4, atol=1e-4)


def _tiny_from_config(config):
    torch.manual_seed(0)
    config._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(config).eval()


SMALL = dict(
    vocab_size=257,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    max_position_embeddings=128,
)


@pytest.mark.parametrize(
    "config",
    [
        MistralConfig(**SMALL, sliding_window=16),
        Qwen3Config(**SMALL),
        GemmaConfig(**SMALL),
        Gemma2Config(**SMALL, sliding_window=16, final_logit_softcapping=5.0),
        Gemma3TextConfig(**SMALL, sliding_window=16, final_logit_softcapping=5.0),
    ],
    ids=lambda c: c.model_type,
)
def test_other_families(config):
    model = _tiny_from_config(config)
    with torch.no_grad():
        torch.testing.assert_close(SlimModel(model, RoutingMask.none())(IDS).logits, model(IDS).logits)
    for a, b in zip(
        rollback_session(CausalLMRunner(model)), rollback_session(CausalLMRunner(SlimModel(model, RoutingMask.none())))
    ):
        torch.testing.assert_close(a, b)
    slim = SlimModel(model, RoutingMask([0, 2]))
    with torch.no_grad():
        whole = slim(IDS).logits[0]
    torch.testing.assert_close(rollback_session(CausalLMRunner(slim))[-1], whole[-8:], rtol=1e-4, atol=1e-4)


def test_sub_blocks_refused_where_layers_are_not_plain_pre_norm():
    model = _tiny_from_config(Gemma2Config(**SMALL))
    with pytest.raises(ValueError, match="sub-block masks .* not supported for gemma2"):
        SlimModel(model, RoutingMask(skip_mlp=[1]))


def test_hydra_factory_for_the_tiered_verifier():
    """`slim: {_target_: SlimModel, _partial_: true, mask: ${routing}}` builds slim views of any target."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(
        {
            "routing": {"_target_": "viasd_adapters.routing.RoutingMask", "_convert_": "all", "skip_layers": [1]},
            "slim": {"_target_": "viasd_adapters.routing.SlimModel", "_partial_": True, "mask": "${routing}"},
        }
    )
    factory = instantiate(cfg.slim)
    model = tiny(seed=0).model
    slim = factory(model)
    assert isinstance(slim, SlimModel) and slim.mask.skip_layers == (1,) and slim.mask.num_layers == 4
