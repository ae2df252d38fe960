"""The standard lossless verifier: one target forward over the block, then greedy match or
rejection sampling."""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from ..draft.base import DraftBlock
from ..runner import CallStats, CausalLMRunner
from ..sampling import Sampler
from .acceptance import lossless_accept
from .base import Verdict, Verifier
from .policy import Tier
from .tree import DraftTree, TreeJudge, TreeVerdict, judged


class LosslessVerifier(Verifier):
    """Plain speculative-decoding verification by the full target q."""

    def __init__(self, target: PreTrainedModel, name: str = "target"):
        self.name = name
        self.runner = CausalLMRunner(target, name)

    @property
    def vocab_size(self) -> int:
        return self.runner.vocab_size

    @property
    def context_length(self) -> int:
        return self.runner.context_length

    def reset(self) -> None:
        self.runner.reset()

    @property
    def stats(self) -> dict[str, CallStats]:
        return {self.name: self.runner.stats}

    def verify(self, input_ids: torch.Tensor, draft: DraftBlock, sampler: Sampler) -> Verdict:
        K = len(draft)
        sequence = torch.cat([input_ids, draft.tokens[None]], dim=1)  # [1, T + K]
        logits = self.runner.logits(sequence, K + 1)  # [K + 1, V]
        outcome = lossless_accept(draft.tokens, draft.draft_probs(self.vocab_size), logits, sampler)
        n = outcome.num_accepted
        tokens = torch.cat([draft.tokens[:n], draft.tokens.new_tensor([outcome.next_token])])
        return Verdict(tokens, n, K, {Tier.ESCALATE: n + 1})

    def verify_tree(self, input_ids: torch.Tensor, tree: DraftTree, sampler: Sampler, judge: TreeJudge) -> TreeVerdict:
        """A draft tree, judged by its host's lossless rule (`judge`) alone."""
        return judged(judge.judge(input_ids, tree, sampler), tree)
