"""Measured cost of the slim verifier against the full target: one decode step and one K-token
verify after a fixed context, interleaved (absolute times swing on shared hosts; ratios of
interleaved medians are what to compare)."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from ..routing import RoutingMask, SlimModel
from ..runner import CausalLMRunner


@dataclass
class CostRatio:
    """Median wall times of one forward of `new_tokens` tokens after `context` cached tokens."""

    new_tokens: int  # tokens fed per forward (1: a decode step; K: a verify)
    context: int  # tokens already cached
    full_ms: float  # median over repetitions
    slim_ms: float
    ratio: float  # median of the per-repetition slim / full ratios
    repetitions: int

    def to_dict(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def measure_cost_ratio(target: PreTrainedModel, mask: RoutingMask, context_ids: torch.Tensor, new_tokens: int,
                       repetitions: int = 15, warmup: int = 2) -> CostRatio:
    """Time slim and full forwards of `new_tokens` tokens after `context_ids` ([1, C]), interleaved.

    Each repetition rolls both caches back to the context (the runners crop) and feeds the same
    tokens; the order of slim and full alternates between repetitions.
    """
    B, C = context_ids.shape
    block = torch.arange(100, 100 + new_tokens, device=context_ids.device)[None]  # [1, K]
    sequence = torch.cat([context_ids, block], dim=1)
    runners = {"full": CausalLMRunner(target, "full"), "slim": CausalLMRunner(SlimModel(target, mask), "slim")}
    for r in runners.values():
        r.logits(context_ids, 1)  # prefill
    times: dict[str, list[float]] = {"full": [], "slim": []}
    for rep in range(warmup + repetitions):
        order = ("full", "slim") if rep % 2 == 0 else ("slim", "full")
        for name in order:
            begin = time.perf_counter()
            runners[name].logits(sequence, new_tokens)  # crops to C, then one forward of K tokens
            elapsed = time.perf_counter() - begin
            if rep >= warmup:
                times[name].append(elapsed)
    ratios = [s / f for s, f in zip(times["slim"], times["full"])]
    return CostRatio(new_tokens, C, 1e3 * statistics.median(times["full"]), 1e3 * statistics.median(times["slim"]),
                     statistics.median(ratios), repetitions)
