"""The one timing loop: wall milliseconds of forward passes, device synchronised around each.

`time_forwards` times any causal LMs (slim views too) after a cached context; the latency
profile (`costs.measure`) and the slim/full cost ratio of a mask (`measure_cost_ratio`) are both
measured with it. Absolute times swing on shared hosts, so the models take turns within every
repetition: ratios of interleaved medians are what to compare.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from ..hardware import synchronize
from ..routing import RoutingMask, decoding_view
from ..runner import CausalLMRunner


@torch.no_grad()
def time_forwards(
    models: dict, context: int | torch.Tensor, new_tokens: Iterable[int], repeats: int, seed: int = 0, warmup: int = 1
) -> dict[object, dict[int, list[float]]]:
    """Milliseconds of each of `repeats` forwards per count in `new_tokens`, after a cached
    context, for each of `models` ({key: causal LM}, slim views too), as {key: {count: ms}}.

    `context`: the number of cached tokens (random ids: the cost of a dense forward does not
    depend on the text), or the [1, C] ids themselves. The models take turns: each repetition
    runs every model once per count, in an order rotated between repetitions, so a machine's
    drift hits all alike; the first `warmup` repetitions warm the kernels up for every shape and
    are not kept. The cache is cropped back to the context before each forward, as a rejected
    draft block is (context 0: a prefill from an empty cache); every forward keeps the logits of
    all the tokens it is fed, as a verify does. The device is synchronised before and after each
    forward, so the clock reads finished work (a no-op on CPU). A value of `models` may be a
    `CausalLMRunner` instead (a drafter's, with its reduced head), timed as it is.
    """
    counts, keys = list(new_tokens), list(models)
    runners = {k: m if isinstance(m, CausalLMRunner) else CausalLMRunner(m, str(k)) for k, m in models.items()}
    device = runners[keys[0]].device
    vocab = int(runners[keys[0]].model.config.vocab_size)
    gen = torch.Generator().manual_seed(seed)
    if isinstance(context, torch.Tensor):
        prefix = context.to(device)  # [1, C]
    else:
        prefix = torch.randint(vocab, (1, context), generator=gen).to(device)  # [1, C]
    if prefix.shape[1]:
        for runner in runners.values():
            runner.logits(prefix, 1)
    times: dict[object, dict[int, list[float]]] = {key: {n: [] for n in counts} for key in keys}
    for r in range(warmup + repeats):
        shift = r % len(keys)
        for n in counts:
            sequence = torch.cat([prefix, torch.randint(vocab, (1, n), generator=gen).to(device)], dim=1)  # [1, C + n]
            for key in keys[shift:] + keys[:shift]:
                synchronize(device)
                begin = time.perf_counter()
                runners[key].logits(sequence, n)  # crops the cache to the context, feeds n tokens
                synchronize(device)
                if r >= warmup:
                    times[key][n].append(1000.0 * (time.perf_counter() - begin))
    return times


@dataclass
class CostRatio:
    """Median wall times of one forward of `new_tokens` tokens after `context` cached tokens."""

    new_tokens: int  # tokens fed per forward (1: a decode step; K: a verify)
    context: int  # tokens already cached
    full_ms: float  # median over repetitions, the full target
    slim_ms: float  # median over repetitions, the slim view
    ratio: float  # median of the per-repetition slim / full ratios
    repetitions: int  # timed forwards of each model (warm-up not counted)

    def to_dict(self) -> dict:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in self.__dict__.items()}


def measure_cost_ratio(
    target: PreTrainedModel,
    mask: RoutingMask,
    context_ids: torch.Tensor,
    new_tokens: int,
    repetitions: int = 15,
    warmup: int = 2,
) -> CostRatio:
    """Time slim and full forwards of `new_tokens` tokens after `context_ids` ([1, C]), interleaved:
    each repetition rolls both caches back to the context and feeds the same tokens, and the
    order of slim and full alternates between repetitions."""
    B, C = context_ids.shape
    times = time_forwards(
        {"full": target, "slim": decoding_view(target, mask)}, context_ids, [new_tokens], repetitions, warmup=warmup
    )
    full, slim = times["full"][new_tokens], times["slim"][new_tokens]
    ratios = [s / f for s, f in zip(slim, full)]
    return CostRatio(
        new_tokens, C, statistics.median(full), statistics.median(slim), statistics.median(ratios), repetitions
    )


@torch.no_grad()
def time_draft_head(
    head: torch.nn.Module,
    lm_head: torch.nn.Module,
    context: int,
    rows: Iterable[int],
    repeats: int,
    top_k: int = 10,
    seed: int = 0,
    warmup: int = 1,
) -> dict[int, list[float]]:
    """Milliseconds of one level of an EAGLE head's tree growth, as {rows: [ms per repetition]}:
    the head (eagle-llm's `cnets.Model`) over `rows` new nodes after `context` cached positions,
    then `lm_head` over its outputs and the top-`top_k`, as `topK_genrate` runs each level.

    Random features and ids: the cost of these dense forwards does not depend on them. The cached
    context is kept and each forward reads it afresh (eagle-llm's cache grows by concatenation).
    """
    counts = list(rows)
    embeddings = head.embed_tokens.weight
    device, H, V = embeddings.device, embeddings.shape[1], embeddings.shape[0]
    gen = torch.Generator().manual_seed(seed)
    head.reset()  # no tree mask: a causal level prices as a tree level of as many rows
    features = torch.randn(1, context, H, generator=gen).to(device, embeddings.dtype)
    _, past = head(features, input_ids=torch.randint(V, (1, context), generator=gen).to(device), use_cache=True)
    times: dict[int, list[float]] = {n: [] for n in counts}
    for r in range(warmup + repeats):
        for n in counts:
            hidden = torch.randn(1, n, H, generator=gen).to(device, embeddings.dtype)  # [1, n, H]
            ids = torch.randint(V, (1, n), generator=gen).to(device)  # [1, n]
            positions = torch.arange(context, context + n, device=device)[None]  # [1, n]
            synchronize(device)
            begin = time.perf_counter()
            out, _ = head(hidden, input_ids=ids, past_key_values=past, position_ids=positions, use_cache=True)
            torch.topk(lm_head(out[0]), top_k, dim=-1)
            synchronize(device)
            if r >= warmup:
                times[n].append(1000.0 * (time.perf_counter() - begin))
    return times
