"""Decoding loops: autoregressive (AR) and draft-then-verify speculative decoding (SD)."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel
from transformers.generation.streamers import BaseStreamer

from ..draft.base import Drafter
from ..hardware import synchronize
from ..runner import CausalLMRunner
from ..sampling import Sampler, SamplingConfig
from ..verify.base import Verifier
from ..verify.policy import Tier
from .schedule import DraftLength, FixedDraftLength
from .stats import DecodeStats

logger = logging.getLogger(__name__)


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens, the stop token included when one ended the generation
    stats: DecodeStats


class CommittedSequence:
    """The prompt and the tokens committed after it, the budget, and the two ways a generation
    ends (stop token, budget); every decoder commits through it, so all end and stream alike."""

    def __init__(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        stop_token_ids,
        context_length: int,
        streamer: BaseStreamer | None = None,
    ):
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids must be [batch, tokens], got shape {tuple(input_ids.shape)}")
        B, T = input_ids.shape
        if B != 1:
            raise ValueError(f"batch size {B} is not supported yet: decode one prompt at a time")
        if T == 0:
            raise ValueError("the prompt is empty: give at least one token")
        if T >= context_length:
            raise ValueError(
                f"the prompt has {T} tokens but the model's context window is {context_length}: shorten the prompt"
            )
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if T + max_new_tokens > context_length:
            logger.warning(
                "prompt (%d) + max_new_tokens (%d) exceeds the context window (%d); generating at most %d tokens",
                T,
                max_new_tokens,
                context_length,
                context_length - T,
            )
            max_new_tokens = context_length - T
        self.ids = input_ids
        self.prompt_length = T
        self.max_new_tokens = max_new_tokens
        self.stop_token_ids = set(stop_token_ids)
        self.done = False
        # transformers' streamer protocol: the prompt first, then each commit, then end()
        self.streamer = streamer
        if streamer is not None:
            streamer.put(input_ids.cpu())

    @property
    def new_tokens(self) -> list[int]:
        return self.ids[0, self.prompt_length :].tolist()

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - (self.ids.shape[1] - self.prompt_length)

    def commit(self, tokens: torch.Tensor) -> None:
        """Append tokens, cut at the first stop token or at the budget."""
        tokens = tokens[: self.remaining]
        for i, token in enumerate(tokens.tolist()):
            if token in self.stop_token_ids:
                tokens, self.done = tokens[: i + 1], True
                break
        self.ids = torch.cat([self.ids, tokens[None].to(self.ids.device)], dim=1)
        self.done = self.done or self.remaining <= 0
        if self.streamer is not None:
            self.streamer.put(tokens.cpu())
            if self.done:
                self.streamer.end()


class Decoder(ABC):
    """A decoding loop: prompt ids in, new tokens and statistics out."""

    @abstractmethod
    def generate(
        self,
        input_ids: torch.Tensor,
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        stop_token_ids: tuple[int, ...] = (),
        streamer: BaseStreamer | None = None,
    ) -> GenerationResult:
        """Generate up to `max_new_tokens` tokens after `input_ids` ([1, T]).

        `streamer` (transformers' `BaseStreamer`: `TextStreamer`, a progress bar, ...) gets the
        prompt, then every committed chunk of new tokens, then `end()`.
        """

    def cores(self, threads: int) -> int:
        """Cores one generation occupies (torch threads summed over processes and workers) when
        the calling process runs `threads` torch threads; decoders with workers add theirs."""
        return threads


class AutoregressiveDecoder(Decoder):
    """One target forward per token: the baseline every speedup is measured against."""

    def __init__(self, target: PreTrainedModel, name: str = "target", compiled: bool = True, int8_gemv: bool = True):
        """`compiled` False: the eager forward even where the target has a compiled step; `int8_gemv`
        False: fbgemm's GEMM for every int8 product. One benchmark run can then compare the paths
        on the same loaded model."""
        self.runner = CausalLMRunner(target, name, compiled=compiled, int8_gemv=int8_gemv)

    def generate(self, input_ids, max_new_tokens, sampling=None, stop_token_ids=(), streamer=None):
        sampler = Sampler(sampling or SamplingConfig(), self.runner.device)
        committed = CommittedSequence(input_ids, max_new_tokens, stop_token_ids, self.runner.context_length, streamer)
        self.runner.reset()
        stats = DecodeStats()
        synchronize(input_ids.device)  # the clock starts when queued work (the prompt's copy) is done
        begin = time.perf_counter()
        while not committed.done:
            logits = self.runner.logits(committed.ids, 1)[0]  # [V]
            token, _ = sampler.choose(logits)
            committed.commit(input_ids.new_tensor([token]))
            stats.steps += 1
        synchronize(input_ids.device)
        stats.seconds = time.perf_counter() - begin
        stats.new_tokens = len(committed.new_tokens)
        stats.model_calls = {self.runner.name: self.runner.stats}
        return GenerationResult(committed.new_tokens, stats)


def check_same_vocabulary(drafter: Drafter, verifier: Verifier) -> None:
    """Raise early when draft tokens would be ids of another tokenizer than the verifier's."""
    if drafter.vocab_size not in (None, verifier.vocab_size):
        raise ValueError(
            f"the drafter's vocabulary ({drafter.vocab_size}) differs from the target's"
            f" ({verifier.vocab_size}): draft and target must share one tokenizer;"
            " pick a draft model of the target's family"
        )


class SpeculativeDecoder(Decoder):
    """Draft-then-verify decoding; lossless when the verifier is.

    K per round comes from `draft_length` (e.g. `AdaptiveDraftLength`: Leviathan's expected
    speedup with profiled costs and the acceptance of recent rounds); without one it is the fixed
    `num_draft_tokens`.
    """

    @staticmethod
    def check_settings(num_draft_tokens: int = 5, **_) -> None:
        """The plain settings' rules (also checked before any model loads: `viasd_adapters.checks`)."""
        FixedDraftLength(num_draft_tokens)  # its rule: K >= 1

    def __init__(
        self,
        drafter: Drafter,
        verifier: Verifier,
        num_draft_tokens: int = 5,
        draft_length: DraftLength | None = None,
    ):
        check_same_vocabulary(drafter, verifier)
        self.drafter = drafter
        self.verifier = verifier
        self.draft_length = draft_length or FixedDraftLength(num_draft_tokens)

    def generate(self, input_ids, max_new_tokens, sampling=None, stop_token_ids=(), streamer=None):
        sampler = Sampler(sampling or SamplingConfig(), input_ids.device)
        committed = CommittedSequence(input_ids, max_new_tokens, stop_token_ids, self.verifier.context_length, streamer)
        self.drafter.reset()
        self.verifier.reset()
        self.draft_length.reset()
        stats = DecodeStats()
        synchronize(input_ids.device)
        begin = time.perf_counter()
        while not committed.done:
            # Never draft past the budget: the verifier adds one token of its own.
            k = min(self.draft_length.next(), committed.remaining - 1)
            # 1. draft
            block = self.drafter.propose(committed.ids, k, sampler)
            # 2. verify (the verifier's caches catch up and roll back inside)
            verdict = self.verifier.verify(committed.ids, block, sampler)
            # 3. commit; the drafter's cache rolls back to the common prefix on its next call
            committed.commit(verdict.tokens)
            # 4. the next round's K learns from this one
            self.draft_length.update(verdict.num_drafted, verdict.num_accepted)
            stats.add_round(
                verdict.num_drafted,
                verdict.num_accepted,
                verdict.tier_counts,
                settled=verdict.last_tier != Tier.ESCALATE,
            )
        synchronize(input_ids.device)
        stats.seconds = time.perf_counter() - begin
        stats.new_tokens = len(committed.new_tokens)
        stats.model_calls = {**self.drafter.stats, **self.verifier.stats}
        return GenerationResult(committed.new_tokens, stats)
