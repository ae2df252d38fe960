"""The draft tree worth verifying on this device: from measured acceptance by depth and rank
(`decode.RankAcceptance`) and the measured costs of the drafter's and the target's forwards.

A node's value is the probability that its whole rank path is accepted, the product of the
rates along it; a round commits 1 + (the sum of its nodes' values) tokens on average. The most
valuable N nodes always form a tree (a node is worth at most its parent, and a rank at most the
better rank beside it), so for each N the best tree is those N nodes, and its cost is one target
forward over N + 1 rows plus one drafter forward per level over that level's rows. The shape kept
is the one with the most tokens per millisecond, a chain when the verify's extra rows are dear.
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..decode.stats import RankAcceptance
from .profile import LatencyProfile, draft_head_key, load_profile

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TreeShape:
    """A draft tree (eagle-llm's `tree_choices`: each node's rank path) and what it is expected to do."""

    choices: list[tuple[int, ...]]
    tokens_per_round: float  # expected tokens committed per round (1 + the nodes' values)
    ms_per_round: float  # the target's verify over N + 1 rows plus the drafter's levels
    ar_ms: float  # one target step of one row (AR's cost per token)

    @property
    def expected_speedup(self) -> float:
        return self.tokens_per_round * self.ar_ms / self.ms_per_round

    @property
    def depth(self) -> int:
        return max((len(c) for c in self.choices), default=0)

    def describe(self) -> str:
        widths = Counter(len(c) for c in self.choices)
        levels = "/".join(str(widths[d]) for d in range(1, self.depth + 1))
        kind = "chain" if all(n == 1 for n in widths.values()) else "tree"
        return (
            f"{kind} of {len(self.choices)} drafts (per level {levels}): {self.tokens_per_round:.2f} tokens a round"
            f" expected, {self.ms_per_round:.1f} ms a round, {self.expected_speedup:.2f}x AR"
        )


def most_valuable_nodes(
    acceptance: RankAcceptance, count: int, max_depth: int, max_rank: int
) -> list[tuple[tuple, float]]:
    """The `count` nodes of highest value (rank path, value), best first; depth <= max_depth, rank < max_rank."""
    # (-value, rank path, the value of its parent): a node enters when its parent or better sibling has
    frontier = [(-acceptance.rate(1, 0), (0,), 1.0)]
    chosen: list[tuple[tuple, float]] = []
    while frontier and len(chosen) < count:
        negative, path, parent_value = heapq.heappop(frontier)
        value, depth = -negative, len(path)
        chosen.append((path, value))
        if path[-1] + 1 < max_rank:
            sibling = (*path[:-1], path[-1] + 1)
            heapq.heappush(frontier, (-parent_value * acceptance.rate(depth, sibling[-1]), sibling, parent_value))
        if depth < max_depth:
            heapq.heappush(frontier, (-value * acceptance.rate(depth + 1, 0), (*path, 0), value))
    return chosen


def shape_tree(
    acceptance: RankAcceptance,
    verify_ms: Callable[[int], float],
    draft_ms: Callable[[int], float],
    max_nodes: int = 32,
    max_depth: int = 8,
    max_rank: int = 8,
) -> TreeShape:
    """The tree with the most expected tokens per millisecond.

    `verify_ms(rows)`: the target's forward over `rows` new tokens (1: an AR step); `draft_ms(rows)`:
    one drafter forward over `rows` (EAGLE's head with its LM head). Every candidate is the N most
    valuable nodes, N = 1 .. `max_nodes`.
    """
    if acceptance.rounds == 0:
        raise ValueError("no rounds measured: decode a few prompts with a tree first (RankAcceptance)")
    ar_ms = verify_ms(1)
    nodes = most_valuable_nodes(acceptance, max_nodes, max_depth, max_rank)
    best: TreeShape | None = None
    for n in range(1, len(nodes) + 1):
        chosen = nodes[:n]
        widths = Counter(len(path) for path, _ in chosen)
        # level d's drafts come from one head forward over level d - 1's nodes (the root: 1 row)
        levels = [1] + [widths[d] for d in range(1, max(widths))]
        ms = verify_ms(n + 1) + sum(draft_ms(rows) for rows in levels)
        shape = TreeShape(
            sorted((path for path, _ in chosen), key=lambda p: (len(p), p)),
            1 + sum(value for _, value in chosen),
            ms,
            ar_ms,
        )
        if best is None or shape.tokens_per_round / shape.ms_per_round > best.tokens_per_round / best.ms_per_round:
            best = shape
    assert best is not None
    return best


def profiled_shape(
    profile: LatencyProfile,
    acceptance: RankAcceptance,
    target: str,
    head_key: str,
    dtype: str,
    threads: int,
    context: int = 256,
    max_nodes: int | None = None,
) -> TreeShape:
    """`shape_tree` on `profile`'s costs: the target's verify in `dtype` and the head's tree level
    (`head_key`, `draft_head_key`). Trees verify no more rows than the profile measured (beyond them
    its costs would be extrapolated), unless `max_nodes` says otherwise."""
    measured = max(e.new_tokens for e in profile.entries_of(target, dtype, threads) if e.layers is None)
    return shape_tree(
        acceptance,
        verify_ms=lambda n: profile.ms(target, dtype, threads, n, context),
        draft_ms=lambda rows: profile.ms(head_key, dtype, threads, rows, context),
        max_nodes=max_nodes or max(1, measured - 1),
    )


def profiled_tree(
    target: str,
    head: str,
    precision: str,
    device: str = "cpu",
    profile_path: str | None = None,
    context: int = 256,
    max_nodes: int | None = None,
) -> list[list[int]]:
    """The EAGLE tree (eagle-llm's `tree_choices`) for `head` on `target` in `precision` at this
    process's threads: `shape_tree` on the head's measured acceptance and this machine's cached
    latency profile (`viasd-profile` measures the head's tree level beside the target). Trees
    verify no more rows than the profile measured, unless `max_nodes` says otherwise."""
    from ..hosts.eagle import head_acceptance, resolve_head  # EAGLE is an optional extra

    folder = resolve_head(head)
    acceptance = head_acceptance(folder)
    if acceptance is None:
        raise ValueError(
            f"the head in {folder} has no measured acceptance (recipe.json's rank_acceptance): retrain it with"
            " viasd-train-eagle, or give the tree (framework.decoder.tree)"
        )
    profile, threads, key = (
        load_profile(profile_path, device),
        torch.get_num_threads(),
        draft_head_key(target, str(folder)),
    )
    if not profile.has(key, precision, threads):
        raise KeyError(
            f"the latency profile has no tree level of the EAGLE head {folder.name} over {target} in {precision} at"
            f" {threads} thread(s): run viasd-profile model_pair=... eagle_head={head} runtime.threads={threads}"
        )
    shape = profiled_shape(profile, acceptance, target, key, precision, threads, context, max_nodes)
    logger.info("EAGLE tree from the latency profile: %s", shape.describe())
    return [list(c) for c in shape.choices]
