"""What the engine needs from a draft side and a target side, and the messages its workers pass.

Glossary: T committed sequence length, K draft tokens judged in one round, V vocabulary,
gamma (`window_size`) tokens the drafter drafts per drafting phase.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch


@runtime_checkable
class Proposer(Protocol):
    """The draft side. It runs inside the draft worker, so it must pickle for the process backend."""

    @property
    def vocab_size(self) -> int:
        """V of the distributions `propose` returns."""

    def reset(self, settings: Any) -> None:
        """Start a generation: forget caches and statistics. `settings` is opaque to the engine
        (the adapter passes its sampling config)."""

    def propose(self, ids: torch.Tensor, seed: int) -> tuple[int, torch.Tensor | None] | None:
        """One draft token after `ids` ([1, T]) and the [V] distribution it was drawn from
        (None for a deterministic drafter), or None when the drafter has nothing to propose.

        `seed` is a pure function of the generation seed and the token's position: a drafter
        that samples must draw with it, so sampled outputs do not depend on thread timing.
        """

    def stats(self) -> dict[str, Any]:
        """Cost per model since the last reset (the adapter returns `CallStats` per model)."""


@dataclass
class Judgement:
    """What the target side commits for one block of drafts."""

    tokens: torch.Tensor  # [m] long: kept drafts, then the judge's own token if it adds one
    num_accepted: int  # n: leading drafts kept unchanged, n <= K
    num_drafted: int  # K: drafts judged
    counts: dict[str, int] = field(default_factory=dict)  # drafts decided per tier ("full", ...)
    next_token_tier: str = "full"  # who chose tokens[K] (the recovered or bonus token)


class Judge(Protocol):
    """The target side. It runs in the calling process while the drafter drafts."""

    def judge(self, ids: torch.Tensor, tokens: torch.Tensor, probs: torch.Tensor | None) -> Judgement:
        """Judge drafts `tokens` ([K] long, K >= 0) after the committed `ids` ([1, T]).

        `probs` is [K, V], the draft distributions (None: deterministic drafts). K == 0 asks
        for the target's own next token: pre-verify's check of the first draft.
        """


def position_seed(seed: int, position: int) -> int:
    """A 63-bit seed for the draft token at absolute `position` (SplitMix64 of both)."""
    mask = (1 << 64) - 1
    z = (seed * 0x9E3779B97F4A7C15 + position + 0x632BE59BD9B4E019) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return (z ^ (z >> 31)) >> 1


# Messages between the engine (E) and its draft worker (W). Every request gets its replies in
# order; drafts are tagged with the round that asked for them so stale ones can be dropped.


@dataclass(frozen=True)
class Ready:  # W -> E: the proposer is loaded and the worker waits for requests
    pass


@dataclass(frozen=True)
class ResetRequest:  # E -> W: a generation starts
    settings: Any


@dataclass(frozen=True)
class DraftRequest:  # E -> W: draft up to `num_tokens` tokens after `prefix`
    round_id: int
    prefix: torch.Tensor  # [T] long: committed tokens, then the drafts not yet judged
    num_tokens: int  # gamma, or fewer near the end of the budget
    seed: int  # the generation seed


@dataclass(frozen=True)
class DraftToken:  # W -> E: one draft token, as soon as it exists
    round_id: int
    index: int  # 0-based position within its round
    token: int
    probs: torch.Tensor | None  # [V] (thread backend), or None: see `slot`
    slot: int | None  # row of the shared probs ring holding [V] (process backend)


@dataclass(frozen=True)
class DraftEnd:  # W -> E: a round produced all it will (done, cancelled, or dry)
    round_id: int
    num_tokens: int


@dataclass(frozen=True)
class StatsRequest:  # E -> W
    pass


@dataclass(frozen=True)
class StatsReply:  # W -> E
    stats: dict[str, Any]


@dataclass(frozen=True)
class Stop:  # E -> W: exit the loop
    pass


@dataclass(frozen=True)
class Failed:  # W -> E: the proposer raised; the worker exits after sending this
    kind: str  # exception type name
    error: str  # the formatted traceback
