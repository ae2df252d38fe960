"""Speculative cascades (Narasimhan et al. 2024, "Faster Cascades via Speculative Decoding"):
speculative decoding against a target that mixes the drafter and the full model token by token."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..draft.base import DraftBlock
from ..sampling import Sampler
from .acceptance import greedy_match, rejection_sample
from .base import Verdict
from .lossless import LosslessVerifier
from .policy import Tier


def token_deferral(p: torch.Tensor, q: torch.Tensor, alpha: float) -> torch.Tensor:
    """The paper's token-level rule: defer to q where max q - max p > alpha * TV(p, q).

    Args:
        p, q: [K, V] draft and target distributions.
    Returns:
        [K] bool, True where the full model's distribution is used.
    """
    tv = 0.5 * (p - q).abs().sum(-1)
    return q.max(-1).values - p.max(-1).values > alpha * tv


class SpeculativeCascadeVerifier(LosslessVerifier):
    """Lossless speculative decoding against pi_i = q_i if deferred else p_i (lossy w.r.t. q).

    Every block costs one full forward, as in plain SD; what changes is how many draft tokens
    survive. alpha = 0 defers wherever q is more confident than p; a large alpha never defers.
    """

    @staticmethod
    def check_settings(alpha: float = 0.5, **_) -> None:
        """The plain settings' rules (also checked before any model loads: `viasd_adapters.checks`)."""
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")

    def __init__(self, target: PreTrainedModel, alpha: float = 0.5, name: str = "target"):
        self.check_settings(alpha=alpha)
        super().__init__(target, name)
        self.alpha = alpha

    def verify(self, input_ids: torch.Tensor, draft: DraftBlock, sampler: Sampler) -> Verdict:
        K = len(draft)
        sequence = torch.cat([input_ids, draft.tokens[None]], dim=1)  # [1, T + K]
        q = sampler.probs(self.runner.logits(sequence, K + 1))  # [K + 1, V]
        p = draft.draft_probs(q.shape[-1])  # [K, V]
        defer = token_deferral(p, q[:K], self.alpha)  # [K]
        pi = torch.cat([torch.where(defer[:, None], q[:K], p), q[K:]])  # [K + 1, V]
        if sampler.config.greedy:
            outcome = greedy_match(draft.tokens, pi)
        else:
            outcome = rejection_sample(draft.tokens, p, pi, sampler)
        n = outcome.num_accepted
        tokens = torch.cat([draft.tokens[:n], draft.tokens.new_tensor([outcome.next_token])])
        # Where pi is p the drafter's distribution decided (the kept drafts, and a token recovered
        # from pi_n = p_n); the full model decided the rest, the bonus token from q_K included.
        by_draft = int((~defer[:n]).sum()) + int(n < K and not defer[n])
        counts = {"draft": by_draft, Tier.ESCALATE: n + 1 - by_draft}
        return Verdict(tokens, n, K, counts)
