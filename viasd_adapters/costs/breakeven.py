"""What VIA-SD's verify must cost, or settle, to run a given factor faster than its host (SD).

Per round, with costs in target steps and the same tokens per round on both sides (VIA-SD's
lossless points commit what SD commits):

    SD:     K * c + 1                       VIA-SD: K * c + s + (1 - settled) * e

with c a draft step, s a slim forward and e an escalation, each relative to one full verify.
"""

from __future__ import annotations


def settled_share_needed(
    draft_ratio: float, block: int, slim_ratio: float, escalate_ratio: float, gain: float = 1.10
) -> float | None:
    """Share of verify blocks the slim tier must settle for VIA-SD to run `gain` x its host (SD):
    settled >= 1 - ((K c + 1) / gain - K c - s) / e. None: out of reach even when every block
    settles (the slim pass alone costs too much next to the draft).

    Args:
        draft_ratio: c, one draft step / one target step.
        block: K, draft tokens per round.
        slim_ratio, escalate_ratio: s and e, a slim forward and an escalation / a full verify.
    """
    budget = _verify_budget(draft_ratio, block, gain) - slim_ratio
    if budget < 0:
        return None
    return max(0.0, 1.0 - budget / escalate_ratio)


def slim_ratio_needed(
    draft_ratio: float, block: int, settled: float, escalate_ratio: float, gain: float = 1.10
) -> float | None:
    """The most a slim forward may cost (/ a full verify) for VIA-SD to run `gain` x its host, when
    the slim tier settles `settled` of the blocks: the same round costs as `settled_share_needed`,
    solved for s = (K c + 1) / gain - K c - (1 - settled) e. None: out of reach even with a free
    slim pass."""
    budget = _verify_budget(draft_ratio, block, gain) - (1.0 - settled) * escalate_ratio
    return budget if budget >= 0 else None


def _verify_budget(draft_ratio: float, block: int, gain: float) -> float:
    """What VIA-SD may spend verifying one round, in target steps, to run `gain` x SD: the host's
    round (K c + 1) shrunk by the gain, less the same K c of drafting."""
    return (block * draft_ratio + 1.0) / gain - block * draft_ratio
