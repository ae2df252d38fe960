"""The cheaper-drafting levers on the real Qwen2.5-Coder 0.5B -> 1.5B pair: still greedy AR."""

import pytest

from tests.test_configs import compose_generate
from tests.test_real_pair import PROMPT
from viasd_adapters.cli.generate import run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ar_output():
    return run(compose_generate(PROMPT, "framework=ar", "max_new_tokens=32"))


@pytest.mark.parametrize("framework", ["sd-fast", "sd-vocab"])
def test_cheaper_drafting_is_token_identical_to_ar_fp32(ar_output, framework):
    """fp32 target, bf16 draft with every lever (confidence stop, 32k head, int8) or the 32k head."""
    text, ar = ar_output
    out_text, out = run(compose_generate(PROMPT, f"framework={framework}", "max_new_tokens=32"))
    assert out.tokens == ar.tokens and out_text == text
    assert out.stats.acceptance_rate > 0.3  # the reduced, quantised draft still drafts well
    assert out.stats.model_calls["target"].calls < ar.stats.model_calls["target"].calls
