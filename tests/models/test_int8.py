"""The int8 precision (W8A8, `models.quantize.Int8Linear`): batch-invariant rows, hence lossless
speculative decoding relative to the int8 target itself; its kernel; its refusals."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.conftest import exact_marginals, perturbed, tiny
from tests.decode.test_loops import PROMPT
from viasd_adapters.decode import AutoregressiveDecoder, SpeculativeDecoder
from viasd_adapters.draft import ModelDrafter, PromptLookupDrafter
from viasd_adapters.models import ModelSpec, TinyModelConfig, load_model
from viasd_adapters.models.precision import Precision, check_precision
from viasd_adapters.models.quantize import Int8Linear, Int8Projection, quantize_linears, quantized_copy
from viasd_adapters.models.vocab import DraftVocabulary, ReducedHead
from viasd_adapters.sampling import SamplingConfig
from viasd_adapters.verify import LosslessVerifier


def reference_w8a8(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """W8A8 per row written out in plain arithmetic: int8 weights per output channel, each row
    scaled to [-1, 1] and quantised to 7 bits with the zero point of that range. fbgemm's kernel
    rounds a few values the other way (its own quantize loop), so it matches to ~0.5 %, against
    the ~2 % W8A8 costs against fp32."""
    w, x = w.double(), x.double()
    w_scale = w.abs().amax(1).clamp_min(1e-12) / 127
    wq = torch.round(w / w_scale[:, None]).clamp(-128, 127)
    peak = x.abs().amax(-1, keepdim=True)
    scale, zero = 2.0 / 127, 64  # 7-bit range [0, 127] covering [-1, 1]
    xq = torch.clamp(torch.round((x / peak) / scale) + zero, 0, 127) - zero
    return (xq @ wq.T) * scale * w_scale * peak


def row_error(y: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (y.double() - ref).norm(dim=1) / ref.norm(dim=1)


def test_int8_linear_computes_w8a8_per_row():
    """Fails when fbgemm's dynamic GEMM (or the deprecated packing it relies on) breaks or changes."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 40)
    x = torch.randn(5, 96)
    x[2] *= 300  # an outlier token: per-tensor scaling would flatten the other rows
    y = Int8Linear(linear)(x)
    ref = reference_w8a8(linear.weight, x) + linear.bias.double()
    assert row_error(y, ref).max() < 0.01
    assert row_error(y, linear(x).double()).max() < 0.05  # every row near the fp32 product, the small ones too


def test_outlier_channels_are_quantised_in_a_group_of_their_own():
    torch.manual_seed(2)
    linear = torch.nn.Linear(128, 32, bias=False)
    x = torch.randn(4, 128)
    x[:, [5, 77]] *= 400  # two channels dominate every row, as down_proj's inputs do
    exact = linear(x).double()
    split = Int8Linear(linear, outliers=torch.tensor([77, 5]))
    assert row_error(split(x), exact).max() < row_error(Int8Linear(linear)(x), exact).max() / 3
    assert torch.allclose(split.weight, linear.weight, atol=linear.weight.abs().max().item() / 127)


def test_a_row_computes_the_same_alone_or_in_a_batch():
    torch.manual_seed(1)
    layer = Int8Linear(torch.nn.Linear(64, 48), outliers=torch.tensor([3, 9]))
    x = torch.randn(9, 64) * torch.logspace(-2, 2, 9)[:, None]
    alone = torch.cat([layer(row[None]) for row in x])
    assert torch.equal(layer(x), alone)


def layer_by_layer_int8(model: torch.nn.Module) -> torch.nn.Module:
    """Every linear layer of a copy of `model` an `Int8Linear` of its own: no shared GEMMs."""
    model = copy.deepcopy(model)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(module, name, Int8Linear(child))
    return model


@torch.no_grad()
def test_sibling_projections_share_one_gemm_and_compute_what_they_compute_alone():
    """q / k / v and gate / up in one GEMM each: bitwise what every layer computes by itself,
    also when siblings get different inputs (no stale result is handed out)."""
    model = tiny(seed=4).model
    fused = quantize_linears(copy.deepcopy(model), "int8")
    reference = layer_by_layer_int8(model)
    attention = fused.model.layers[0].self_attn
    assert isinstance(attention.q_proj, Int8Projection) and isinstance(
        fused.model.layers[0].mlp.up_proj, Int8Projection
    )
    assert torch.equal(fused(PROMPT).logits, reference(PROMPT).logits)

    x, other = torch.randn(2, 3, model.config.hidden_size)
    ref_attention = reference.model.layers[0].self_attn
    assert torch.equal(attention.q_proj(x), ref_attention.q_proj(x))
    assert torch.equal(attention.k_proj(other), ref_attention.k_proj(other))  # not q's input: computed afresh
    assert torch.equal(attention.v_proj(x), ref_attention.v_proj(x))
    assert torch.equal(attention.k_proj(x), ref_attention.k_proj(x))
    assert torch.equal(attention.k_proj.weight, ref_attention.k_proj.weight)
    with torch.inference_mode():  # eagle-llm decodes in inference mode: its tensors keep no version counter
        assert torch.equal(fused(PROMPT).logits, reference(PROMPT).logits)


@torch.no_grad()
def test_a_reduced_head_of_an_int8_model_stays_int8_and_scores_as_the_full_head():
    model = quantize_linears(tiny(seed=5).model, "int8")
    V = model.config.vocab_size
    ids = torch.randperm(V, generator=torch.Generator().manual_seed(0))[: V // 4]
    head = ReducedHead(model, DraftVocabulary(token_ids=ids.tolist(), vocab_size=V))
    assert isinstance(head.int8, Int8Linear) and head.int8.out_features == len(ids)
    hidden = torch.randn(3, model.config.hidden_size)
    assert torch.equal(head(hidden), model.get_output_embeddings()(hidden)[:, ids])


@pytest.fixture(scope="module")
def int8_pair():
    target = load_model(ModelSpec("tiny-random", weights="int8", tiny=TinyModelConfig()))
    draft = quantize_linears(perturbed(tiny().model, 0.05), "int8")
    return target, draft


def test_tiny_int8_model_is_quantised_everywhere(int8_pair):
    target, _ = int8_pair
    kinds = {type(m) for m in target.model.modules()}
    assert Int8Linear in kinds and torch.nn.Linear not in kinds  # LM head included
    down = [m for n, m in target.model.named_modules() if n.endswith("down_proj")]
    assert down and all(m.channels is not None and len(m.channels[1]) >= 1 for m in down)  # calibrated


def test_an_int8_layer_prices_its_attention_as_the_float_layer_does(int8_pair):
    """The frontier prices skipped sub-blocks by this share; int8 layers hold no parameters to count."""
    from viasd_adapters.costs import attention_share

    target, _ = int8_pair
    assert attention_share(target.model) == attention_share(tiny().model) > 0


@torch.no_grad()
def test_a_verify_block_computes_what_one_token_steps_compute(int8_pair):
    """Bitwise: the int8 linears and the row-invariant attention (models/row_attention.py)."""
    import copy

    model = int8_pair[0].model
    assert model.config._attn_implementation == "sdpa-rows"
    cache = model(PROMPT[:, :-5], use_cache=True).past_key_values
    steps_cache = copy.deepcopy(cache)
    block = model(PROMPT[:, -5:], past_key_values=cache, use_cache=True).logits[0]  # [5, V]
    steps = torch.cat(
        [
            model(PROMPT[:, i : i + 1], past_key_values=steps_cache, use_cache=True).logits[0]
            for i in range(PROMPT.shape[1] - 5, PROMPT.shape[1])
        ]
    )
    assert torch.equal(block, steps)


@pytest.mark.parametrize("host", ["sd", "lookup", "pearl"])
def test_greedy_speculation_on_the_int8_target_reproduces_int8_ar(int8_pair, host):
    from viasd_adapters.hosts.pearl import PearlDecoder

    target, draft = int8_pair
    ar = AutoregressiveDecoder(target.model).generate(PROMPT, 40)
    verifier = LosslessVerifier(target.model)
    if host == "pearl":  # its drafter runs beside the verifier (a thread here), the target still decides
        decoder = PearlDecoder(ModelDrafter(draft), verifier, window_size=3, backend="thread")
    else:
        propose = ModelDrafter(draft) if host == "sd" else PromptLookupDrafter(max_ngram=2)
        decoder = SpeculativeDecoder(propose, verifier, num_draft_tokens=4)
    out = decoder.generate(PROMPT, 40)
    assert out.tokens == ar.tokens
    if host != "lookup":  # drafts were judged both ways, so the check had something to check
        assert 0 < out.stats.accepted < out.stats.drafted


def test_int8_sampling_follows_the_int8_target(int8_pair):
    """SD with a perturbed int8 draft samples the int8 target's own distribution (first 2 tokens)."""
    target, draft = int8_pair
    prompt = PROMPT[:, :4]
    exact = exact_marginals(target.model, prompt, 2)  # [2, V]
    decoder = SpeculativeDecoder(ModelDrafter(draft), LosslessVerifier(target.model), num_draft_tokens=3)
    n = 600
    counts = torch.zeros_like(exact)
    for seed in range(n):
        tokens = decoder.generate(prompt, 2, SamplingConfig(temperature=1.0, seed=seed)).tokens
        counts[torch.arange(2), torch.tensor(tokens)] += 1
    from scipy.stats import chisquare

    for step in range(2):
        keep = exact[step] * n >= 5  # chi-square needs expected counts of at least 5: pool the rest
        observed = torch.cat([counts[step][keep], counts[step][~keep].sum()[None]])
        expected = torch.cat([exact[step][keep], exact[step][~keep].sum()[None]]) * n
        assert (
            chisquare(observed.numpy(), expected.numpy() * observed.sum().item() / expected.sum().item()).pvalue > 1e-3
        )


@pytest.mark.parametrize(
    "weights, activations, device, message",
    [
        ("int4", None, "cpu", "weights=int4 is not one of"),
        ("int8", None, "cuda", "weights=int8: .* CPUs only"),
        ("int8", "bfloat16", "meta", "weights=int8: .* CPUs only"),
        ("bfloat16", "float32", "cpu", "weights=bfloat16 with activations=float32: a float model"),
        ("float32", "int8", "cpu", "weights=float32 with activations=int8"),
        ("int8", "int4", "cpu", "activations=int4 is not one of"),
    ],
)
def test_bad_precisions_are_refused_before_loading(weights, activations, device, message):
    with pytest.raises(ValueError, match=message):
        ModelSpec("qwen2.5-coder-1.5b-instruct", weights=weights, activations=activations, device=device)
    setting = message.split(" ")[0]  # the message names the prefixed setting first
    with pytest.raises(ValueError, match=f"^runtime\\.draft_{setting}"):
        check_precision(weights, activations, device, prefix="runtime.draft_")


@pytest.mark.parametrize(
    "weights, activations, label, quantization, dtype",
    [
        ("bfloat16", None, "bfloat16", None, torch.bfloat16),
        ("float32", "float32", "float32", None, torch.float32),
        ("int8", None, "int8", "int8", torch.float32),  # W8A8, the rest in fp32
        ("int8", "int8", "int8", "int8", torch.float32),
        ("int8", "bfloat16", "bfloat16+int8-weight", "int8-weight", torch.bfloat16),
    ],
)
def test_a_precision_is_weights_and_activations_and_the_profile_names_it(
    weights, activations, label, quantization, dtype
):
    precision = Precision(weights, activations)
    assert (precision.label, precision.quantization, precision.torch_dtype) == (label, quantization, dtype)
    assert Precision.from_label(label).label == label
    assert Precision.from_label(label).quantization == quantization


def test_int8_weights_under_float_activations_load_weight_only_int8_linears():
    """weights=int8 with bfloat16 activations: the model in bf16 with weight-only int8 linears,
    which compute as the drafter's int8-weight copy of the bf16 model does."""
    spec = ModelSpec("tiny-random", weights="int8", activations="bfloat16", tiny=TinyModelConfig())
    loaded = load_model(spec)
    kinds = {type(m).__name__ for m in loaded.model.modules()}
    assert "Int8WeightLinear" in kinds and "Int8Linear" not in kinds
    assert loaded.model.model.embed_tokens.weight.dtype == torch.bfloat16
    bf16 = load_model(ModelSpec("tiny-random", weights="bfloat16", tiny=TinyModelConfig())).model
    copy = quantized_copy(bf16, "int8-weight")
    ids = torch.tensor([[5, 9, 13, 2]])
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, copy(ids).logits)


def test_an_int8_draft_refuses_a_second_quantisation(int8_pair):
    with pytest.raises(ValueError, match="no dense linear layer left to quantise"):
        ModelDrafter(int8_pair[1], quantize="int8-weight")
