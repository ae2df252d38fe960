"""Draft trees: the tree form of a draft block, and the slim tier's decision on one.

A tree of N drafts hangs below the last committed token (the root of every path). A chain of K
drafts is the tree whose draft k has parent k - 1. One forward scores a tree: the drafts are fed
after the committed tokens, each at position (last committed position + its depth), attending
to the committed tokens and its own ancestors only (`DraftTree.attention`); row 0 of its logits
scores the position after the last committed token, row n + 1 the one after draft n.

Terms: N drafts, P root-to-leaf paths, D the most drafts on a path, V vocab.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from functools import cached_property

import torch
from transformers import DynamicCache

from ..models.compiled import StaticKV
from ..routing.slim import SlimModel, keep_positions
from ..runner import CausalLMRunner, common_prefix_length
from ..sampling import Sampler
from .base import Verdict
from .decision import SlimScores, TierDecision, decide
from .policy import Tier, TierPolicy


@dataclass(eq=False)
class DraftTree:
    """N draft tokens in a tree below the last committed token."""

    tokens: torch.Tensor  # [N] long: x_n
    parents: torch.Tensor  # [N] long: the draft each one follows (-1: the last committed token), parents[n] < n
    probs: torch.Tensor | None = None  # [N, V] p_n each draft was drawn from; None: deterministic (one-hot)

    def __post_init__(self) -> None:
        N = self.tokens.numel()
        assert self.parents.shape == (N,) and bool((self.parents < torch.arange(N, device=self.parents.device)).all())

    @classmethod
    def chain(cls, tokens: torch.Tensor, probs: torch.Tensor | None = None) -> DraftTree:
        """K drafts in a row ([K] long, p [K, V] or None)."""
        return cls(tokens, torch.arange(-1, tokens.numel() - 1, device=tokens.device), probs)

    def __len__(self) -> int:
        return self.tokens.numel()

    def draft_probs(self, vocab_size: int) -> torch.Tensor:
        """[N, V] p, one-hot for deterministic drafts (speculative sampling stays exact: see `decide`)."""
        if self.probs is not None:
            return self.probs
        return torch.zeros(len(self), vocab_size, device=self.tokens.device).scatter_(1, self.tokens[:, None], 1.0)

    @cached_property
    def depth(self) -> torch.Tensor:
        """[N] long: drafts on the path to each one, itself included (1 below the root)."""
        depth = [0] * len(self)
        for n, parent in enumerate(self.parents.tolist()):
            depth[n] = 1 if parent < 0 else depth[parent] + 1
        return torch.tensor(depth, dtype=torch.long, device=self.tokens.device)

    @property
    def max_depth(self) -> int:
        """D: the most drafts one path holds (what one verification can accept)."""
        return int(self.depth.max()) if len(self) else 0

    def layout(self, start: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions [n] and attention [n, n] (bool) of the committed tokens at positions [start, end)
        followed by the tree (n = end - start + N): causal over the committed ones, the tree's own
        mask below them, drafts at position end - 1 + depth."""
        L, N = end - start, len(self)
        device = self.tokens.device
        positions = torch.cat([torch.arange(start, end, device=device), end - 1 + self.depth])
        attend = torch.ones(L + N, L + N, dtype=torch.bool, device=device).tril()
        attend[L:, L:] = self.attention
        return positions, attend

    @cached_property
    def attention(self) -> torch.Tensor:
        """[N, N] bool: draft m attends to draft n (an ancestor or itself)."""
        N = len(self)
        allowed = torch.eye(N, dtype=torch.bool, device=self.tokens.device)
        for n, parent in enumerate(self.parents.tolist()):
            if parent >= 0:
                allowed[n] |= allowed[parent]
        return allowed

    @cached_property
    def paths(self) -> list[torch.Tensor]:
        """The P root-to-leaf paths, leaves in draft order: each [length] long draft indices."""
        leaves = torch.ones(len(self), dtype=torch.bool)
        leaves[self.parents[self.parents >= 0].cpu()] = False
        return [self.attention[leaf].nonzero()[:, 0] for leaf in leaves.nonzero()[:, 0].tolist()]


@dataclass
class TreeDecision:
    """The slim tier's decision on a tree: `decide`'s on one root-to-leaf path."""

    path: torch.Tensor  # [length] long: the drafts of the path followed, in order
    decision: TierDecision  # the tier, the path's drafts kept (its first `num_accepted`), u's token after them


def choose_path(policy: TierPolicy, tree: DraftTree, u: SlimScores, greedy: bool, room: int) -> torch.Tensor:
    """The path the slim tier follows, a function of the tree and u alone (never of a random draw).

    Greedy: the longest tier-1 (ACCEPT) prefix within `room` (the first such path on ties).
    Sampling: the most drafts u is expected to accept, sum over depths d of the product of
    u(x_1) ... u(x_d) along the path, counting only positions the policy lets u settle. Choosing
    the path before any draw keeps the drafts' fate a plain speculative-sampling test against u.

    Args:
        u: N + 1 rows, as a tree's forward scores them (row n + 1: after draft n).
    """
    rows = tree.parents + 1  # [N]: u's row at each draft's parent
    u_raw = u.raw[rows]  # [N, V]
    p = tree.draft_probs(u_raw.shape[-1])
    if greedy:
        gain = (policy.assign(tree.tokens, p, u_raw) == Tier.ACCEPT.code).float()  # [N]
    else:
        gain = policy.settles(p, u_raw).float() * u.probs[rows, tree.tokens]  # [N]: P(u accepts the draft)
    best, best_score = tree.paths[0], -1.0
    for path in tree.paths:
        score = float(gain[path[: max(room, 0)]].cumprod(0).sum())  # greedy: the tier-1 prefix length
        if score > best_score:
            best, best_score = path, score
    return best


def decide_tree(policy: TierPolicy, tree: DraftTree, u: SlimScores, sampler: Sampler, room: int) -> TreeDecision:
    """The slim tier's decision on a tree from u at its N + 1 rows: the path first (`choose_path`),
    then `decide` settles its drafts as for a chain (u at each draft's parent, then after the path)."""
    path = choose_path(policy, tree, u, sampler.config.greedy, room)
    rows = torch.cat([path.new_zeros(1), path + 1])  # the root's row, then each draft's
    p = tree.draft_probs(u.logits.shape[-1])[path]
    return TreeDecision(path, decide(policy, tree.tokens[path], p, u[rows], sampler, room))


@dataclass
class TreeAcceptance:
    """What the full model's lossless judge keeps of a tree."""

    path: torch.Tensor  # [n] long: the drafts kept unchanged, a path from the root
    next_token: int  # the recovered token, or the bonus after a path kept whole


class TreeJudge(ABC):
    """The full target's side of a tree: one forward over its lagging tokens and the tree, then a
    lossless acceptance rule over the tree. A host supplies it with the tree it drafted (EAGLE:
    eagle-llm's forward and `evaluate_posterior`), and keeps the full model's caches itself."""

    @property
    @abstractmethod
    def cached_length(self) -> int:
        """Committed tokens the full model has read (the lag is measured from it)."""

    @abstractmethod
    def judge(self, input_ids: torch.Tensor, tree: DraftTree, sampler: Sampler) -> TreeAcceptance:
        """Judge `tree` after `input_ids` ([1, T], committed; the full model holds `cached_length`)."""


@dataclass
class TreeVerdict(Verdict):
    """A `Verdict` on a tree: which drafts were kept, and u's features when the slim tier settled it."""

    path: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.long))  # [n] the kept drafts
    # [1, n + 1, H] u's final normed hidden states at the last committed token and the n kept
    # drafts (what a feature-reading drafter such as EAGLE's head reads); None: the full model judged.
    features: torch.Tensor | None = None


def judged(acceptance: TreeAcceptance, tree: DraftTree) -> TreeVerdict:
    """The verdict of the full model's acceptance: every token it commits counted as its own."""
    n = acceptance.path.numel()
    tokens = torch.cat([tree.tokens[acceptance.path], tree.tokens.new_tensor([acceptance.next_token])])
    return TreeVerdict(tokens, n, tree.max_depth, {Tier.ESCALATE: n + 1}, Tier.ESCALATE, acceptance.path)


# ----------------------------------------------------------------------------- a routed view over a tree
@torch.no_grad()
def score_tree(runner: CausalLMRunner, input_ids: torch.Tensor, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of `runner`'s routed view over its lagging tokens and `tree`, after `input_ids` ([1, T]).

    Returns logits [N + 1, V] and final normed hidden states [1, N + 1, H] at the last committed
    token and the N drafts. The cache then holds the tree too: `keep_path` settles it.
    """
    model = runner.model
    assert isinstance(model, SlimModel), "a tree forward runs a routed view of the target (SlimModel)"
    ids = input_ids[0]
    T = ids.numel()
    runner.crop(min(common_prefix_length(runner.cached_ids, ids), T - 1))
    start = runner.cached_length
    new = torch.cat([ids[start:], tree.tokens.to(ids.device)])  # [T - start + N]
    begin = time.perf_counter()
    positions, attend = tree.layout(start, T)  # [n], [n, n]
    if runner.step is not None:  # the compiled step: the tree is a mask over the cached positions too
        assert isinstance(runner.cache, StaticKV)  # `CausalLMRunner.reset` gives a compiled step its buffers
        mask = torch.cat([attend.new_ones(len(new), start), attend], dim=1)  # [n, start + n]
        features = runner.step(new, runner.cache, mask=mask, positions=positions)[None, -(len(tree) + 1) :]
    else:
        assert isinstance(runner.cache, DynamicCache)  # ... and the eager forward transformers' cache
        state = model.run_layers(model.embed(new[None], start), runner.cache, tree=(positions, attend))
        features = model.normed(state, len(tree) + 1)  # [1, N + 1, H]
    logits = model.logits(features)[0]  # [N + 1, V]
    runner.stats.add(new.numel(), time.perf_counter() - begin)
    runner.cached_ids = ids.clone()  # and the tree after them, until `keep_path`
    return logits, features


def keep_path(runner: CausalLMRunner, input_ids: torch.Tensor, tree: DraftTree, path: torch.Tensor) -> None:
    """After `score_tree`: the runner's cache keeps the committed tokens and the drafts of `path`."""
    T = input_ids.shape[1]
    keep_positions(runner.cache, T, T + path)
    runner.cached_ids = torch.cat([input_ids[0], tree.tokens[path].to(input_ids.device)])
