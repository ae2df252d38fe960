"""Draft-model drafting: a small LM of the same tokenizer proposes tokens autoregressively."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..runner import CallStats, CausalLMRunner
from ..sampling import Sampler
from .base import DraftBlock, Drafter


class ModelDrafter(Drafter):
    """Drafts K tokens with K forward passes of a draft model (its cache rolls back itself)."""

    def __init__(self, model: PreTrainedModel, name: str = "draft"):
        self.name = name
        self.runner = CausalLMRunner(model, name)

    @property
    def vocab_size(self) -> int:
        return self.runner.vocab_size

    def reset(self) -> None:
        self.runner.reset()

    @property
    def stats(self) -> dict[str, CallStats]:
        return {self.name: self.runner.stats}

    def propose(self, input_ids: torch.Tensor, num_tokens: int, sampler: Sampler) -> DraftBlock:
        tokens, probs = [], []
        ids = input_ids
        for _ in range(num_tokens):
            logits = self.runner.logits(ids, 1)[0]  # [V]
            token, p = sampler.choose(logits)
            tokens.append(token)
            probs.append(p)
            ids = torch.cat([ids, ids.new_tensor([[token]])], dim=1)
        return DraftBlock(
            tokens=input_ids.new_tensor(tokens),
            probs=torch.stack(probs) if probs else None,
        )
