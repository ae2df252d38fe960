"""The search space of DIMR: masks that meet a budget, encoded for hyperopt.

Every routable block (a decoder layer, or an attention / MLP sub-block) gets a score in [0, 1];
a mask is decoded by skipping blocks in descending score order until the budget is met. Every
point of the space is therefore a valid mask of exactly the budget, uniform scores give a
uniformly random mask of the budget (the random-search phase), and TPE learns which blocks to
score high.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hyperopt import hp

from ..routing import RoutingMask

UNITS = ("layers", "blocks")


@dataclass(frozen=True)
class Budget:
    """How much of the target the slim verifier skips."""

    unit: str = "layers"  # "layers": exactly `amount` whole layers; "blocks": attention/MLP sub-blocks
    amount: float = 4  # layers skipped; for "blocks", in layer-equivalents of cost (see costs.attention_share)

    def __post_init__(self) -> None:
        if self.unit not in UNITS:
            raise ValueError(f"budget unit {self.unit!r} is not one of {UNITS}")
        if self.amount <= 0:
            raise ValueError(f"budget amount must be > 0, got {self.amount}")
        if self.unit == "layers" and float(self.amount) != int(self.amount):
            raise ValueError(f"a layer budget is a whole number of layers, got {self.amount}")

    def describe(self) -> str:
        return (
            f"{self.amount:g} layers" if self.unit == "layers" else f"{self.amount:g} layer-equivalents of sub-blocks"
        )


class MaskSpace:
    """Masks of one budget over a model's L layers, with their hyperopt encoding."""

    def __init__(
        self,
        num_layers: int,
        budget: Budget,
        attn_share: float = 0.5,
        model: str | None = None,
        candidates: list[tuple[str, int]] | None = None,
    ):
        """`candidates`: the blocks the search may skip, e.g. [("layer", 12), ...]; None: all of them."""
        self.num_layers = num_layers
        self.budget = budget
        self.attn_share = attn_share
        self.model = model
        if budget.unit == "layers":
            blocks = [("layer", i) for i in range(num_layers)]
            if budget.amount >= num_layers:
                raise ValueError(f"a budget of {budget.amount:g} layers leaves none of the {num_layers} layers")
        else:
            blocks = [(kind, i) for i in range(num_layers) for kind in ("attention", "mlp")]
            if budget.amount > num_layers - 1:
                raise ValueError(f"a budget of {budget.amount:g} layer-equivalents leaves less than one layer")
        if candidates is not None:
            unknown = [b for b in candidates if b not in blocks]
            if unknown:
                raise ValueError(f"candidate blocks {unknown} are not blocks of a {budget.unit} search")
            blocks = [b for b in blocks if b in set(candidates)]
            if sum(self._cost(kind) for kind, _ in blocks) < budget.amount:
                raise ValueError(f"the {len(blocks)} candidate blocks cannot meet a budget of {budget.describe()}")
        self.blocks = blocks

    def labels(self) -> list[str]:
        return [f"{kind[0]}{i}" for kind, i in self.blocks]

    def hyperopt_space(self) -> dict:
        return {label: hp.uniform(label, 0.0, 1.0) for label in self.labels()}

    def _cost(self, kind: str) -> float:
        return {"layer": 1.0, "attention": self.attn_share, "mlp": 1.0 - self.attn_share}[kind]

    def decode(self, scores: dict[str, float]) -> RoutingMask:
        """The mask that skips the highest-scored blocks until the budget is met (ties: lower index)."""
        labels = self.labels()
        order = sorted(range(len(self.blocks)), key=lambda b: (-scores[labels[b]], b))
        layers, attention, mlp = [], [], []
        spent = 0.0
        for b in order:
            if spent >= self.budget.amount - 1e-9:
                break
            kind, i = self.blocks[b]
            chosen = {"layer": layers, "attention": attention, "mlp": mlp}[kind]
            chosen.append(i)
            try:  # a block that would leave no layer / no attention is passed over
                RoutingMask(layers, attention, mlp, self.num_layers)
            except ValueError:
                chosen.pop()
                continue
            spent += self._cost(kind)
        return RoutingMask(layers, attention, mlp, self.num_layers, self.model)

    def encode(self, mask: RoutingMask) -> dict[str, float]:
        """Scores that decode to `mask` (for seeding the search with known masks)."""
        skipped = {("layer", i) for i in mask.skip_layers}
        if not skipped <= set(self.blocks) and self.budget.unit == "layers":
            raise ValueError(
                f"{mask.describe()} skips layers outside the search's candidates"
                f" ({', '.join(self.labels())}): raise search.candidates, or set it to null for every layer"
            )
        if self.budget.unit == "blocks":
            skipped = {(k, i) for i in mask.skip_layers for k in ("attention", "mlp")}
            skipped |= {("attention", i) for i in mask.skip_attention} | {("mlp", i) for i in mask.skip_mlp}
        elif not mask.is_layer_mask:
            raise ValueError("a sub-block mask cannot seed a layer-budget search")
        return {label: (0.99 if block in skipped else 0.01) for label, block in zip(self.labels(), self.blocks)}

    def random_mask(self, rng: np.random.Generator) -> RoutingMask:
        """A uniformly random mask of this budget."""
        return self.decode(dict(zip(self.labels(), rng.random(len(self.blocks)))))

    def random_masks(self, count: int, seed: int, exclude: list[RoutingMask] = ()) -> list[RoutingMask]:
        """`count` distinct random masks of this budget (none doing what a mask in `exclude` does)."""
        rng = np.random.default_rng(seed)
        seen = {m.skips for m in exclude}
        masks: list[RoutingMask] = []
        for _ in range(1000 * count):
            if len(masks) == count:
                break
            mask = self.random_mask(rng)
            if mask.skips not in seen:
                seen.add(mask.skips)
                masks.append(mask)
        return masks

    def cost_of(self, mask: RoutingMask) -> float:
        return mask.skipped_cost(self.attn_share)
