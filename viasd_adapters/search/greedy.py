"""Baselines of the search: per-layer sensitivity and greedy layer-by-layer removal."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from tqdm.auto import tqdm

from ..routing import RoutingMask
from .objective import MaskMetrics

Objective = Callable[[RoutingMask], MaskMetrics]


@dataclass
class Sensitivity:
    """What skipping one block alone costs, per layer."""

    layer: list[MaskMetrics]  # [L] whole layer i skipped
    attention: list[MaskMetrics] | None = None  # [L] only layer i's attention skipped
    mlp: list[MaskMetrics] | None = None  # [L] only layer i's MLP skipped

    def least_sensitive(self, unit: str, count: int, cost: str) -> list[tuple[str, int]]:
        """The `count` blocks whose removal alone costs least: ("layer", i) for unit "layers",
        else ("attention", i) / ("mlp", i); ties go to the lower layer."""
        if unit == "layers":
            blocks = [("layer", i, m) for i, m in enumerate(self.layer)]
        else:
            blocks = [
                (kind, i, m)
                for kind, rows in (("attention", self.attention), ("mlp", self.mlp))
                for i, m in enumerate(rows)
            ]
        ranked = sorted(blocks, key=lambda b: (b[2].cost(cost), b[1]))
        return [(kind, i) for kind, i, _ in ranked[:count]]


def sensitivity(objective: Objective, num_layers: int, sub_blocks: bool = False, progress: bool = True) -> Sensitivity:
    """Evaluate every single-layer (and, with `sub_blocks`, single sub-block) mask."""
    kinds = ("layer", "attention", "mlp") if sub_blocks else ("layer",)
    masks = [(kind, i) for kind in kinds for i in range(num_layers)]
    results: dict[str, list[MaskMetrics]] = {kind: [] for kind in kinds}
    for kind, i in tqdm(masks, desc="sensitivity", disable=not progress):
        mask = RoutingMask(
            **{{"layer": "skip_layers", "attention": "skip_attention", "mlp": "skip_mlp"}[kind]: [i]},
            num_layers=num_layers,
        )
        results[kind].append(objective(mask))
    return Sensitivity(results["layer"], results.get("attention"), results.get("mlp"))


@dataclass
class GreedyStep:
    """One step of greedy removal: the layer whose removal cost least, given the earlier ones."""

    mask: RoutingMask  # all layers removed so far
    metrics: MaskMetrics  # of `mask`
    candidates: dict[int, MaskMetrics]  # layer tried at this step -> metrics of the mask with it removed


def greedy_removal(
    objective: Objective,
    num_layers: int,
    steps: int,
    cost: str = "kl",
    model: str | None = None,
    progress: bool = True,
    candidates: list[int] | None = None,
) -> list[GreedyStep]:
    """Remove layers one at a time, each time the one whose removal costs least.

    `steps` removals need sum_{j < steps} (n - j) evaluations for n candidate layers (all L by
    default; the first step is the per-layer sensitivity); a memoised objective makes repeated
    calls free.
    """
    pool = sorted(set(range(num_layers) if candidates is None else candidates))
    if not 1 <= steps < num_layers or steps > len(pool):
        raise ValueError(f"greedy removal steps must be in [1, {min(num_layers - 1, len(pool))}], got {steps}")
    path: list[GreedyStep] = []
    removed: list[int] = []
    total = sum(len(pool) - j for j in range(steps))
    with tqdm(total=total, desc="greedy removal", disable=not progress) as bar:
        for _ in range(steps):
            candidates = {}
            for layer in pool:
                if layer in removed:
                    continue
                candidates[layer] = objective(RoutingMask(removed + [layer], num_layers=num_layers))
                bar.update()
            best = min(candidates, key=lambda layer: (candidates[layer].cost(cost), layer))
            removed.append(best)
            mask = RoutingMask(removed, num_layers=num_layers, model=model)
            path.append(GreedyStep(mask, candidates[best], candidates))
            bar.set_postfix_str(f"{mask.describe()} kl={candidates[best].kl:.3f} top1={candidates[best].top1:.3f}")
    return path
