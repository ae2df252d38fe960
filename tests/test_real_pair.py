"""The real Qwen2.5-Coder 0.5B -> 1.5B pair (offline PyPI packages): the int8 test in the default
run, the fp32 ones with `-m slow`.

VIASD_TEST_DEVICE=cuda runs them on a GPU (tools/gpu_check.sh does)."""

import os

import pytest
import torch
from hydra.utils import instantiate

from tests.test_configs import compose_generate as _compose_generate
from viasd_adapters.cli.generate import run
from viasd_adapters.models.compiled import decode_step
from viasd_adapters.pipeline import Pipeline, build_decoder, load_pair
from viasd_adapters.runner import CausalLMRunner

pytestmark = pytest.mark.large_models  # one worker runs these, one after another (tests/conftest.py)

PROMPT = "prompt=Write a Python function that returns the n-th Fibonacci number."
DEVICE = os.environ.get("VIASD_TEST_DEVICE", "cpu")
LOGIT_TOLERANCE = 2.0  # compiled against eager int8 logits (see the int8 test)


def compose_generate(*overrides: str):
    return _compose_generate(f"runtime.device={DEVICE}", *overrides)


def generate_on(pair, cfg, max_new_tokens: int = 32):
    """What `viasd-generate` decodes with `cfg`, on an already loaded pair."""
    pipeline = Pipeline(build_decoder(cfg.framework, cfg.verifier, pair), pair, cfg.chat_template)
    return pipeline.generate(cfg.prompt, max_new_tokens, instantiate(cfg.sampling))


@pytest.fixture(scope="module")
def ar_output():
    return run(compose_generate(PROMPT, "framework=ar", "max_new_tokens=32"))


@pytest.mark.slow  # the default run must stay under 15 min (pyproject.toml)
@pytest.mark.parametrize("framework", ["sd", "sd-adaptive-int8"])  # the latter: adaptive K, int8-weight drafter
def test_greedy_sd_is_token_identical_to_ar_fp32(ar_output, framework):
    text, ar = ar_output
    sd_text, sd = run(compose_generate(PROMPT, f"framework={framework}", "max_new_tokens=32"))
    assert sd.tokens == ar.tokens and sd_text == text
    assert "def " in text  # a real model wrote code, not noise
    assert 0.3 < sd.stats.acceptance_rate < 1.0  # drafts were accepted and rejected
    assert sd.stats.model_calls["target"].calls < ar.stats.model_calls["target"].calls


@pytest.mark.slow  # the default run must stay under 15 min (pyproject.toml)
@pytest.mark.parametrize(
    "overrides",
    [
        ["verifier.policy=null"],  # the slim tier off
        ["policy.tau_accept=1.0", "policy.tau_slim=1.0"],  # the slim verifier runs, everything escalates
        ["policy.tau_accept=1.0", "policy.tau_slim=1.0", "verifier.share_prefix=true"],  # ... reusing its prefix
    ],
    ids=["slim-off", "all-escalate", "all-escalate-shared-prefix"],
)
def test_tiered_reductions_equal_greedy_ar_fp32(ar_output, overrides):
    """VIA-SD with the Qwen pair's DIMR mask reduces to lossless SD, hence to AR in fp32."""
    _, ar = ar_output
    _, tiered = run(compose_generate(PROMPT, "framework=sd", "verifier=tiered", "max_new_tokens=32", *overrides))
    assert tiered.tokens == ar.tokens
    slim_calls = tiered.stats.model_calls["slim"].calls if "slim" in tiered.stats.model_calls else 0
    assert (slim_calls == 0) == ("verifier.policy=null" in overrides)
    assert set(tiered.stats.tier_counts) <= {"full"}


@pytest.mark.skipif(DEVICE != "cpu", reason="int8 has CPU kernels only")
def test_greedy_sd_lookup_and_eagle_on_the_int8_target_reproduce_int8_ar():
    """The int8 target is its own reference: a verify block (a chain, or EAGLE's tree with the
    shipped head, drafting in int8) computes what its steps compute."""
    int8 = ("runtime.weights=int8", "runtime.draft_weights=int8")
    pair = load_pair(compose_generate(*int8).model_pair)  # once: quantising the pair takes most of a minute
    ar, sd, lookup, eagle = (
        generate_on(pair, compose_generate(PROMPT, f"framework={name}", *int8))
        for name in ("ar", "sd", "lookup", "eagle")
    )
    assert sd.tokens == ar.tokens and lookup.tokens == ar.tokens and eagle.tokens == ar.tokens
    assert 0 < sd.stats.accepted < sd.stats.drafted
    assert 0 < eagle.stats.accepted < eagle.stats.drafted
    # runtime.compile=auto compiled both models (int8, >= 100M parameters). The eager transformers
    # forward of the same int8 weights (a runner with compiled=False, what runtime.compile=false
    # gives) rounds attention and norms its own way, which int8's per-row activation scales amplify:
    # teacher-forced on the compiled AR's tokens, the two pick the same token wherever eager's top-2
    # margin exceeds LOGIT_TOLERANCE, and the chosen token's logit moves by less than it (measured:
    # 0.91 agreement, moves up to 1.4).
    assert decode_step(pair.target.model) is not None and decode_step(pair.draft.model) is not None
    prompt = Pipeline(None, pair, True).encode(compose_generate(PROMPT, *int8).prompt)
    ids = torch.cat([prompt, torch.tensor([ar.tokens])], dim=1)
    m = len(ar.tokens)
    compiled_logits = CausalLMRunner(pair.target.model).logits(ids, m)  # [m, V]
    eager_logits = CausalLMRunner(pair.target.model, compiled=False).logits(ids, m)
    top2 = eager_logits.topk(2, dim=-1).values
    clear = top2[:, 0] - top2[:, 1] > LOGIT_TOLERANCE
    assert torch.equal(compiled_logits.argmax(-1)[clear], eager_logits.argmax(-1)[clear])
    chosen = eager_logits.argmax(-1, keepdim=True)
    assert (compiled_logits.gather(1, chosen) - eager_logits.gather(1, chosen)).abs().max() < LOGIT_TOLERANCE
    assert (compiled_logits.argmax(-1) == eager_logits.argmax(-1)).float().mean() >= 0.8
