"""Tier policies: which verifier decides each draft token, as pure functions of p and u."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import IntEnum

import torch


class Tier(IntEnum):
    ACCEPT = 1  # p and u agree with high confidence: keep the draft token, no full model
    SLIM = 2  # u is confident about another token: the slim verifier's token replaces it
    ESCALATE = 3  # the full target q verifies with the lossless rule


class TierPolicy(ABC):
    """Assigns a tier to every draft token of a block, before any full-model work."""

    @abstractmethod
    def assign(self, draft_tokens: torch.Tensor, p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Tiers of the K draft tokens.

        Args:
            draft_tokens: [K] long, x_i.
            p: [K, V] draft distributions p_i (one-hot for deterministic drafters).
            u: [K, V] slim-verifier distributions u_i at the same positions.
        Returns:
            [K] long of `Tier` values; the verifier acts on the first non-ACCEPT one.
        """

    @abstractmethod
    def accepts_bonus(self, u_next: torch.Tensor) -> bool:
        """Whether u's token after a fully accepted block ([V] distribution) may be committed."""


def _check_threshold(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1] (1 disables its tier), got {value}")


@dataclass
class ConfidencePolicy(TierPolicy):
    """Tiers from the slim verifier's confidence, the signal that holds on small models.

    Tier 1 needs agreement (x_i is u's top token) and confidence; tier 2 needs confidence.

    Measured on Qwen2.5-Coder-1.5B with 4 layers skipped: where u's top-1 probability is
    >= 0.9 it agrees with the full model 99 % of the time (../shared/VIA-SD.md). Comparisons
    are strict, so a threshold of 1 switches its tier off.
    """

    tau_accept: float = 0.9  # accept x_i when u_i(x_i) > tau_accept and p_i(x_i) > tau_draft
    tau_draft: float = 0.0  # the draft's own confidence in x_i; 0 ignores it
    tau_slim: float = 0.9  # otherwise rewrite with u's token when max_v u_i(v) > tau_slim

    def __post_init__(self) -> None:
        for name in ("tau_accept", "tau_draft", "tau_slim"):
            _check_threshold(name, getattr(self, name))

    def assign(self, draft_tokens, p, u):
        K = draft_tokens.numel()
        idx = torch.arange(K, device=draft_tokens.device)
        agree = u.argmax(-1) == draft_tokens
        accept = agree & (u[idx, draft_tokens] > self.tau_accept) & (p[idx, draft_tokens] > self.tau_draft)
        slim = u.max(-1).values > self.tau_slim
        tiers = torch.full((K,), int(Tier.ESCALATE), dtype=torch.long, device=draft_tokens.device)
        tiers[slim] = int(Tier.SLIM)
        tiers[accept] = int(Tier.ACCEPT)
        return tiers

    def accepts_bonus(self, u_next):
        return bool(u_next.max() > self.tau_slim)
