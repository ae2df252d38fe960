"""The decoder contract, the same checks over every framework on the tiny pair (fp32).

Every decoder, built as the CLI builds it (`pipeline.build_decoder`), returns a
`GenerationResult` whose stats add up, is token-identical to greedy AR, ends at the budget and
at the first stop token, streams exactly what it commits, warns and truncates on a prompt near
the context window, and reproduces a seeded sample.
"""

from __future__ import annotations

import logging

import pytest
import torch
from transformers.generation.streamers import BaseStreamer

from tests.conftest import import_or_skip_outside_ci
from tests.decode.test_loops import PROMPT
from tests.test_configs import compose_generate
from viasd_adapters.decode import AutoregressiveDecoder, GenerationResult
from viasd_adapters.pipeline import build_decoder
from viasd_adapters.sampling import SamplingConfig

FRAMEWORKS = ["ar", "sd", "lookup", "cascade", "pearl", "eagle"]
SAMPLED = SamplingConfig(temperature=1.0, seed=7)


class Recorder(BaseStreamer):
    """transformers' streamer protocol, recorded: each `put` as a list, then "end"."""

    def __init__(self):
        self.calls: list = []

    def put(self, value):
        self.calls.append(value.reshape(-1).tolist())

    def end(self):
        self.calls.append("end")


@pytest.fixture(scope="module")
def eagle_files(tiny_pair, tmp_path_factory):
    """Overrides giving the tiny target a random EAGLE head and a tokenizer folder."""
    import_or_skip_outside_ci("eagle.model.utils")
    from viasd_adapters.third_party.eagle import build_head, head_config, save_head

    root = tmp_path_factory.mktemp("contract-eagle")
    config = head_config(tiny_pair.target.model.config, intermediate_size=32)
    torch.manual_seed(0)
    save_head(build_head(config), config, root / "head", full=False, compact=True)
    tiny_pair.target.tokenizer.save_pretrained(root / "tokenizer")
    return [f"framework.decoder.head={root / 'head'}", f"framework.decoder.tokenizer_path={root / 'tokenizer'}"]


@pytest.fixture(scope="module")
def decoders(tiny_pair, request):
    """framework name -> its decoder on the tiny pair, built once per module."""
    built = {}

    def get(name: str):
        if name not in built:
            extra = {
                "pearl": ["framework.decoder.backend=thread"],  # a process worker costs seconds to start
                "eagle": request.getfixturevalue("eagle_files"),
            }.get(name, [])
            cfg = compose_generate(
                "model_pair=tiny-random",
                "runtime.weights=float32",
                "runtime.draft_weights=float32",
                f"framework={name}",
                "verifier=full",
                *extra,
            )
            built[name] = build_decoder(cfg.framework, cfg.verifier, tiny_pair)
        return built[name]

    yield get
    for decoder in built.values():
        if hasattr(decoder, "close"):
            decoder.close()


@pytest.fixture(scope="module")
def ar_tokens(tiny_target):
    return AutoregressiveDecoder(tiny_target.model).generate(PROMPT, 40).tokens


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_greedy_result_is_ar_with_consistent_stats(decoders, ar_tokens, name):
    out = decoders(name).generate(PROMPT, 40)
    assert isinstance(out, GenerationResult)
    assert out.tokens == ar_tokens
    s = out.stats
    assert s.new_tokens == len(out.tokens) == 40 and s.seconds > 0
    assert 1 <= s.steps <= s.new_tokens  # every round commits at least one token
    assert 0 <= s.accepted <= s.drafted and s.accepted <= s.new_tokens
    assert "target" in s.model_calls and s.model_calls["target"].calls >= 1
    if name == "ar":
        assert s.steps == 40 and s.drafted == 0
    else:
        assert s.drafted > 0  # it speculated
        assert sum(s.tier_counts.values()) <= s.new_tokens


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_budget_and_stop_token_end_the_generation(decoders, ar_tokens, name):
    decoder = decoders(name)
    for n in (1, 2, 9):
        assert decoder.generate(PROMPT, n).tokens == ar_tokens[:n]
    stop = ar_tokens[7]
    first = ar_tokens.index(stop)
    out = decoder.generate(PROMPT, 40, stop_token_ids=(stop,))
    assert out.tokens == ar_tokens[: first + 1] and out.stats.new_tokens == first + 1


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_streamer_gets_the_prompt_then_exactly_the_committed_tokens(decoders, ar_tokens, name):
    stop = ar_tokens[12]  # mid-block for the speculative loops: what follows it is never streamed
    for stop_token_ids in ((), (stop,)):
        recorder = Recorder()
        out = decoders(name).generate(PROMPT, 30, stop_token_ids=stop_token_ids, streamer=recorder)
        assert recorder.calls[0] == PROMPT[0].tolist()
        assert recorder.calls[-1] == "end" and recorder.calls.count("end") == 1
        assert sum(recorder.calls[1:-1], []) == out.tokens
    assert out.tokens[-1] == stop and len(out.tokens) < 30


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_a_prompt_near_the_context_window_is_truncated_with_a_warning(decoders, tiny_target, name, caplog):
    room = 6
    prompt = torch.randint(0, 256, (1, tiny_target.context_length - room), generator=torch.Generator().manual_seed(0))
    with caplog.at_level(logging.WARNING):
        out = decoders(name).generate(prompt, 50)
    assert len(out.tokens) == out.stats.new_tokens == room
    assert any("context window" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


@pytest.mark.parametrize("name", FRAMEWORKS)
def test_seeded_sampling_is_reproducible(decoders, name):
    decoder = decoders(name)
    run = lambda seed: decoder.generate(PROMPT, 30, SamplingConfig(temperature=1.0, seed=seed)).tokens
    first = run(7)
    assert len(first) == 30 and run(7) == first
    assert run(8) != first
