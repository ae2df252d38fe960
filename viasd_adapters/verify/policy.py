"""Tier policies: which verifier decides each draft token, as pure functions of p and u."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from enum import StrEnum

import torch


class Tier(StrEnum):
    """VIA-SD's three tiers. A member is also its name in records (`tier_counts` keys)."""

    ACCEPT = "accept"  # 1: p and u agree with high confidence: keep the draft token, no full model
    SLIM = "slim"  # 2: u is confident: the slim verifier's token replaces it (or follows the block)
    ESCALATE = "full"  # 3: the full target q verifies with the lossless rule

    @property
    def code(self) -> int:
        """The tier's number (1, 2, 3), as `TierPolicy.assign` writes it into tensors."""
        return _CODES[self]

    @classmethod
    def of(cls, code: int) -> Tier:
        """The tier numbered `code`."""
        return _TIERS[int(code)]


_CODES = {Tier.ACCEPT: 1, Tier.SLIM: 2, Tier.ESCALATE: 3}
_TIERS = {code: tier for tier, code in _CODES.items()}


class TierPolicy(ABC):
    """Says, before any full-model work, where the slim verifier u may decide.

    Thresholds are always compared with u's *raw* distribution, softmax(logits) at temperature 1
    with no top-k / top-p: the quantity greedy decoding sees, so thresholds calibrated greedily
    mean the same confidence when sampling at any temperature.
    """

    @abstractmethod
    def assign(self, draft_tokens: torch.Tensor, p: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Greedy decoding: the tiers of the K draft tokens.

        Args:
            draft_tokens: [K] long, x_i.
            p: [K, V] draft distributions p_i (one-hot for deterministic drafters).
            u: [K, V] raw slim-verifier distributions u_i at the same positions.
        Returns:
            [K] long of `Tier.code` values; the verifier acts on the first non-ACCEPT one.
        """

    @abstractmethod
    def accepts_bonus(self, u_next: torch.Tensor) -> bool:
        """Greedy decoding: whether u's token after a block tier 1 kept whole may be committed.

        Args:
            u_next: [V] raw slim distribution after the block.
        """

    @abstractmethod
    def settles(self, p: torch.Tensor | None, u: torch.Tensor) -> torch.Tensor:
        """Sampling: the positions where u decides by speculative sampling (tiers 1-2).

        The answer may depend on the distributions only, never on the sampled draft token: then
        every token the slim tier settles is distributed exactly as u (tempered), and the others
        exactly as q.

        Args:
            p: [K, V] draft distributions as drafted (one-hot for deterministic drafters), or None
                at positions without a draft (the token after a block kept whole).
            u: [K, V] raw slim-verifier distributions.
        Returns:
            [K] bool.
        """


def _check_threshold(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1] (1 disables its tier), got {value}")


@dataclass
class ConfidencePolicy(TierPolicy):
    """Tiers from the slim verifier's confidence, the signal that holds on small models.

    Greedy: tier 1 needs agreement (x_i is u's top token) and confidence; tier 2 needs confidence.
    Sampling: u decides position i when max u_i > max(tau_accept, tau_slim) (speculative sampling
    may keep the draft, tier 1's decision, or replace it, tier 2's: both must be allowed) and
    max p_i > tau_draft; the token after a block kept whole when max u > tau_slim (as greedy).

    Measured on Qwen2.5-Coder-1.5B with 4 layers skipped: where u's top-1 probability is
    >= 0.9 it agrees with the full model 99 % of the time. Comparisons are strict, so a
    threshold of 1 switches its tier off.
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
        tiers = torch.full((K,), Tier.ESCALATE.code, dtype=torch.long, device=draft_tokens.device)
        tiers[slim] = Tier.SLIM.code
        tiers[accept] = Tier.ACCEPT.code
        return tiers

    def accepts_bonus(self, u_next):
        return bool(u_next.max() > self.tau_slim)

    def settles(self, p, u):
        confidence = u.max(-1).values  # [K]
        if p is None:
            return confidence > self.tau_slim
        return (confidence > max(self.tau_accept, self.tau_slim)) & (p.max(-1).values > self.tau_draft)
