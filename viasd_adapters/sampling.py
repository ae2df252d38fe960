"""Token selection: greedy, or temperature / top-k / top-p sampling from a seeded generator."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch

# Below this, logits of any real model (|logit| up to ~1e4) divided by the temperature overflow
# float32 (max 3.4e38). Larger temperatures can still overflow on extreme logits: `Sampler.probs`
# says so then, instead of letting torch fail on inf / nan probabilities.
MIN_TEMPERATURE = 1e-30


@dataclass
class SamplingConfig:
    """How tokens are chosen from a distribution."""

    temperature: float = 0.0  # 0 means greedy (argmax)
    top_p: float = 1.0  # nucleus sampling mass, in (0, 1]
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    seed: int = 0  # seeds the generator of each generation, so sampled runs are reproducible

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
                raise ValueError(f"sampling.{name} must be a finite number, got {value!r}")
        for name in ("top_k", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"sampling.{name} must be a whole number >= 0, got {value!r}")
        if self.temperature < 0:
            raise ValueError(f"sampling.temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(
                f"sampling.temperature={self.temperature} is so small that logits / temperature overflow"
                f" float32: use temperature=0 for greedy decoding, or one >= {MIN_TEMPERATURE}"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError(f"sampling.top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Turns logits into distributions and tokens; owns the generator of one generation."""

    def __init__(self, config: SamplingConfig, device: torch.device | str = "cpu"):
        self.config = config
        self.generator = torch.Generator(device=device).manual_seed(config.seed)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., V] logits -> [..., V] float32 distribution the tokens are drawn from.

        Greedy decoding still returns softmax(logits): confidence-based policies need it.
        """
        logits = logits.float()
        cfg = self.config
        if cfg.greedy:
            return torch.softmax(logits, dim=-1)
        scaled = logits / cfg.temperature
        if torch.isinf(scaled).logical_and(torch.isfinite(logits)).any():
            raise ValueError(
                f"sampling.temperature={cfg.temperature} is too small for these logits (largest"
                f" {float(logits[torch.isfinite(logits)].abs().max()):.3g}): logits / temperature overflow float32;"
                " use temperature=0 for greedy decoding or a larger temperature"
            )
        logits = scaled
        if cfg.top_k:
            kth = torch.topk(logits, min(cfg.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if cfg.top_p < 1:
            sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
            # Drop a token when the mass strictly before it already reaches top_p.
            drop = (sorted_probs.cumsum(-1) - sorted_probs) >= cfg.top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def choose(self, logits: torch.Tensor) -> tuple[int, torch.Tensor]:
        """[V] logits -> (token, [V] distribution it came from)."""
        probs = self.probs(logits)
        return self.choose_from(probs, logits), probs

    def choose_from(self, probs: torch.Tensor, logits: torch.Tensor | None = None) -> int:
        """Draw one token from a [V] distribution (argmax when greedy)."""
        if self.config.greedy:
            return int((logits if logits is not None else probs).argmax())
        return self.draw(probs)

    def draw(self, probs: torch.Tensor) -> int:
        """Draw one token from a [V] distribution, whatever the mode."""
        return int(torch.multinomial(probs, 1, generator=self.generator))

    def uniform(self) -> float:
        """One U(0, 1) draw from this generation's generator."""
        return float(torch.rand((), generator=self.generator, device=self.generator.device))
