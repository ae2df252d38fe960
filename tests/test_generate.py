"""`viasd-generate` end to end on the tiny random pair (built in memory)."""

import subprocess
import sys

import pytest

from tests.test_configs import compose_generate
from viasd_adapters.cli.generate import run

TINY = ("model_pair=tiny-random", "runtime.dtype=float32", "max_new_tokens=24")


def test_sd_prints_what_ar_prints():
    ar_text, ar = run(compose_generate(*TINY, "framework=ar"))
    sd_text, sd = run(compose_generate(*TINY, "framework=sd"))
    assert sd_text == ar_text and ar.tokens == sd.tokens
    assert set(sd.stats.model_calls) == {"draft", "target"}


def test_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="prompt is empty"):
        run(compose_generate(*TINY, "prompt=' '"))


def test_console_script_prints_text_and_stats_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "viasd_adapters.cli.generate", *TINY, "prompt=hello"],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    ).stdout.strip().splitlines()
    assert out[-1].startswith("[sd] new tokens 24 |")
    assert "forward calls: draft" in out[-1]
