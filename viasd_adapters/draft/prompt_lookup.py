"""Prompt-lookup (n-gram) drafting: copy what followed the latest earlier occurrence of the
sequence's last n tokens (Saxena 2023, "Prompt Lookup Decoding"). No model, no cost."""

from __future__ import annotations

import torch

from ..sampling import Sampler
from .base import DraftBlock, Drafter


class PromptLookupDrafter(Drafter):
    """Proposes the continuation of the longest recent n-gram match (deterministic: p is one-hot)."""

    name = "lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    @property
    def vocab_size(self) -> None:
        return None  # copies tokens of the sequence: any vocabulary fits

    def reset(self) -> None:
        pass

    def propose(self, input_ids: torch.Tensor, num_tokens: int, sampler: Sampler) -> DraftBlock:
        ids = input_ids[0]
        T = ids.numel()
        for n in range(min(self.max_ngram, T - 1), self.min_ngram - 1, -1):
            windows = ids.unfold(0, n, 1)[:-1]  # [T - n, n]: every earlier n-gram
            hits = (windows == ids[T - n :]).all(-1).nonzero()
            if hits.numel():
                start = int(hits[-1]) + n  # the most recent match
                return DraftBlock(ids[start : start + num_tokens].clone(), None)
        return DraftBlock(ids[:0].clone(), None)
