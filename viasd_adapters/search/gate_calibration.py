"""Calibrating a block gate: watch VIA-SD on calibration prompts, then pick the threshold.

VIA-SD runs ungated on calibration prompts (never benchmark prompts); every verify block gives
one observation, the draft's block confidence and whether the slim tier settled the block
(no full forward in it). `choose_gate` then picks the threshold with the lowest modelled
verify cost, the slim and escalation costs taken from a latency profile (`ExpectedCost.ratios`)
or given directly.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig, OmegaConf

from ..decode import SpeculativeDecoder
from ..draft.base import DraftBlock
from ..pipeline import ModelPair, build_decoder
from ..sampling import Sampler, SamplingConfig
from ..verify.base import Verdict, Verifier
from ..verify.gate import GateChoice, block_confidence, choose_gate


class BlockObserver(Verifier):
    """A verifier that delegates to another and notes (block confidence, settled) per block:
    settled when the full model (`full`, a `stats` key) ran no forward for the block."""

    def __init__(self, inner: Verifier, full: str = "target"):
        self.inner = inner
        self.full = full
        self.observed: list[tuple[float, bool]] = []

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    @property
    def context_length(self) -> int:
        return self.inner.context_length

    def reset(self) -> None:
        self.inner.reset()

    @property
    def stats(self):
        return self.inner.stats

    def _full_calls(self) -> int:
        stats = self.inner.stats
        if self.full not in stats:
            raise ValueError(f"the verifier has no {self.full!r} model to watch (it has {sorted(stats)})")
        return stats[self.full].calls

    def verify(self, input_ids: torch.Tensor, draft: DraftBlock, sampler: Sampler) -> Verdict:
        before = self._full_calls()
        verdict = self.inner.verify(input_ids, draft, sampler)
        if len(draft):
            confidence = block_confidence(draft.tokens, draft.draft_probs(self.vocab_size))
            self.observed.append((confidence, self._full_calls() == before))
        return verdict


def observe_blocks(
    pair: ModelPair, framework: DictConfig, verifier: DictConfig, prompts: list[torch.Tensor], max_new_tokens: int
) -> list[tuple[float, bool]]:
    """Greedy VIA-SD (the verifier's gate switched off) over `prompts`; one observation per block."""
    node = OmegaConf.merge(verifier, {"gate": None}) if "gate" in verifier else verifier
    decoder = build_decoder(framework, node, pair)
    if not isinstance(decoder, SpeculativeDecoder):
        raise ValueError(f"gate calibration needs a drafting framework, got {framework.get('name')!r}")
    observer = BlockObserver(decoder.verifier)
    decoder.verifier = observer  # the decoder's verifier is its public, swappable part
    for ids in prompts:
        decoder.generate(ids, max_new_tokens, SamplingConfig(), pair.target.stop_token_ids)
    return observer.observed


def calibrate_gate(
    pair: ModelPair,
    framework: DictConfig,
    verifier: DictConfig,
    prompts: list[torch.Tensor],
    max_new_tokens: int,
    slim_ratio: float,
    escalate_ratio: float,
) -> GateChoice:
    """Observe VIA-SD on calibration prompts and choose the gate threshold (see `choose_gate`)."""
    observed = observe_blocks(pair, framework, verifier, prompts, max_new_tokens)
    if not observed:
        raise ValueError("no verify blocks observed on the calibration prompts: raise max_new_tokens")
    confidence, settled = zip(*observed)
    return choose_gate(list(confidence), list(settled), slim_ratio, escalate_ratio)
