"""How many tokens to draft per round: Leviathan et al.'s expected speedup and the schedules
that use it.

With per-token acceptance `a` (each draft token is kept with probability a, independently), a
round that drafts K tokens commits on average (1 - a^(K+1)) / (1 - a) tokens (the kept drafts
plus the verifier's own token) and costs K draft steps and one (K+1)-token verify. In units of
one single-token target step, with c = draft step / target step and v(K+1) = (K+1)-token verify
/ target step, the speedup over autoregressive decoding is (Leviathan et al. 2023, eq. 1):

    S(a, K) = (1 - a^(K+1)) / ((1 - a) (K c + v(K+1)))

c and v come from the device's latency profile (`viasd_adapters.costs` builds these schedules
from it: `costs.adaptive_draft_length`), a from the rounds already decoded. None of it changes
which tokens a lossless verifier commits, only how fast.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

# The per-token acceptance assumed for a pair whose config states none (a model pair's `acceptance`).
ASSUMED_ACCEPTANCE = 0.6


def expected_tokens_per_round(a: float, k: int) -> float:
    """Mean tokens one round commits: kept drafts + the verifier's token, 1 + a + ... + a^K."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {a}")
    if a == 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


@dataclass(frozen=True)
class DraftCosts:
    """A draft/target pair's costs in units of one single-token target forward.

    From a latency profile (`costs.LatencyProfile.draft_costs`) or measured by hand.
    """

    draft_step: float  # c: one single-token draft forward / one single-token target forward
    verify: tuple[float, ...]  # v(n) for n = 1, 2, ...: an n-token target forward / a 1-token one (v(1) = 1)

    def __post_init__(self) -> None:
        if self.draft_step < 0:
            raise ValueError(f"draft_step must be >= 0, got {self.draft_step}")
        if not self.verify or any(x <= 0 for x in self.verify):
            raise ValueError(f"verify costs must be a non-empty list of positive numbers, got {self.verify}")
        object.__setattr__(self, "verify", tuple(float(x) for x in self.verify))

    def verify_cost(self, n: int) -> float:
        """v(n); beyond the table, extended linearly by its last step."""
        assert n >= 1
        if n <= len(self.verify):
            return self.verify[n - 1]
        last = self.verify[-1]
        step = last - self.verify[-2] if len(self.verify) > 1 else last
        return last + max(step, 0.0) * (n - len(self.verify))


def expected_speedup(a: float, k: int, costs: DraftCosts) -> float:
    """S(a, K) over autoregressive decoding (see the module docstring); K = 0 is AR itself (1.0
    when v(1) = 1)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    return expected_tokens_per_round(a, k) / (k * costs.draft_step + costs.verify_cost(k + 1))


def best_draft_length(a: float, costs: DraftCosts, k_max: int, k_min: int = 1) -> int:
    """The K in [k_min, k_max] with the largest expected speedup (the smallest K on ties)."""
    if not 0 <= k_min <= k_max:
        raise ValueError(f"need 0 <= k_min <= k_max, got k_min={k_min}, k_max={k_max}")
    return max(range(k_min, k_max + 1), key=lambda k: (expected_speedup(a, k, costs), -k))


def acceptance_from_rounds(accepted: int, rejections: int) -> float:
    """Maximum-likelihood per-token acceptance from rounds of a truncated geometric process:
    every kept draft is a success, every round that ended on a rejected draft one failure
    (rounds whose drafts were all kept end without a failure)."""
    total = accepted + rejections
    return accepted / total if total else 0.0


class DraftLength(ABC):
    """Chooses K, the tokens to draft in the next round; told what each round kept."""

    @abstractmethod
    def reset(self) -> None:
        """Start a new generation."""

    @abstractmethod
    def next(self) -> int:
        """K for the next round (>= 0)."""

    def update(self, drafted: int, accepted: int) -> None:  # noqa: B027 (a fixed K ignores outcomes)
        """A round judged `drafted` draft tokens and kept the first `accepted` of them."""


class FixedDraftLength(DraftLength):
    """The same K every round."""

    def __init__(self, k: int = 5):
        if k < 1:
            raise ValueError(f"num_draft_tokens must be >= 1, got {k}")
        self.k = k

    def reset(self) -> None:
        pass

    def next(self) -> int:
        return self.k


class AdaptiveDraftLength(DraftLength):
    """K = argmax S(a, K) with `a` estimated from the last `window` rounds of this generation.

    The estimate starts from `prior_acceptance`, worth `prior_rounds` rejected rounds, so the
    first rounds of a generation draft what the pair usually accepts and a few bad rounds do not
    collapse K to `k_min` for good. With `k_min = 0` a round may draft nothing (an AR step), which
    tells nothing about a: each such round drops the oldest round of the window instead, so after
    at most `window` AR steps the estimate is the prior again and drafting is tried anew. `costs`
    may be a function of the torch thread count, read at the start of each generation (a benchmark
    runs methods at different thread counts).
    """

    def __init__(
        self,
        costs: DraftCosts | Callable[[int], DraftCosts],
        k_max: int = 8,
        k_min: int = 1,
        prior_acceptance: float = ASSUMED_ACCEPTANCE,
        prior_rounds: float = 2.0,
        window: int = 8,
    ):
        if not 0.0 <= prior_acceptance < 1.0:
            raise ValueError(f"prior_acceptance must be in [0, 1), got {prior_acceptance}")
        if prior_rounds < 0 or window < 1:
            raise ValueError(f"need prior_rounds >= 0 and window >= 1, got {prior_rounds}, {window}")
        if not 0 <= k_min <= k_max:
            raise ValueError(f"need 0 <= k_min <= k_max, got k_min={k_min}, k_max={k_max}")
        self._costs = costs
        self.k_max = k_max
        self.k_min = k_min
        self.prior_acceptance = prior_acceptance
        self.prior_rounds = prior_rounds
        self.window = window
        self.reset()

    def reset(self) -> None:
        self.costs = self._costs if isinstance(self._costs, DraftCosts) else self._costs(torch.get_num_threads())
        self.recent: deque[tuple[int, int]] = deque(maxlen=self.window)  # (accepted, rejected 0/1) per round

    @property
    def acceptance(self) -> float:
        """The current estimate of a."""
        a0, w = self.prior_acceptance, self.prior_rounds
        accepted = w * a0 / (1.0 - a0) + sum(n for n, _ in self.recent)
        rejections = w + sum(r for _, r in self.recent)
        return accepted / (accepted + rejections) if accepted + rejections else a0

    def next(self) -> int:
        return best_draft_length(self.acceptance, self.costs, self.k_max, self.k_min)

    def update(self, drafted: int, accepted: int) -> None:
        if drafted:
            self.recent.append((accepted, int(accepted < drafted)))
        elif self.recent:  # without it, K = 0 would learn nothing and stay 0 to the end
            self.recent.popleft()
