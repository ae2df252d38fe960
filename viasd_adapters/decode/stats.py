"""Counters of one generation and the figures derived from them."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from ..runner import CallStats
from .schedule import acceptance_from_rounds


@dataclass
class DecodeStats:
    """Everything one generation did, for the stats line and the benchmark records."""

    new_tokens: int = 0  # tokens generated (after truncation at a stop token / the budget)
    seconds: float = 0.0  # wall time of the whole decoding loop
    steps: int = 0  # verification rounds (AR: one per token)
    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens committed unchanged
    rejections: int = 0  # rounds that ended on a draft token not committed unchanged
    tier_counts: Counter = field(default_factory=Counter)  # draft tokens decided per tier
    settled: int = 0  # verification rounds the slim tier settled, no forward of the full model
    model_calls: dict[str, CallStats] = field(default_factory=dict)  # cost per model
    tree_ranks: RankAcceptance | None = None  # tree drafters: acceptance by depth and rank

    def add_round(self, drafted: int, accepted: int, tier_counts: Mapping[str, int], settled: bool = False) -> None:
        """Count one verification round: `drafted` draft tokens judged, the first `accepted` of them
        kept, the committed tokens per tier, and whether the slim tier `settled` it (the full model
        chose none of its tokens). Every host loop counts its rounds here, so records mean the same."""
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self.rejections += accepted < drafted
        self.tier_counts.update(tier_counts)
        self.settled += settled

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per verification round (accepted drafts + the verifier's token)."""
        return self.new_tokens / self.steps if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted draft tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def per_token_acceptance(self) -> float:
        """Maximum-likelihood per-token acceptance a (`schedule.acceptance_from_rounds`): the `a`
        of Leviathan's speedup, which the automatic choice assumes for a pair."""
        return acceptance_from_rounds(self.accepted, self.rejections)

    @property
    def rejection_rate(self) -> float:
        """Draft tokens not committed unchanged / drafted (1 - acceptance rate)."""
        return 1.0 - self.acceptance_rate if self.drafted else 0.0

    def summary(self) -> str:
        calls = ", ".join(f"{name} {c.calls}" for name, c in self.model_calls.items())
        return (
            f"new tokens {self.new_tokens} | {self.tokens_per_second:.2f} tok/s"
            f" | mean accepted length {self.mean_accepted_length:.2f}"
            f" | acceptance rate {self.acceptance_rate:.3f}"
            f" | forward calls: {calls}"
        )

    def to_dict(self) -> dict:
        record = asdict(self)
        record["tier_counts"] = dict(self.tier_counts)
        record["tree_ranks"] = self.tree_ranks.to_dict() if self.tree_ranks is not None else None
        for name in (
            "tokens_per_second",
            "mean_accepted_length",
            "acceptance_rate",
            "per_token_acceptance",
            "rejection_rate",
        ):
            record[name] = getattr(self, name)
        return record


@dataclass
class RankAcceptance:
    """How often the target's token was a tree drafter's rank-r guess at depth d, given the path
    above it was accepted: what shapes a draft tree (`costs.tree.shape_tree`).

    A tree is given by its nodes' rank paths (eagle-llm's `tree_choices`: (0,) the head's top guess
    below the root, (0, 1) the second guess below that). Each round, every node whose parent was
    accepted was on offer; the accepted path's nodes were taken. The rate of (d, r) is unbiased
    whatever the tree, since a node's presence does not change what the target chooses.
    """

    offered: Counter = field(default_factory=Counter)  # (depth, rank) -> rounds the node was on offer
    taken: Counter = field(default_factory=Counter)  # (depth, rank) -> rounds it was accepted

    def add_round(self, choices: list[tuple[int, ...]], accepted: tuple[int, ...]) -> None:
        """One round on the tree `choices`, whose accepted path ends at the node `accepted` (() : none)."""
        for depth in range(len(accepted) + 1):
            parent = tuple(accepted[:depth])
            for choice in choices:
                if len(choice) == depth + 1 and tuple(choice[:depth]) == parent:
                    self.offered[depth + 1, choice[-1]] += 1
            if depth < len(accepted):
                self.taken[depth + 1, accepted[depth]] += 1

    def update(self, other: RankAcceptance) -> None:
        self.offered.update(other.offered)
        self.taken.update(other.taken)

    def rate(self, depth: int, rank: int, prior: int = 2) -> float:
        """Accepted / offered, shrunk towards the nearest shallower or better-ranked rate measured
        (`prior` pseudo-rounds of it), so a node seldom on offer is not judged on a handful of rounds."""
        if depth > 1:
            fallback = self.rate(depth - 1, rank, prior)
        elif rank > 0:
            fallback = self.rate(depth, rank - 1, prior) / 2
        else:
            fallback = 0.5
        n = self.offered[depth, rank]
        return (self.taken[depth, rank] + prior * fallback) / (n + prior)

    @property
    def rounds(self) -> int:
        return self.offered[1, 0]

    def to_dict(self) -> dict:
        return {"offered": _keyed(self.offered), "taken": _keyed(self.taken)}

    @classmethod
    def from_dict(cls, record: Mapping) -> RankAcceptance:
        def counter(rows) -> Counter:
            return Counter({(int(d), int(r)): int(n) for d, r, n in rows})

        return cls(counter(record["offered"]), counter(record["taken"]))


def _keyed(counts: Counter) -> list[list[int]]:
    """JSON's form of a (depth, rank) counter: [[depth, rank, count], ...], sorted."""
    return [[d, r, n] for (d, r), n in sorted(counts.items())]
