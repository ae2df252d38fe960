"""The verifier interface: judge a draft block and say which tokens to commit."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from ..draft.base import DraftBlock
from ..runner import CallStats
from ..sampling import Sampler
from .policy import Tier

if TYPE_CHECKING:  # verify/tree.py imports this module: its types are named here only
    from .tree import DraftTree, TreeJudge, TreeVerdict


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

    def verify_tree(self, input_ids: torch.Tensor, tree: DraftTree, sampler: Sampler, judge: TreeJudge) -> TreeVerdict:
        """Judge a draft `tree` of N drafts (a tree host's, e.g. EAGLE's) after `input_ids`.

        Args:
            input_ids: [1, T] committed ids, the tree's root (the last committed token) included.
            tree: N drafts below the root: `tree.tokens` [N] long, `tree.parents` [N] long (-1: the
                root), `tree.probs` [N, V] or None (deterministic drafts).
            sampler: the generation's token selection.
            judge: the full target's side, the host's: one forward over its lagging tokens and the
                tree, then its lossless acceptance rule; it keeps the full model's caches.
        Returns:
            a `TreeVerdict`: `tokens` [n + 1] (the n kept drafts of one root-to-leaf path, then the
            recovered / bonus token), `path` [n] the kept drafts' indices, and `features`
            [1, n + 1, H] when the slim tier settled the round without the full model (else None).

        Tree hosts (`HostSpec.trees`) call it; a verifier that does not implement it is refused
        for them before any model loads (`compat.check`).
        """
        raise NotImplementedError(
            f"{type(self).__qualname__} does not judge draft trees (verify_tree): a tree host such as EAGLE runs"
            " LosslessVerifier or TieredVerifier; implement verify_tree to run this verifier there"
        )

    @property
    def stats(self) -> dict[str, CallStats]:
        """Forward-pass cost per model since the last reset, keyed by model name."""
        return {}
