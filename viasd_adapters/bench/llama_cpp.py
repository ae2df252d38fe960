"""llama.cpp as a speed anchor: the runtime CPU users already pick, run in the same benchmark.

`LlamaCppDecoder` decodes with llama-cpp-python on the GGUF the offline zoo installs (the file the
cached transformers folder was converted from), so both read the same token ids: prompts encoded
by the target's tokenizer are fed to llama.cpp as ids and its tokens decode with the same
tokenizer. It is a baseline, not a host: no draft, no verifier, nothing of VIA-SD.

Install the extra: `pip install 'viasd-adapters[llama-cpp]'` (llama-cpp-python builds llama.cpp
from source: 5 min 52 s for an AVX2-only build on 2 cores of an AMD EPYC). Its build decides the
instruction set llama.cpp uses.
"""

from __future__ import annotations

import importlib.util
import time

import torch
from transformers import PreTrainedModel

from ..decode import CommittedSequence, Decoder, DecodeStats, GenerationResult
from ..models.offline import OFFLINE_MODELS, gguf_file
from ..runner import CallStats
from ..sampling import SamplingConfig

INSTALL_HINT = "pip install 'viasd-adapters[llama-cpp]' (builds llama.cpp from source: minutes)"


class LlamaCppDecoder(Decoder):
    """Greedy or sampled decoding by llama.cpp on an offline zoo model's GGUF, one prompt at a time."""

    @staticmethod
    def check_settings(model: str, n_ctx: int = 4096, **_) -> None:
        """Before any model loads: the package is installed, `model` has a GGUF, `n_ctx` is sane."""
        if model not in OFFLINE_MODELS:
            raise ValueError(
                f"llama.cpp reads a GGUF, and only the offline zoo models install one; {model!r} is not one"
                f" of them (known: {', '.join(OFFLINE_MODELS)})"
            )
        if n_ctx < 1:
            raise ValueError(f"n_ctx must be >= 1, got {n_ctx}")
        if importlib.util.find_spec("llama_cpp") is None:
            raise ValueError(f"the llama-cpp method needs llama-cpp-python: {INSTALL_HINT}")

    def __init__(self, target: PreTrainedModel, model: str, n_ctx: int = 4096, n_batch: int = 512):
        """
        Args:
            target: the pair's target, the transformers model converted from the same GGUF; its
                vocabulary is checked against the GGUF's (it is not run).
            model: the offline zoo name whose GGUF llama.cpp runs.
            n_ctx: llama.cpp's context window (its KV cache is allocated for this many tokens).
            n_batch: prompt tokens per llama.cpp forward during prefill.
        """
        self.check_settings(model, n_ctx)
        from llama_cpp import Llama

        threads = torch.get_num_threads()
        self.llm = Llama(
            model_path=str(gguf_file(model)),
            n_ctx=n_ctx,
            n_batch=n_batch,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        if self.llm.n_vocab() > target.config.vocab_size:
            raise ValueError(
                f"{model}'s GGUF has {self.llm.n_vocab()} tokens but the target {target.config.vocab_size}:"
                " the target must be the zoo model converted from this GGUF"
            )
        self.context_length = min(n_ctx, target.config.max_position_embeddings)
        self.threads = threads

    def cores(self, threads: int) -> int:
        return threads  # llama.cpp runs as many threads as torch has (`generate` sets them)

    def generate(self, input_ids, max_new_tokens, sampling=None, stop_token_ids=(), streamer=None):
        sampling = sampling or SamplingConfig()
        committed = CommittedSequence(input_ids, max_new_tokens, stop_token_ids, self.context_length, streamer)
        threads = torch.get_num_threads()  # equal cores: what the benchmark gives every method
        if threads != self.threads:
            import llama_cpp

            llama_cpp.llama_set_n_threads(self.llm.ctx, threads, threads)
            self.threads = threads
        self.llm.reset()  # no prefix reuse across generations: every method prefills its prompt
        self.llm.set_seed(sampling.seed)
        stats = DecodeStats()
        begin = time.perf_counter()
        tokens = self.llm.generate(
            committed.ids[0].tolist(),
            temp=0.0 if sampling.greedy else sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            min_p=0.0,
            typical_p=1.0,
            repeat_penalty=1.0,
        )
        for token in tokens:
            committed.commit(input_ids.new_tensor([token]))
            stats.steps += 1
            if committed.done:
                break
        tokens.close()
        stats.seconds = time.perf_counter() - begin
        stats.new_tokens = len(committed.new_tokens)
        # One llama.cpp forward per token, the prompt's included: all of the time is the target's
        stats.model_calls = {"target": CallStats(stats.steps, committed.ids.shape[1], stats.seconds, "gguf")}
        return GenerationResult(committed.new_tokens, stats)
