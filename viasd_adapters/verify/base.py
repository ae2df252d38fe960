"""The verifier interface: judge a draft block and say which tokens to commit."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import torch

from ..runner import CallStats
from ..sampling import Sampler
from ..draft.base import DraftBlock
from .policy import Tier


@dataclass
class Verdict:
    """What one verification step commits."""

    tokens: torch.Tensor  # [n + 1] or [n] long: kept drafts, then the recovered/rewritten/bonus token
    num_accepted: int  # n: leading draft tokens committed unchanged
    num_drafted: int  # K: draft tokens judged
    # Every committed token counted once, under the tier that decided it (kept drafts, and the
    # recovered / rewritten / bonus token), e.g. {Tier.ESCALATE: 3}: sums to len(tokens). Tier
    # members are strings ("accept", "slim", "full"); other verifiers may add their own names.
    tier_counts: dict[str, int] = field(default_factory=dict)
    last_tier: Tier = Tier.ESCALATE  # the tier that chose tokens[-1]


class Verifier(ABC):
    """Judges draft blocks against a target; owns the target-side caches."""

    @property
    @abstractmethod
    def vocab_size(self) -> int:
        """V of the distributions it compares drafts with."""

    @property
    @abstractmethod
    def context_length(self) -> int:
        """Longest sequence (prompt + output) the target accepts."""

    @abstractmethod
    def reset(self) -> None:
        """Start a new generation (forget caches and statistics)."""

    @abstractmethod
    def verify(self, input_ids: torch.Tensor, draft: DraftBlock, sampler: Sampler) -> Verdict:
        """Judge `draft` (K tokens) as the continuation of `input_ids` ([1, T], committed)."""

    @property
    def stats(self) -> dict[str, CallStats]:
        """Forward-pass cost per model since the last reset, keyed by model name."""
        return {}
