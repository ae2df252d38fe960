"""The real Qwen2.5-Coder 0.5B -> 1.5B pair (offline PyPI packages), in the default run."""

import pytest

from tests.test_configs import compose_generate
from viasd_adapters.cli.generate import run

PROMPT = "prompt=Write a Python function that returns the n-th Fibonacci number."


@pytest.fixture(scope="module")
def ar_output():
    return run(compose_generate(PROMPT, "framework=ar", "max_new_tokens=32"))


def test_greedy_sd_is_token_identical_to_ar_fp32(ar_output):
    text, ar = ar_output
    sd_text, sd = run(compose_generate(PROMPT, "framework=sd", "max_new_tokens=32"))
    assert sd.tokens == ar.tokens and sd_text == text
    assert "def " in text  # a real model wrote code, not noise
    assert sd.stats.acceptance_rate > 0.3
    assert sd.stats.model_calls["target"].calls < ar.stats.model_calls["target"].calls
