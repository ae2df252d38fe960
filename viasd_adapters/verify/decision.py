"""One tier decision for chains and trees: what the slim verifier u settles in a block of drafts.

`decide` is the only place where tiers become tokens. `TieredVerifier` calls it once per block,
and once per draft tree on the root-to-leaf path u follows (`verify/tree.py`, `decide_tree`).

Greedy: the policy's tiers (`TierPolicy.assign`); the first non-ACCEPT draft decides the block.
Sampling: speculative sampling against u (Leviathan et al. 2023, with u in q's place) on the
positions the policy lets u settle (`TierPolicy.settles`): accept x_i with probability
min(1, u_i(x_i) / p_i(x_i)), on rejection draw u's token from norm(max(0, u_i - p_i)). Whether u
settles a position depends on distributions only, never on the sampled draft, so each token the
slim tier commits is distributed exactly as u_i and each one the full model commits exactly as
q_i: with u = q the output is distributed as the target's. Thresholds read u's raw distribution
(softmax at temperature 1), tokens are drawn from the sampler's (tempered, top-k / top-p).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..sampling import Sampler
from .acceptance import speculative_prefix
from .policy import Tier, TierPolicy


@dataclass
class SlimScores:
    """The slim verifier's view of M positions, in the three forms the decision reads."""

    logits: torch.Tensor  # [M, V] u's logits (greedy picks their argmax)
    probs: torch.Tensor  # [M, V] the distribution tokens are drawn from (the sampler's settings)
    raw: torch.Tensor  # [M, V] softmax(logits): what the policy's thresholds compare with

    @classmethod
    def of(cls, logits: torch.Tensor, sampler: Sampler) -> SlimScores:
        """Scores of u's [M, V] logits under `sampler`'s settings."""
        raw = torch.softmax(logits.float(), dim=-1)
        return cls(logits, raw if sampler.config.greedy else sampler.probs(logits), raw)

    def __getitem__(self, rows) -> SlimScores:
        return SlimScores(self.logits[rows], self.probs[rows], self.raw[rows])


@dataclass
class TierDecision:
    """What the slim tier does with one block of K drafts."""

    # ACCEPT: tier 1 keeps all K drafts; SLIM: u's token replaces draft `num_accepted` (the block
    # ends); ESCALATE: the full model judges the drafts from `num_accepted` on.
    tier: Tier
    num_accepted: int  # n: leading drafts the slim tier keeps, 0 <= n <= K
    # u's token after the n kept drafts: the rewrite (SLIM) or the bonus after a block kept whole
    # (ACCEPT, when u is confident there); None: u adds no token.
    token: int | None = None

    @property
    def last_tier(self) -> Tier:
        """The tier that chose the last committed token (SLIM for u's own tokens, bonus included)."""
        return Tier.SLIM if self.token is not None else self.tier

    def counts(self) -> dict[str, int]:
        """Committed tokens per tier (`Verdict.tier_counts`): the n kept drafts, then u's token. Not for ESCALATE."""
        assert self.tier != Tier.ESCALATE, "the full model's verdict counts an escalated block"
        counts: dict[str, int] = {Tier.ACCEPT: self.num_accepted} if self.num_accepted else {}
        if self.token is not None:
            counts[Tier.SLIM] = 1
        return counts


def decide(
    policy: TierPolicy,
    draft_tokens: torch.Tensor,
    p: torch.Tensor,
    u: SlimScores,
    sampler: Sampler,
    room: int,
) -> TierDecision:
    """The slim tier's decision on one block (a chain of drafts, or one path of a tree).

    Args:
        policy: where u may decide.
        draft_tokens: [K] long, x_i.
        p: [K, V] draft distributions (one-hot for deterministic drafters and EAGLE's tree).
        u: K + 1 positions: row i scores the position of x_i, row K the one after the block.
        sampler: greedy or sampling, and the generator of the generation.
        room: `max_unverified` minus the committed tokens the full model already lags behind
            (the last committed token, fed next, not counted). Committing through position i
            without the full model adds i + 1 to that lag, so positions >= room go to the full
            model: after any commit the lag is at most `max_unverified`.
    """
    K = draft_tokens.numel()
    room = max(room, 0)
    if sampler.config.greedy:
        tiers = policy.assign(draft_tokens, p, u.raw[:K])  # [K]
        tiers[room:] = Tier.ESCALATE.code
        undecided = (tiers != Tier.ACCEPT.code).nonzero()
        n = int(undecided[0]) if undecided.numel() else K
        if n == K:  # tier 1 kept the whole block; u's next token is free when confident
            bonus = room > K and policy.accepts_bonus(u.raw[K])
            return TierDecision(Tier.ACCEPT, K, sampler.choose_from(u.probs[K], u.logits[K]) if bonus else None)
        if tiers[n] == Tier.SLIM.code:
            return TierDecision(Tier.SLIM, n, sampler.choose_from(u.probs[n], u.logits[n]))
        return TierDecision(Tier.ESCALATE, n)

    # Sampling: u settles the positions before the first one the policy (or the cap) refuses.
    settled = torch.cat([policy.settles(p, u.raw[:K]), policy.settles(None, u.raw[K:])])  # [K + 1]
    settled[room:] = False
    refused = (~settled).nonzero()
    f = int(refused[0]) if refused.numel() else K + 1
    m = min(f, K)
    n, recovered = speculative_prefix(draft_tokens[:m], p[:m], u.probs[:m], sampler)
    if recovered is not None:
        return TierDecision(Tier.SLIM, n, recovered)
    if f < K:  # the full model judges x_f (its own draw: u's test of x_f never ran)
        return TierDecision(Tier.ESCALATE, f)
    return TierDecision(Tier.ACCEPT, K, sampler.draw(u.probs[K]) if f > K else None)
