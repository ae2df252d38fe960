"""A causal LM bound to one sequence and its KV cache, which rolls back on demand."""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from transformers import DynamicCache, PreTrainedModel

from .models.compiled import decode_step
from .models.int8_gemv import fbgemm_only

if TYPE_CHECKING:  # routing/ imports this module: the slim view's type is named here only
    from .routing.slim import SlimModel


@dataclass
class CallStats:
    """What one model cost during a generation."""

    calls: int = 0  # forward passes
    tokens: int = 0  # tokens fed through those passes
    seconds: float = 0.0  # wall time inside them
    variant: str | None = (
        None  # what ran, as a latency profile names it ("bfloat16+int8-weight"); None: the run's dtype
    )

    def add(self, tokens: int, seconds: float) -> None:
        self.calls += 1
        self.tokens += tokens
        self.seconds += seconds


def common_prefix_length(a: torch.Tensor, b: torch.Tensor) -> int:
    """Length of the longest common prefix of two 1-D token tensors."""
    n = min(a.numel(), b.numel())
    mismatch = (a[:n] != b[:n]).nonzero()
    return int(mismatch[0]) if mismatch.numel() else n


class CausalLMRunner:
    """Runs a model over a growing sequence (batch size 1), feeding only what its cache lacks.

    The cache remembers which tokens it holds. Each call compares them with the sequence it is
    given and crops the cache to the common prefix, so rejected drafts, rewritten tokens and
    tokens committed without this model (a lagging cache catching up) need no bookkeeping by
    the caller: rollback and catch-up are the same operation.
    """

    def __init__(
        self,
        model: PreTrainedModel | SlimModel,
        name: str = "model",
        head: torch.nn.Module | None = None,
        variant: str | None = None,
        compiled: bool = True,
        int8_gemv: bool = True,
    ):
        """`model`: a transformers causal LM, or a routed view of one (called the same way).
        `head`: scores the model's final hidden states in its place ([..., d] -> [..., N]
        logits, e.g. a `ReducedHead` over N kept ids); None: the model's own LM head (N = V).
        `variant`: what its stats say ran where it is not the run's dtype (a drafter's quantised copy).
        `compiled`: run the model's compiled decode step when it has one (`models.compiled`).
        `int8_gemv`: False runs fbgemm's GEMM for every int8 product (`models.int8_gemv`: the same
        outputs, its speed), for comparisons."""
        self.model = model
        self.name = name
        self.head = head
        self.variant = variant
        self.step = decode_step(model) if compiled else None  # None: the eager forward
        self._kernels = contextlib.nullcontext if int8_gemv else fbgemm_only
        self.reset()

    @property
    def device(self) -> torch.device:
        return self.model.device

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().out_features)

    @property
    def context_length(self) -> int:
        return int(self.model.config.max_position_embeddings)

    @property
    def cached_length(self) -> int:
        return self.cached_ids.numel()

    def reset(self) -> None:
        """Forget the sequence and the statistics (start of a generation)."""
        self.cache = self.step.new_cache() if self.step is not None else DynamicCache()
        self.cached_ids = torch.empty(0, dtype=torch.long, device=self.device)
        self.stats = CallStats(variant=self.variant)

    def crop(self, length: int) -> None:
        """Keep the first `length` cached positions."""
        if length < self.cached_length:
            self.cache.crop(length)
            self.cached_ids = self.cached_ids[:length]

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, num_positions: int) -> torch.Tensor:
        """Logits of the last `num_positions` positions of `input_ids`.

        Args:
            input_ids: [1, T] the whole sequence so far (prompt, committed tokens, drafts).
            num_positions: m, 1 <= m <= T.
        Returns:
            [m, V] float logits ([m, N] with a `head`); row i scores the token after position
            T - m + i.
        """
        B, T = input_ids.shape
        assert B == 1 and 1 <= num_positions <= T
        ids = input_ids[0]
        self.crop(min(common_prefix_length(self.cached_ids, ids), T - num_positions))
        start = self.cached_length
        new_ids = ids[start:]
        begin = time.perf_counter()
        with self._kernels():
            logits = self._forward(new_ids, num_positions)
        if logits.device.type == "cuda":
            torch.cuda.synchronize(logits.device)
        self.stats.add(new_ids.numel(), time.perf_counter() - begin)
        self.cached_ids = ids.clone()
        return logits

    def _forward(self, new_ids: torch.Tensor, num_positions: int) -> torch.Tensor:
        """[n] ids the cache lacks -> [m, V] (or [m, N]) logits of the last m positions."""
        if self.step is not None:
            hidden = self.step(new_ids, self.cache)[-num_positions:]  # [m, H]
            return (self.model.get_output_embeddings() if self.head is None else self.head)(hidden)
        if self.head is None:
            out = self.model(
                input_ids=new_ids[None],
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=num_positions,
            )
            return out.logits[0]  # [m, V]
        out = self.model.get_decoder()(input_ids=new_ids[None], past_key_values=self.cache, use_cache=True)
        return self.head(out.last_hidden_state[0, -num_positions:])  # [m, N]
