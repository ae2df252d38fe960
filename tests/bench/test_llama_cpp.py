"""llama.cpp as a benchmark anchor (viasd_adapters.bench.llama_cpp), on SmolLM2's own GGUF.

Needs the optional `llama-cpp` extra; without it these tests skip (the refusal without it is
tested in tests/test_checks.py)."""

import pytest

pytest.importorskip("llama_cpp")

from transformers.generation.streamers import BaseStreamer  # noqa: E402

from tests.test_configs import compose_generate  # noqa: E402
from viasd_adapters.bench.metrics import token_agreement  # noqa: E402
from viasd_adapters.cli.generate import run  # noqa: E402
from viasd_adapters.pipeline import Pipeline  # noqa: E402
from viasd_adapters.sampling import SamplingConfig  # noqa: E402

PROMPT = "Write a Python function that returns the n-th Fibonacci number."


class Collect(BaseStreamer):
    def __init__(self):
        self.chunks, self.ended = [], False

    def put(self, value):
        self.chunks.append(value.reshape(-1).tolist())

    def end(self):
        self.ended = True


@pytest.fixture(scope="module")
def llama_pipeline():
    return Pipeline.from_config(compose_generate("model_pair=smollm2-135m", "framework=llama-cpp"))


def test_llama_cpp_reads_the_same_ids_as_the_converted_model(llama_pipeline):
    """The fp32 folder is the GGUF dequantised, so greedy outputs start alike; a wrong id mapping
    (prompt or output) would part at once."""
    ids = llama_pipeline.encode(PROMPT)
    streamer = Collect()
    ours = llama_pipeline.generate(ids, 24, SamplingConfig(), streamer=streamer)
    again = llama_pipeline.generate(ids, 24, SamplingConfig())
    _, ar = run(
        compose_generate(
            "model_pair=smollm2-135m",
            "framework=ar",
            "runtime.weights=float32",
            f"prompt={PROMPT}",
            "max_new_tokens=24",
        )
    )
    assert ours.tokens == again.tokens  # greedy is deterministic
    assert ours.tokens[:8] == ar.tokens[:8] and token_agreement(ours.tokens, ar.tokens)[0] > 0.3
    assert "def " in llama_pipeline.decode(ours.tokens)
    assert streamer.chunks[0] == ids[0].tolist() and sum(streamer.chunks[1:], []) == ours.tokens and streamer.ended
    assert ours.stats.model_calls["target"].calls == ours.stats.new_tokens == 24


def test_llama_cpp_sampling_is_seeded_and_stops_at_the_budget(llama_pipeline):
    ids = llama_pipeline.encode(PROMPT)
    draws = [llama_pipeline.generate(ids, 12, SamplingConfig(temperature=1.0, seed=s)).tokens for s in (3, 3, 4)]
    assert draws[0] == draws[1] and draws[0] != draws[2] and len(draws[0]) == 12


def test_llama_cpp_runs_the_threads_torch_runs(llama_pipeline):
    """Equal cores: a method's threads (the benchmark sets torch's) are llama.cpp's too."""
    from viasd_adapters.bench.harness import torch_threads

    decoder, ids = llama_pipeline.decoder, llama_pipeline.encode(PROMPT)
    with torch_threads(1):
        one = llama_pipeline.generate(ids, 8, SamplingConfig()).tokens
        assert decoder.threads == 1 and decoder.cores(1) == 1
    assert llama_pipeline.generate(ids, 8, SamplingConfig()).tokens == one  # greedy, whatever the threads
