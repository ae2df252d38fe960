"""The drafter interface: propose a block of K tokens with the distributions they came from."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from ..runner import CallStats
from ..sampling import Sampler


@dataclass
class DraftBlock:
    """K proposed tokens, in order."""

    tokens: torch.Tensor  # [K] long
    probs: torch.Tensor | None  # [K, V] draft distribution p of each token; None: deterministic

    def __len__(self) -> int:
        return self.tokens.numel()

    def draft_probs(self, vocab_size: int) -> torch.Tensor:
        """[K, V] p, one-hot for a deterministic drafter (so rejection sampling stays exact)."""
        if self.probs is not None:
            return self.probs
        one_hot = torch.zeros(len(self), vocab_size, device=self.tokens.device)
        return one_hot.scatter_(1, self.tokens[:, None], 1.0)


class Drafter(ABC):
    """Proposes draft tokens. It never decides acceptance."""

    name: str = "draft"

    @property
    @abstractmethod
    def vocab_size(self) -> int | None:
        """V of the distributions it returns; None for drafters that copy tokens (any V fits)."""

    @abstractmethod
    def reset(self) -> None:
        """Start a new generation (forget caches and statistics)."""

    @abstractmethod
    def propose(self, input_ids: torch.Tensor, num_tokens: int, sampler: Sampler) -> DraftBlock:
        """Propose up to `num_tokens` tokens to follow `input_ids` ([1, T]).

        Returns a block of K <= num_tokens tokens (K may be 0 for drafters that can run dry).
        """

    @property
    def stats(self) -> dict[str, CallStats]:
        """Forward-pass cost per model since the last reset, keyed by model name."""
        return {}
