"""Vertical cascade drafting (Chen et al. 2023, "Cascade Speculative Drafting"): the draft
model is itself sped up by speculative decoding with a cheaper drafter below it."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..runner import CallStats, CausalLMRunner
from ..sampling import Sampler
from ..verify.acceptance import lossless_accept
from .base import DraftBlock, Drafter


class CascadeDrafter(Drafter):
    """Drafts K tokens of `model` losslessly, with `lower` proposing for it.

    The tokens are distributed as `model`'s own, so the returned p is `model`'s distribution.
    """

    def __init__(self, model: PreTrainedModel, lower: Drafter, lower_tokens: int = 4, name: str = "draft"):
        self.check_settings(lower_tokens=lower_tokens)
        self.name = name
        self.runner = CausalLMRunner(model, name)
        self.lower = lower
        self.lower_tokens = lower_tokens

    @staticmethod
    def check_settings(lower_tokens: int = 4, **_) -> None:
        """The plain settings' rules (also checked before any model loads: `viasd_adapters.checks`)."""
        if lower_tokens < 1:
            raise ValueError(f"lower_tokens must be >= 1, got {lower_tokens}")

    @property
    def vocab_size(self) -> int:
        return self.runner.vocab_size

    def reset(self) -> None:
        self.runner.reset()
        self.lower.reset()

    @property
    def stats(self) -> dict[str, CallStats]:
        return {**self.lower.stats, self.name: self.runner.stats}

    def propose(self, input_ids: torch.Tensor, num_tokens: int, sampler: Sampler) -> DraftBlock:
        T = input_ids.shape[1]
        ids = input_ids
        probs = []
        while ids.shape[1] - T < num_tokens:
            k = min(self.lower_tokens, num_tokens - (ids.shape[1] - T) - 1)
            block = self.lower.propose(ids, k, sampler)
            k = len(block)
            logits = self.runner.logits(torch.cat([ids, block.tokens[None]], dim=1), k + 1)
            outcome = lossless_accept(block.tokens, block.draft_probs(logits.shape[-1]), logits, sampler)
            n = outcome.num_accepted
            tokens = torch.cat([block.tokens[:n], block.tokens.new_tensor([outcome.next_token])])
            # p of each committed token: the draft model's own distribution at its position
            probs.append(sampler.probs(logits[: n + 1]))
            ids = torch.cat([ids, tokens[None]], dim=1)
        return DraftBlock(ids[0, T:].clone(), torch.cat(probs) if probs else None)
