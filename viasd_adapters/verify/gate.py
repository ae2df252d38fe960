"""Block gates: whether a verify block is worth a slim pass, decided from the draft alone.

A slim forward pays off only when the slim tier settles the block; when the block escalates
anyway, VIA-SD has paid for a slim pass *and* a full one. A gate looks at the draft's own
confidence before any verifier runs and sends blocks it expects to escalate straight to the
full model (exactly the lossless path, so a gate never changes which tokens are accepted by
the full model, only whether the slim tier gets a chance).

`DraftConfidenceGate` is a threshold on the draft's least confident token of the block; its
threshold is calibrated on calibration text (`calibrate_gate`), never on benchmark prompts.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


class BlockGate(ABC):
    """Decides, per block and before the slim forward, whether the slim tier is tried."""

    @abstractmethod
    def use_slim(self, draft_tokens: torch.Tensor, p: torch.Tensor) -> bool:
        """Args: draft_tokens [K] long x_i; p [K, V] the draft's distributions. True: run the slim pass."""


def block_confidence(draft_tokens: torch.Tensor, p: torch.Tensor) -> float:
    """The gate's feature: min_i p_i(x_i), the draft's confidence in its least confident token.

    A block settles without the full model only if the slim tier accepts its tokens up to the
    first one it rewrites, so one unsure draft token is usually enough for it to escalate.
    """
    K = draft_tokens.numel()
    if K == 0:
        return 1.0
    return float(p[torch.arange(K, device=p.device), draft_tokens].min())


@dataclass
class DraftConfidenceGate(BlockGate):
    """Run the slim pass only when the draft is at least `min_confidence` sure of every token."""

    min_confidence: float = 0.5  # 0: always run it (no gate); calibrate with `calibrate_gate`

    def __post_init__(self) -> None:
        if not 0.0 <= self.min_confidence <= 1.0:
            raise ValueError(f"min_confidence must be in [0, 1], got {self.min_confidence}")

    def use_slim(self, draft_tokens, p):
        return block_confidence(draft_tokens, p) >= self.min_confidence


@dataclass
class GateChoice:
    """A calibrated gate threshold and what it was chosen on."""

    min_confidence: float
    blocks: int  # calibration blocks observed (with the slim pass always run)
    settled_share: float  # share of them the slim tier settled
    gated_share: float  # share the chosen gate sends straight to the full model
    lost_settled: float  # share of settled blocks the gate gives up
    cost_ungated: float  # modelled verify cost per block without a gate (full forwards)
    cost_gated: float  # ... with the chosen gate


def choose_gate(confidence: list[float], settled: list[bool], slim_ratio: float, escalate_ratio: float) -> GateChoice:
    """The threshold minimising modelled verify cost per block on observed (feature, settled) pairs.

    A block the gate lets through costs `slim_ratio + (0 if settled else escalate_ratio)` full
    forwards; a gated block costs one full forward (as in plain SD). Candidates are 0 (no gate)
    and every observed confidence; ties go to the lower threshold (fewer blocks gated).
    """
    if len(confidence) != len(settled) or not confidence:
        raise ValueError("choose_gate needs one settled flag per observed block, and at least one block")
    c = torch.tensor(confidence, dtype=torch.float64)
    s = torch.tensor(settled, dtype=torch.bool)
    through_cost = slim_ratio + (~s).double() * escalate_ratio  # [N]
    best: tuple[float, float, torch.Tensor] | None = None  # (threshold, cost, passes)
    levels = sorted(set(confidence))
    for tau in [0.0] + [(a + b) / 2 for a, b in zip(levels, levels[1:])] + [1.0]:
        passes = c >= tau
        cost = float(torch.where(passes, through_cost, torch.ones_like(through_cost)).mean())
        if best is None or cost < best[1] - 1e-12:
            best = (tau, cost, passes)
    assert best is not None  # the first candidate always sets it
    tau, cost, passes = best
    n_settled = int(s.sum())
    return GateChoice(
        min_confidence=float(tau),
        blocks=len(confidence),
        settled_share=n_settled / len(confidence),
        gated_share=float((~passes).double().mean()),
        lost_settled=float((s & ~passes).sum()) / n_settled if n_settled else 0.0,
        cost_ungated=float(through_cost.mean()),
        cost_gated=cost,
    )
