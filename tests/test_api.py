"""The Python API (`viasd_adapters.build`) and the transformers integration (`custom_generate`), on
tiny random models; the reference is always transformers' own `generate`."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from transformers import AutoModelForCausalLM, GenerationConfig

import viasd_adapters as vsd
from tests.conftest import perturbed, tiny
from viasd_adapters.api import sampling_from_config
from viasd_adapters.integrations.transformers import CUSTOM_GENERATE_DIR, ViasdGenerateOutput
from viasd_adapters.models.tiny import byte_tokenizer

PROMPT = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
MASK = vsd.RoutingMask(skip_layers=[2], num_layers=4)  # the tiny target's layer 2
ALL_ESCALATE = (1.0, 1.0)  # the slim verifier runs, and every token still goes to the full target


@pytest.fixture(autouse=True, scope="module")
def _single_threaded():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: a second thread only adds overhead (and stalls on a busy host)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def pair():
    target = tiny(seed=0)
    return target, perturbed(target.model, scale=0.02)


@pytest.fixture(scope="module")
def reference(pair):
    """transformers' greedy output, 40 new tokens (the tiny model never emits its eos early)."""
    target, _ = pair
    out = target.model.generate(PROMPT, max_new_tokens=40, do_sample=False, pad_token_id=0)
    assert out.shape[1] == PROMPT.shape[1] + 40
    return out


def _forwards(model: torch.nn.Module) -> Counter:
    """Counts the model's forward calls (a pre-hook); remove with .handle.remove()."""
    counter = Counter()
    counter.handle = model.register_forward_pre_hook(lambda *_: counter.update(["calls"]))
    return counter


# ----------------------------------------------------------------------------- greedy = generate
@pytest.mark.parametrize(
    "kwargs, method",
    [
        ({}, "SD"),
        ({"routing": MASK, "policy": None}, "SD"),  # tiers off
        ({"routing": MASK, "policy": ALL_ESCALATE}, "VIA-SD on SD"),
        ({"routing": "tiny-random-1l", "policy": ALL_ESCALATE, "share_prefix": True}, "VIA-SD on SD"),
    ],
    ids=["sd", "tiers-off", "all-escalate", "all-escalate-shared-prefix"],
)
def test_greedy_output_equals_transformers_generate(pair, reference, kwargs, method):
    target, draft = pair
    generator = vsd.build(target.model, draft, tokenizer=target.tokenizer, **kwargs)
    assert generator.method == method
    out = generator.generate(PROMPT, max_new_tokens=40, return_dict_in_generate=True)
    assert torch.equal(out.sequences, reference)
    assert out.stats.acceptance_rate > 0.2  # drafts were accepted: the check has teeth
    assert ("slim" in out.stats.model_calls) == (method == "VIA-SD on SD")
    # and through transformers' own entry point
    hooked = target.model.generate(PROMPT, custom_generate=generator, max_new_tokens=40, pad_token_id=0)
    assert torch.equal(hooked, reference)


def test_custom_generate_function_and_local_repository_equal_generate(pair, reference):
    target, draft = pair
    for hook in (vsd.custom_generate, str(CUSTOM_GENERATE_DIR)):
        out = target.model.generate(
            PROMPT,
            attention_mask=torch.ones_like(PROMPT),
            custom_generate=hook,
            draft=draft,
            routing=MASK,
            policy=None,
            max_new_tokens=40,
            pad_token_id=0,
        )
        assert torch.equal(out, reference)
    lookup = target.model.generate(
        PROMPT, custom_generate=vsd.custom_generate, draft="lookup", max_new_tokens=40, pad_token_id=0
    )
    assert torch.equal(lookup, reference)


def test_prompt_lookup_and_pearl_equal_generate(pair, reference):
    target, draft = pair
    lookup = vsd.build(target.model, "lookup")
    assert lookup.method == "prompt-lookup SD"
    assert torch.equal(lookup.generate(PROMPT, max_new_tokens=40), reference)
    pearl = vsd.build(
        target.model, draft, framework="pearl", backend="thread", window_size=3, routing=MASK, policy=ALL_ESCALATE
    )
    try:
        assert pearl.method == "VIA-SD on PEARL"
        assert torch.equal(pearl.generate(PROMPT, max_new_tokens=40), reference)
    finally:
        pearl.close()


def _eagle_target(folder):
    """The tiny target loaded from its folder (EaModel reads its tokenizer there) and a random head beside it."""
    pytest.importorskip("eagle.model.utils")
    from viasd_adapters.third_party.eagle import build_head, head_config, save_head

    loaded = tiny(seed=0)
    loaded.model.save_pretrained(folder / "target")
    loaded.tokenizer.save_pretrained(folder / "target")
    target = AutoModelForCausalLM.from_pretrained(folder / "target", attn_implementation="sdpa").eval()
    config = head_config(target.config, intermediate_size=96)
    torch.manual_seed(0)
    save_head(build_head(config), config, folder / "head", full=False, compact=True)
    return target, folder / "head"


def test_eagle_head_equals_generate(tmp_path):
    target, head = _eagle_target(tmp_path)
    expected = target.generate(PROMPT, max_new_tokens=30, do_sample=False, pad_token_id=0)
    stock = vsd.build(target, vsd.EagleHead(head))
    tiered = vsd.build(target, str(head), routing=vsd.RoutingMask.none(), policy=(0.0, 0.0))
    assert (stock.method, tiered.method) == ("EAGLE", "VIA-SD on EAGLE")
    assert torch.equal(stock.generate(PROMPT, max_new_tokens=30), expected)
    # u = q itself: tiers 1-2 keep only q's argmax, so greedy output is still the target's
    out = tiered.generate(PROMPT, max_new_tokens=30, return_dict_in_generate=True)
    assert torch.equal(out.sequences, expected) and out.stats.tier_counts.keys() - {"full"}


def test_eagle_gets_the_tier_options(tmp_path):
    """`build` once dropped `rejudge` on the way to EAGLE's tree path."""
    target, head = _eagle_target(tmp_path)
    generator = vsd.build(target, vsd.EagleHead(head), routing=MASK, policy=(0.5, 0.5), rejudge=False, max_unverified=5)
    verifier = generator.decoder.verifier  # the TieredVerifier EAGLE's tree goes to
    assert (verifier.rejudge, verifier.max_unverified, verifier.policy.tau_slim) == (False, 5, 0.5)
    assert tuple(verifier.slim.model.mask.skip_layers) == tuple(MASK.skip_layers) == (2,)
    assert vsd.build(target, vsd.EagleHead(head), routing=MASK).decoder.verifier.rejudge is True


def test_a_verifier_eagle_cannot_run_is_refused_before_its_head_loads(pair, tmp_path):
    target, _ = pair
    with pytest.raises(
        ValueError, match=r"^EAGLE does not honour the verifier's share_prefix: pass share_prefix=False$"
    ):
        vsd.build(target.model, vsd.EagleHead(tmp_path / "no-head-here"), routing=MASK, share_prefix=True)


def test_via_sd_tiers_settle_tokens_without_the_target(pair):
    target, draft = pair
    generator = vsd.build(target.model, draft, routing=vsd.RoutingMask.none(), policy=(0.0, 0.0))
    out = generator.generate(PROMPT, max_new_tokens=30, return_dict_in_generate=True)
    assert out.stats.tier_counts["accept"] + out.stats.tier_counts["slim"] > 0
    assert out.stats.model_calls["target"].calls < out.stats.model_calls["slim"].calls


# ----------------------------------------------------------------------------- stopping and output
def test_stops_at_every_eos_of_the_generation_config(reference):
    target = tiny(seed=0)
    new = reference[0, PROMPT.shape[1] :].tolist()
    stop = new[6]
    first = new.index(stop)
    target.model.generation_config.eos_token_id = [256, stop]  # a list: all of them stop
    generator = vsd.build(target.model, perturbed(target.model, 0.02))
    assert generator.stop_token_ids == (256, stop)
    out = generator.generate(PROMPT, max_new_tokens=40)
    assert out[0, PROMPT.shape[1] :].tolist() == new[: first + 1]
    expected = target.model.generate(PROMPT, max_new_tokens=40, pad_token_id=0)
    assert torch.equal(
        target.model.generate(PROMPT, custom_generate=generator, max_new_tokens=40, pad_token_id=0), expected
    )
    assert torch.equal(out, expected)
    # eos_token_id overrides per call, as in generate
    assert generator.generate(PROMPT, max_new_tokens=40, eos_token_id=[]).shape[1] == PROMPT.shape[1] + 40


def test_return_dict_streamer_and_text(pair, reference):
    target, draft = pair
    generator = vsd.build(target, draft)  # a zoo LoadedModel brings its tokenizer
    out = target.model.generate(
        PROMPT, custom_generate=generator, max_new_tokens=40, pad_token_id=0, return_dict_in_generate=True
    )
    assert isinstance(out, ViasdGenerateOutput) and torch.equal(out.sequences, reference)
    assert out.stats.new_tokens == 40 and out.method == "SD"

    class Collect:
        def __init__(self):
            self.chunks = []

        def put(self, value):
            self.chunks.append(value.flatten().tolist())

        def end(self):
            self.chunks.append("end")

    streamer = Collect()
    generator.generate(PROMPT, max_new_tokens=40, streamer=streamer)
    assert streamer.chunks[0] == PROMPT[0].tolist() and streamer.chunks[-1] == "end"
    assert sum(streamer.chunks[1:-1], []) == reference[0, PROMPT.shape[1] :].tolist()
    assert len(streamer.chunks) < 40  # several tokens per commit

    text = generator.generate_text("héllo", max_new_tokens=12)
    ids = target.tokenizer("héllo", return_tensors="pt").input_ids
    expected = target.model.generate(ids, max_new_tokens=12, pad_token_id=0)[0, ids.shape[1] :]
    assert text == target.tokenizer.decode(expected, skip_special_tokens=True)


# ----------------------------------------------------------------------------- sampling
def test_seeded_sampling_is_reproducible_both_ways(pair):
    target, draft = pair
    generator = vsd.build(target.model, draft, routing=MASK, policy=(0.5, 0.5))

    def sample(**kw):
        return generator.generate(PROMPT, max_new_tokens=30, do_sample=True, temperature=1.0, **kw)[0].tolist()

    assert sample(seed=3) == sample(seed=3)
    assert sample(seed=3) != sample(seed=4)
    torch.manual_seed(11)
    a = target.model.generate(PROMPT, custom_generate=generator, do_sample=True, max_new_tokens=30, pad_token_id=0)
    torch.manual_seed(11)
    b = target.model.generate(PROMPT, custom_generate=generator, do_sample=True, max_new_tokens=30, pad_token_id=0)
    assert torch.equal(a, b)
    g = torch.Generator().manual_seed(5)
    c = sample(generator=g)
    assert c == sample(generator=torch.Generator().manual_seed(5))


def test_generation_config_maps_to_sampling():
    config = GenerationConfig(do_sample=True, temperature=0.7, top_p=0.9, top_k=5)
    assert sampling_from_config(config, seed=1) == vsd.SamplingConfig(temperature=0.7, top_p=0.9, top_k=5, seed=1)
    assert sampling_from_config(GenerationConfig(temperature=0.7)).greedy  # do_sample=False is greedy


def test_sampled_first_token_follows_the_tempered_top_k_target(pair):
    """Through `generate(custom_generate=...)`, temperature and top_k reach the sampler: the first
    token's frequencies match softmax(q / 0.8) restricted to its top 4 (chi-square, 4 bins)."""
    target, draft = pair
    generator = vsd.build(target.model, draft)
    logits = target.model(PROMPT).logits[0, -1].detach() / 0.8
    top = torch.topk(logits, 4)
    expected = torch.softmax(top.values, -1)
    n = 200
    counts = Counter()
    for seed in range(n):  # 2 new tokens: the first is the verdict on one draft token
        out = target.model.generate(
            PROMPT,
            custom_generate=generator,
            do_sample=True,
            temperature=0.8,
            top_k=4,
            top_p=1.0,
            max_new_tokens=2,
            seed=seed,
            pad_token_id=0,
        )
        counts[int(out[0, PROMPT.shape[1]])] += 1
    assert set(counts) <= set(top.indices.tolist())
    chi2 = sum((counts[int(t)] - n * float(p)) ** 2 / (n * float(p)) for t, p in zip(top.indices, expected))
    assert chi2 < 16.27, (counts, expected)  # p = 0.001 for 3 degrees of freedom
    assert not math.isnan(chi2)


# ----------------------------------------------------------------------------- bad input, before any work
def test_bad_inputs_fail_fast_with_the_fix(pair):
    target, draft = pair
    calls = _forwards(target.model)
    other_vocab = tiny(seed=1, vocab_size=300).model
    with pytest.raises(ValueError, match=r"vocabulary \(300\) differs from the target's \(257\)"):
        vsd.build(target.model, other_vocab)
    other_tokenizer = byte_tokenizer()
    other_tokenizer.add_tokens(["<extra>"])
    with pytest.raises(ValueError, match="the draft and the target use different tokenizers"):
        vsd.build(target.model, draft, tokenizer=target.tokenizer, draft_tokenizer=other_tokenizer)
    with pytest.raises(ValueError, match="30-layer model.*does not fit the 4-layer target"):
        vsd.build(target.model, draft, routing=vsd.RoutingMask(skip_layers=[3], num_layers=30))
    with pytest.raises(ValueError, match="out of range for a 4-layer model"):
        vsd.build(target.model, draft, routing=vsd.RoutingMask(skip_layers=[7]))
    with pytest.raises(ValueError, match=r"tau_accept must be in \[0, 1\]"):
        vsd.build(target.model, draft, routing=MASK, policy=(1.5, 0.9))
    with pytest.raises(ValueError, match="tau_slim must be in"):
        vsd.build(target.model, draft, routing=MASK, policy={"tau_slim": -0.1})
    with pytest.raises(ValueError, match="needs the slim verifier's routing mask"):
        vsd.build(target.model, draft, policy=(0.9, 0.9))
    with pytest.raises(ValueError, match="no routing mask 'nope'.*tiny-random-1l"):
        vsd.build(target.model, draft, routing="nope")
    with pytest.raises(ValueError, match="need a draft|pass a draft"):
        vsd.build(target.model, routing=MASK)
    with pytest.raises(TypeError, match=r"SD does not take option\(s\) \['window_size'\]"):
        vsd.build(target.model, draft, window_size=3)
    with pytest.raises(ValueError, match="framework 'medusa'"):
        vsd.build(target.model, draft, framework="medusa")
    generator = vsd.build(target.model, draft)
    with pytest.raises(ValueError, match="do not support num_beams=2: pass num_beams=1"):
        generator.generate(PROMPT, max_new_tokens=4, num_beams=2)
    with pytest.raises(ValueError, match="repetition_penalty=1.2"):
        target.model.generate(PROMPT, custom_generate=generator, max_new_tokens=4, repetition_penalty=1.2)
    with pytest.raises(ValueError, match="one prompt at a time"):
        generator.generate(PROMPT.repeat(2, 1), max_new_tokens=4)
    with pytest.raises(ValueError, match="padding"):
        generator.generate(PROMPT, attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1, 1]]), max_new_tokens=4)
    with pytest.raises(TypeError, match="unknown generation argument"):
        generator.generate(PROMPT, max_new_tokenz=4)
    with pytest.raises(ValueError, match="built for another model"):
        other_vocab.generate(PROMPT, custom_generate=generator, max_new_tokens=4, pad_token_id=0)
    calls.handle.remove()
    assert calls["calls"] == 0  # every check ran before a forward pass
