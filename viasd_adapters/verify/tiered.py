"""VIA-SD's three-tier verifier: accept, slim rewrite, or escalate to the full target."""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from transformers import PreTrainedModel

from ..draft.base import DraftBlock
from ..routing.shared_prefix import SharedPrefixRunner
from ..runner import CallStats, CausalLMRunner, common_prefix_length
from ..sampling import Sampler
from .acceptance import lossless_accept
from .base import Verdict, Verifier
from .policy import Tier, TierPolicy

SlimFactory = Callable[[PreTrainedModel], nn.Module]


class TieredVerifier(Verifier):
    """Composes a slim verifier u and the full target q behind the `Verifier` interface.

    Per block: one slim forward scores all K draft tokens; the policy assigns tiers; the
    first non-ACCEPT token decides the block:
      1. ACCEPT tokens are kept without the full model;
      2. SLIM: u's token replaces the draft token and the block ends;
      3. ESCALATE: one full forward catches up on every token committed without it (its
         cache lags) together with the block, then the lossless rule judges the block.
    With `policy=None` no slim forward runs and this is exactly `LosslessVerifier`.

    With `share_prefix` and a routed slim view, the decoder layers [0, p) the two share run once,
    in the slim forward, and an escalation runs only the target's layers [p, L) and LM head over
    the stored layer-p states (`SharedPrefixRunner`): (L - p) / L of a full forward's layer work.
    """

    def __init__(
        self,
        target: PreTrainedModel,
        slim: nn.Module | SlimFactory | None = None,
        policy: TierPolicy | None = None,
        max_unverified: int = 16,
        rejudge: bool = True,
        share_prefix: bool = False,
    ):
        """
        Args:
            target: the full model q.
            slim: the slim verifier u (any model a `CausalLMRunner` can run), or a callable
                that builds it from the target (a routed view of its layers, usually).
            policy: assigns tiers; None switches tiers 1-2 off.
            max_unverified: most tokens committed in a row without the full model seeing them;
                past it the full model verifies, which bounds drift.
            rejudge: when the full model runs, it also judges the tokens tier 1 accepted
                earlier in the same block (free: they are in its forward anyway).
            share_prefix: escalations reuse the slim forward's layers [0, p) (p: the first layer
                the mask touches) instead of running the target from layer 0. Needs `slim` to
                be a `SlimModel` view of `target`; no effect without a policy or when p = 0.
        """
        if policy is not None and slim is None:
            raise ValueError("a tier policy needs a slim verifier: set `slim`")
        if max_unverified < 0:
            raise ValueError(f"max_unverified must be >= 0, got {max_unverified}")
        self.target = CausalLMRunner(target, "target")
        self.slim = None
        self.shared = None  # the SharedPrefixRunner behind `target` and `slim` when they share layers
        if policy is not None:
            slim_model = slim if isinstance(slim, nn.Module) else slim(target)
            if share_prefix:
                shared = SharedPrefixRunner(target, slim_model)
                if shared.num_prefix_layers > 0:  # p = 0 shares nothing: keep the plain runners
                    self.shared = shared
                    self.target, self.slim = shared.target, shared.slim
            if self.slim is None:
                self.slim = CausalLMRunner(slim_model, "slim")
            if self.slim.vocab_size != self.target.vocab_size:
                raise ValueError(
                    f"the slim verifier's vocabulary ({self.slim.vocab_size}) differs from the"
                    f" target's ({self.target.vocab_size}): use a model of the target's tokenizer"
                )
        self.policy = policy
        self.max_unverified = max_unverified
        self.rejudge = rejudge

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    @property
    def context_length(self) -> int:
        return self.target.context_length

    def reset(self) -> None:
        if self.shared is not None:
            self.shared.reset()
            return
        self.target.reset()
        if self.slim is not None:
            self.slim.reset()

    @property
    def stats(self) -> dict[str, CallStats]:
        runners = [self.target] + ([self.slim] if self.slim is not None else [])
        return {r.name: r.stats for r in runners}

    def unverified_length(self, input_ids: torch.Tensor) -> int:
        """Committed tokens the full model has not seen (the last one never is: it is fed next)."""
        return input_ids.shape[1] - 1 - common_prefix_length(self.target.cached_ids, input_ids[0])

    def verify(self, input_ids: torch.Tensor, draft: DraftBlock, sampler: Sampler) -> Verdict:
        K = len(draft)
        p = draft.draft_probs(self.vocab_size)  # [K, V]
        sequence = torch.cat([input_ids, draft.tokens[None]], dim=1)  # [1, T + K]
        if self.policy is None or K == 0:
            return self._escalate(sequence, draft, p, sampler, start=0)

        # 1. slim verify: one forward over the block
        u_logits = self.slim.logits(sequence, K + 1)  # [K + 1, V]
        u = sampler.probs(u_logits)  # [K + 1, V]
        tiers = self.policy.assign(draft.tokens, p, u[:K])  # [K]
        # Tokens past the drift cap go to the full model whatever the policy says.
        room = self.max_unverified - self.unverified_length(input_ids)
        tiers[max(room, 0) :] = int(Tier.ESCALATE)
        undecided = (tiers != int(Tier.ACCEPT)).nonzero()
        i = int(undecided[0]) if undecided.numel() else K  # first token not accepted by tier 1

        if i == K:  # 2a. tier 1 kept the whole block; u's next token is free when confident
            tokens = draft.tokens
            if room > K and self.policy.accepts_bonus(u[K]):
                tokens = torch.cat([tokens, tokens.new_tensor([sampler.choose_from(u[K], u_logits[K])])])
            return Verdict(tokens, K, K, {"accept": K})
        if tiers[i] == int(Tier.SLIM):  # 2b. slim rewrite: the block ends at u's token
            token = sampler.choose_from(u[i], u_logits[i])
            tokens = torch.cat([draft.tokens[:i], draft.tokens.new_tensor([token])])
            return Verdict(tokens, i, K, {"accept": i, "slim": 1})
        # 3. escalate
        start = 0 if self.rejudge else i
        return self._escalate(sequence, draft, p, sampler, start)

    def _escalate(self, sequence, draft, p, sampler, start: int) -> Verdict:
        """The full model judges draft tokens start..K-1 (tokens before `start` stay accepted)."""
        K = len(draft)
        logits = self.target.logits(sequence, K + 1 - start)  # [K + 1 - start, V]
        outcome = lossless_accept(draft.tokens[start:], p[start:], logits, sampler)
        n = start + outcome.num_accepted
        tokens = torch.cat([draft.tokens[:n], draft.tokens.new_tensor([outcome.next_token])])
        counts = {"full": min(outcome.num_accepted + 1, K - start)}
        if start:
            counts["accept"] = start
        return Verdict(tokens, n, K, counts)
