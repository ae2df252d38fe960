"""The compiled decode step (`models.compiled`): the same model as the eager forward, rows that do
not depend on the block they came in, lossless hosts on top of it, and the eager fallback."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.conftest import perturbed, tiny
from tests.decode.test_loops import PROMPT
from viasd_adapters.decode import AutoregressiveDecoder, SpeculativeDecoder
from viasd_adapters.draft import ModelDrafter, PromptLookupDrafter
from viasd_adapters.models import ModelSpec, TinyModelConfig, load_model
from viasd_adapters.models.compiled import DecodeStep, attach_step, decode_step
from viasd_adapters.models.quantize import quantize_linears
from viasd_adapters.routing import RoutingMask, SlimModel
from viasd_adapters.routing.slim import compile_view
from viasd_adapters.runner import CausalLMRunner
from viasd_adapters.verify import ConfidencePolicy, LosslessVerifier, TieredVerifier


@pytest.fixture(scope="module", params=["qwen2", pytest.param("llama", marks=pytest.mark.slow)])
def int8_model(request):
    """A tiny int8 model of each supported family; compiled explicitly (auto leaves tiny models eager)."""
    spec = ModelSpec("tiny-random", weights="int8", tiny=TinyModelConfig(architecture=request.param), compile=True)
    return load_model(spec)


def hidden_by_blocks(step: DecodeStep, ids: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    cache, out, start = step.new_cache(), [], 0
    for size in sizes:
        out.append(step(ids[start : start + size], cache))
        start += size
    return torch.cat(out)


def step_at_the_targets_width(num_layers: int) -> DecodeStep:
    """The compiled step of a random int8 model at Qwen2.5-Coder-1.5B's widths (hidden 1536, 12
    heads of 128, 2 key-value heads), where sum orders show in the int8 rows."""
    config = TinyModelConfig(
        architecture="qwen2",
        num_layers=num_layers,
        hidden_size=1536,
        num_heads=12,
        num_kv_heads=2,
        intermediate_size=1536,
    )
    return decode_step(load_model(ModelSpec("tiny-random", weights="int8", tiny=config, compile=True)).model)


def test_compiled_step_is_attached_and_runners_use_it(int8_model):
    step = decode_step(int8_model.model)
    assert step is not None and step.compiled
    assert CausalLMRunner(int8_model.model).step is step


@torch.no_grad()
def test_a_block_computes_bitwise_what_one_row_steps_compute(int8_model):
    """What makes greedy speculation on the compiled int8 target reproduce its AR exactly."""
    step = decode_step(int8_model.model)
    ids = PROMPT[0]
    steps = hidden_by_blocks(step, ids, [4] + [1] * (len(ids) - 4))
    for sizes in ([len(ids)], [4, 5, 3], [7, 2, 1, 2]):
        assert torch.equal(hidden_by_blocks(step, ids, sizes), steps), sizes


@torch.no_grad()
def test_a_block_is_bitwise_its_steps_at_the_real_targets_width():
    """At Qwen2.5-Coder-1.5B's widths (hidden 1536, 12 heads of 128) one-row steps leave a thread
    idle, which Inductor would fill by splitting a row's reductions across threads: another sum
    order than a block's, and int8's per-row scales turn that into logits a unit apart."""
    step = step_at_the_targets_width(num_layers=1)
    ids = torch.randint(1, 257, (40,), generator=torch.Generator().manual_seed(0))
    steps = hidden_by_blocks(step, ids, [16] + [1] * 24)
    for sizes in ([16, 2, 5, 8, 9], [16, 12, 12]):
        assert torch.equal(hidden_by_blocks(step, ids, sizes), steps[: sum(sizes)]), sizes


@torch.no_grad()
def test_a_block_longer_than_its_rows_attended_lengths_is_bitwise_its_steps():
    """A block attends over its last row's aligned length, longer than its first rows' steps do
    once it straddles a multiple of ATTENTION_ALIGN. Past about 200 keys MKL split the value sum
    otherwise over the longer (zero-padded) length: greedy SD parted from AR after 260 tokens."""
    step = step_at_the_targets_width(num_layers=1)
    ids = torch.randint(1, 257, (400,), generator=torch.Generator().manual_seed(2))
    steps = hidden_by_blocks(step, ids, [200] + [1] * 200)
    for sizes in ([250, 12, 30, 38, 60, 10], [200, 60, 60, 60, 20]):  # blocks over 256, 320, 384
        assert torch.equal(hidden_by_blocks(step, ids, sizes), steps[: sum(sizes)]), sizes


@torch.no_grad()
@pytest.mark.parametrize("prefix_length", [70, 254])  # 254: the tree's rows straddle 256 keys
def test_a_draft_tree_s_rows_are_bitwise_the_steps_along_their_paths(prefix_length):
    """EAGLE's verify: tree rows at scattered buffer slots, each attending its own path, compute
    what one-token steps along that path compute (at the 1.5B's widths, where sum orders show)."""
    step = step_at_the_targets_width(num_layers=2)
    prefix = torch.randint(1, 257, (prefix_length,), generator=torch.Generator().manual_seed(1))
    tokens = torch.tensor([11, 12, 13, 14, 15, 16])
    parents = [-1, -1, 0, 1, 3, 2]  # two branches: 0 -> 2 -> 5 and 1 -> 3 -> 4
    paths = []
    for j in range(len(tokens)):
        path, node = [], j
        while node != -1:
            path.insert(0, node)
            node = parents[node]
        paths.append(path)
    start, n = len(prefix), len(tokens)
    mask = torch.zeros(n, start + n, dtype=torch.bool)
    mask[:, :start] = True
    for j, path in enumerate(paths):
        mask[j, [start + i for i in path]] = True
    cache = step.new_cache()
    step(prefix, cache)
    depth = torch.tensor([len(path) - 1 for path in paths])
    tree = step(tokens, cache, mask=mask, positions=start + depth)
    for j, path in enumerate(paths):
        alone = step.new_cache()
        step(prefix, alone)
        rows = [step(tokens[i : i + 1], alone) for i in path]
        assert torch.equal(tree[j], rows[-1][0]), path


@torch.no_grad()
def test_a_rolled_back_cache_recomputes_what_it_dropped(int8_model):
    step = decode_step(int8_model.model)
    ids = PROMPT[0]
    cache = step.new_cache()
    first = step(ids, cache)
    cache.crop(5)
    assert torch.equal(step(ids[5:], cache), first[5:])


@torch.no_grad()
def test_compiled_logits_match_the_eager_forward(int8_model):
    """Not bitwise (Inductor fuses the norms and attention in its own order, and an activation on a
    rounding boundary can land on the other int8 level), but close, and the same greedy tokens."""
    model = int8_model.model
    eager = model(PROMPT).logits[0]  # the transformers forward: `decode_step` is not consulted
    compiled = model.get_output_embeddings()(decode_step(model)(PROMPT[0], decode_step(model).new_cache()))
    scale = eager.abs().max()
    assert (compiled - eager).abs().max() < 0.05 * scale
    assert (compiled.argmax(-1) == eager.argmax(-1)).float().mean() > 0.9


def test_a_mask_that_drops_the_causal_rule_changes_the_rows():
    """The equality tests above can fail: rows that attend one position too far compute otherwise."""
    model = tiny(seed=3, dtype="float32").model
    step = DecodeStep(model, compile=False)
    ids = PROMPT[0]
    causal = step(ids, step.new_cache())
    T = len(ids)
    wrong = torch.ones(T, T, dtype=torch.bool)  # every row sees the future
    assert not torch.allclose(step(ids, step.new_cache(), mask=wrong), causal)


@pytest.mark.parametrize("host", ["sd", "lookup"])
def test_greedy_speculation_on_the_compiled_int8_target_reproduces_its_ar(int8_model, host):
    target = int8_model.model
    draft = quantize_linears(perturbed(tiny(architecture=target.config.model_type).model, 0.05), "int8")
    attach_step(draft)
    ar = AutoregressiveDecoder(target).generate(PROMPT, 40)
    propose = ModelDrafter(draft) if host == "sd" else PromptLookupDrafter(max_ngram=2)
    out = SpeculativeDecoder(propose, LosslessVerifier(target), num_draft_tokens=4).generate(PROMPT, 40)
    assert out.tokens == ar.tokens
    if host == "sd":  # drafts were judged both ways, so the check had something to check
        assert 0 < out.stats.accepted < out.stats.drafted


def test_an_unsupported_model_stays_eager_and_says_so(caplog):
    model = tiny(seed=1).model
    model.config.hidden_act = "relu"  # no compiled activation for it
    with caplog.at_level(logging.WARNING):
        assert attach_step(model) is None
    assert "stays eager" in caplog.text
    assert CausalLMRunner(model).step is None


def test_auto_compiles_large_int8_models_on_cpu_only():
    assert ModelSpec("x", weights="int8").compiles(500_000_000)
    assert not ModelSpec("x", weights="int8").compiles(1_000_000)  # tiny: compiling does not pay back
    assert not ModelSpec("x", weights="bfloat16").compiles(500_000_000)
    assert not ModelSpec("x", weights="int8", compile=False).compiles(500_000_000)
    assert ModelSpec("x", weights="float32", compile=True).compiles(1_000)
    with pytest.raises(ValueError, match="compile"):
        ModelSpec("x", compile="sometimes")


@pytest.mark.parametrize(
    "mask", [RoutingMask([2]), RoutingMask([3], skip_attention=[1], skip_mlp=[2])], ids=["layer", "sub-blocks"]
)
@torch.no_grad()
def test_a_slim_view_runs_its_own_plan_on_the_targets_compiled_layer(int8_model, mask):
    """The view's step skips what the mask skips (close to the eager view's logits), and its blocks
    still compute what its one-row steps compute."""
    model = int8_model.model
    view = SlimModel(model, mask)
    assert compile_view(view, model)
    step = decode_step(view)
    assert step.layers == [i for i in range(4) if i not in mask.skip_layers + mask.skip_attention]
    eager = view(PROMPT).logits[0]
    compiled = model.get_output_embeddings()(step(PROMPT[0], step.new_cache()))
    assert (compiled - eager).abs().max() < 0.05 * eager.abs().max()
    ids = PROMPT[0]
    assert torch.equal(hidden_by_blocks(step, ids, [len(ids)]), hidden_by_blocks(step, ids, [3] + [1] * (len(ids) - 3)))


def test_the_cost_measurements_time_the_slim_view_the_verifier_runs(int8_model, monkeypatch):
    """The slim / full ratio and the profile's slim points time the view on the target's compiled
    step, as the tiered verifier runs it: timed eagerly beside the compiled target, the int8 1.5B's
    view without 4 of its 28 layers cost 1.05x the whole target."""
    from viasd_adapters.costs import measure, timing

    model, timed, real = int8_model.model, [], timing.time_forwards

    def spy(models, *args, **kwargs):
        timed.append(models)
        return real(models, *args, **kwargs)

    monkeypatch.setattr(timing, "time_forwards", spy)
    timing.measure_cost_ratio(model, RoutingMask([2]), PROMPT, 2, repetitions=1, warmup=0)
    assert decode_step(timed[0]["slim"]) is not None
    assert [decode_step(view) is not None for view in measure._slim_views(model, [RoutingMask([2])]).values()] == [True]


def test_tiers_on_the_compiled_target_escalating_everything_equal_its_ar(int8_model):
    """The tiered verifier's slim runner takes the compiled view; with every token escalated the
    output is the compiled target's AR, and the slim forwards really ran."""
    target = int8_model.model
    draft = quantize_linears(perturbed(tiny(architecture=target.config.model_type).model, 0.05), "int8")
    verifier = TieredVerifier(target, SlimModel(target, RoutingMask([2])), ConfidencePolicy(1.0, 1.0))
    assert verifier.slim.step is not None and verifier.target.step is decode_step(target)
    ar = AutoregressiveDecoder(target).generate(PROMPT, 30)
    out = SpeculativeDecoder(ModelDrafter(draft), verifier, num_draft_tokens=4).generate(PROMPT, 30)
    assert out.tokens == ar.tokens
    assert out.stats.model_calls["slim"].calls > 0
