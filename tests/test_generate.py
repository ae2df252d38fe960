"""`viasd-generate` end to end on the tiny random pair (built in memory)."""

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.test_configs import compose_generate
from viasd_adapters.cli import generate
from viasd_adapters.cli.generate import run
from viasd_adapters.pipeline import Pipeline
from viasd_adapters.progress import TokenProgress
from viasd_adapters.sampling import SamplingConfig

# Another working directory must still import this checkout, not an installed copy.
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]),
}
TINY = ("model_pair=tiny-random", "runtime.weights=float32", "max_new_tokens=24")
# Characters Hydra's override grammar and OmegaConf's interpolation would choke on.
AWKWARD = "Explain: a=b, c=[1,2] {k: v} ${oops} \"quoted\" 'single' $HOME \\n é 漢字\nsecond line"


def test_sd_prints_what_ar_prints():
    ar = run(compose_generate(*TINY, "framework=ar"))
    sd = run(compose_generate(*TINY, "framework=sd"))
    assert sd.text == ar.text and ar.result.tokens == sd.result.tokens
    assert set(sd.result.stats.model_calls) == {"draft", "target"}
    assert sd.prompt_tokens > 0 and len(sd.result.tokens) == 24
    assert 0 < sd.result.stats.accepted < sd.result.stats.drafted  # accepted and rejected drafts both occurred


@pytest.mark.parametrize("draft_dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_tiny_pair_accepts_most_drafts_but_not_all(draft_dtype, temperature):
    """The tiny pair's draft is a perturbed copy of its target, so tests on it exercise the accept
    paths of SD, PEARL and VIA-SD, not only rejections (an unrelated random draft accepts ~0)."""
    prompts = ["hello", "The quick brown fox", "def f(x):"]
    drafted = accepted = 0
    for prompt in prompts:
        out = run(
            compose_generate(
                *TINY,
                "max_new_tokens=48",
                f"runtime.draft_weights={draft_dtype}",
                f"sampling.temperature={temperature}",
                f"prompt='{prompt}'",
            )
        ).result
        drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
    assert 0.4 < accepted / drafted < 0.9


def test_empty_prompt_is_refused():
    with pytest.raises(ValueError, match="prompt is empty"):
        run(compose_generate(*TINY, "prompt=' '"))


@pytest.mark.parametrize(
    "overrides, method",
    [
        (["framework=ar"], "AR"),
        (["framework=sd"], "SD"),
        (["framework=sd", "verifier=tiered"], "VIA-SD on SD"),
        (["framework=sd", "verifier=tiered", "verifier.policy=null"], "SD"),  # tiers off is plain SD
        (["framework=lookup", "verifier=tiered"], "VIA-SD on prompt-lookup SD"),
        (["framework=lookup", "verifier=tiered-intermediate"], "VIA-SD on prompt-lookup SD (independent middle model)"),
        (["framework=sd", "verifier=faster-cascade"], "Faster Cascades on SD"),
        (["framework=cascade"], "Cascade SD"),
    ],
)
def test_the_method_that_ran_is_named(overrides, method):
    outcome = run(compose_generate(*TINY, "max_new_tokens=4", *overrides))
    assert outcome.method == method
    assert outcome.stats_line().startswith(f"[{method}] new tokens 4 |")


def test_prompt_file_takes_any_characters(tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text(AWKWARD + "\n", encoding="utf-8")
    from_file = run(compose_generate(*TINY, f"prompt_file={path}"))
    assert from_file.prompt == AWKWARD
    # The same text given through the Python API decodes to the same tokens: nothing was mangled.
    direct = Pipeline.from_config(compose_generate(*TINY)).generate(AWKWARD, 24, SamplingConfig())
    assert from_file.result.tokens == direct.tokens


def test_the_prompt_is_tokenised_once(monkeypatch):
    calls = []
    encode = Pipeline.encode
    monkeypatch.setattr(Pipeline, "encode", lambda self, prompt: calls.append(prompt) or encode(self, prompt))
    outcome = run(compose_generate(*TINY, "max_new_tokens=4", "prompt=hello"))
    assert calls == ["hello"] and len(outcome.result.tokens) == 4


def test_missing_prompt_file_fails_before_loading(monkeypatch, tmp_path):
    def no_loading(cfg):
        raise AssertionError("models were loaded before the prompt was read")

    monkeypatch.setattr(generate.Pipeline, "from_config", no_loading)
    with pytest.raises(ValueError, match="prompt_file .* does not exist"):
        run(compose_generate(*TINY, f"prompt_file={tmp_path / 'missing.txt'}"))


def test_threads_key_sets_torch_threads():
    before = torch.get_num_threads()
    try:
        run(compose_generate(*TINY, "max_new_tokens=2", "runtime.threads=1"))
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_progress_bar_counts_new_tokens_on_a_terminal(monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    screen = Terminal()
    monkeypatch.setattr(sys, "stderr", screen)
    bar = TokenProgress(total=10, desc="SD")
    bar.put(torch.zeros(1, 7))  # the prompt: not counted
    bar.put(torch.zeros(3))
    bar.put(torch.zeros(2))
    assert bar.bar.n == 5
    bar.end()
    assert "SD:" in screen.getvalue() and "/10" in screen.getvalue()  # drawn on the terminal


def test_progress_bar_is_off_when_not_a_terminal_or_by_the_key(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert TokenProgress(total=10).bar.disable
    monkeypatch.setattr(sys, "stderr", type("T", (io.StringIO,), {"isatty": lambda self: True})())
    assert TokenProgress(total=10, enabled=False).bar.disable


def test_console_script_prints_text_and_method_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "viasd_adapters.cli.generate", *TINY, "prompt=hello", "verifier=tiered"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env=ENV,
    )
    last = out.stdout.strip().splitlines()[-1]
    assert last.startswith("[VIA-SD on SD] new tokens 24 |")
    assert "forward calls: draft" in last
    assert "tok/s" not in out.stderr.replace(last, "")  # no progress bar: stderr is a pipe here


def test_console_script_reads_the_prompt_from_stdin(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "viasd_adapters.cli.generate", *TINY, "prompt_file=-", "framework=ar"],
        input=AWKWARD,
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env=ENV,
    )
    expected = run(compose_generate(*TINY, "framework=ar", f"prompt_file={_write(tmp_path, AWKWARD)}"))
    assert out.stdout.startswith(expected.text)
    assert out.stdout.strip().splitlines()[-1].startswith("[AR] new tokens")


def _write(folder, text):
    path = folder / "p.txt"
    path.write_text(text, encoding="utf-8")
    return path
