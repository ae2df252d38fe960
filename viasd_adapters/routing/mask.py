"""The routing mask z: which decoder layers (or attention / MLP sub-blocks) the slim verifier skips.

A mask is data, validated when it is built and stored as a small YAML file that is also a
Hydra config (`conf/routing/<name>.yaml`, `_target_: viasd_adapters.routing.RoutingMask`) with
the provenance of the search that found it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml


def _indices(name: str, values: Iterable[int] | None) -> tuple[int, ...]:
    if values is None:
        return ()
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a list of layer indices, got {values!r}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) and not (hasattr(v, "__index__")):
            raise TypeError(f"{name} must hold integer layer indices, got {v!r}")
        out.append(int(v))
    if len(set(out)) != len(out):
        dupes = sorted({v for v in out if out.count(v) > 1})
        raise ValueError(f"{name} lists layer(s) {dupes} more than once")
    return tuple(sorted(out))


def _plain(obj: Any) -> Any:
    """OmegaConf containers (and anything Mapping / list-like) -> plain dicts and lists."""
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) or type(obj).__name__ == "ListConfig":
        return [_plain(v) for v in obj]
    return obj


def format_layers(layers: Iterable[int]) -> str:
    """[3, 12, 13, 14, 15] -> "3,12-15"."""
    layers = sorted(layers)
    if not layers:
        return "-"
    parts, start, prev = [], layers[0], layers[0]
    for i in layers[1:] + [None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


@dataclass(frozen=True)
class RoutingMask:
    """Which parts of a target's L decoder layers the slim verifier u skips.

    Normalised on construction: indices are sorted; a layer whose attention and MLP are both
    listed moves to `skip_layers`; sub-block lists never repeat a skipped layer.
    """

    skip_layers: tuple[int, ...] = ()  # whole decoder layers skipped
    skip_attention: tuple[int, ...] = ()  # layers whose self-attention sub-block is skipped (MLP kept)
    skip_mlp: tuple[int, ...] = ()  # layers whose MLP sub-block is skipped (attention kept)
    num_layers: int | None = None  # L of the model it was made for; None fits any model (checked when bound)
    model: str | None = None  # name of the target it was searched for (informational; L is what is checked)
    provenance: dict = field(default_factory=dict, compare=False)  # how it was found: method, budget, cost, ...

    def __post_init__(self) -> None:
        layers = set(_indices("skip_layers", self.skip_layers))
        attention = set(_indices("skip_attention", self.skip_attention))
        mlp = set(_indices("skip_mlp", self.skip_mlp))
        both = attention & mlp
        layers |= both
        attention -= layers
        mlp -= layers
        object.__setattr__(self, "skip_layers", tuple(sorted(layers)))
        object.__setattr__(self, "skip_attention", tuple(sorted(attention)))
        object.__setattr__(self, "skip_mlp", tuple(sorted(mlp)))
        object.__setattr__(self, "provenance", _plain(self.provenance or {}))
        if self.num_layers is not None:
            if isinstance(self.num_layers, bool) or int(self.num_layers) != self.num_layers or self.num_layers < 1:
                raise ValueError(f"num_layers must be a positive integer, got {self.num_layers!r}")
            object.__setattr__(self, "num_layers", int(self.num_layers))
        self._check(self.num_layers)

    # ----------------------------------------------------------------------------- validation
    def _check(self, num_layers: int | None) -> None:
        touched = self.touched_layers
        if touched and min(touched) < 0:
            raise ValueError(f"layer indices must be >= 0, got {format_layers(i for i in touched if i < 0)}")
        if num_layers is None:
            return
        out = [i for i in touched if i >= num_layers]
        if out:
            raise ValueError(
                f"layer index {format_layers(out)} is out of range for a {num_layers}-layer model "
                f"(valid: 0-{num_layers - 1})"
            )
        if len(self.skip_layers) == num_layers:
            raise ValueError(
                f"the mask skips all {num_layers} decoder layers: the slim verifier would be embeddings "
                "plus LM head only. Keep at least one layer."
            )
        attending = set(range(num_layers)) - set(self.skip_layers) - set(self.skip_attention)
        if not attending:
            raise ValueError(
                "the mask skips every attention sub-block: the slim verifier would ignore the context. "
                "Keep at least one layer's attention."
            )

    def check_fits(self, num_layers: int, model_name: str | None = None) -> None:
        """Raise ValueError unless this mask can route a model with `num_layers` decoder layers."""
        if self.num_layers is not None and self.num_layers != num_layers:
            made_for = f" ({self.model})" if self.model else ""
            target = f" {model_name}" if model_name else ""
            raise ValueError(
                f"routing mask made for a {self.num_layers}-layer model{made_for} does not fit the "
                f"{num_layers}-layer target{target}. Pick the routing config of this model pair "
                "(`routing=<target>-<k>l`, see conf/routing/) or search one with `viasd-search`."
            )
        self._check(num_layers)

    # ----------------------------------------------------------------------------- queries
    @classmethod
    def none(cls, num_layers: int | None = None) -> RoutingMask:
        """The identity mask: the slim verifier is the full model."""
        return cls(num_layers=num_layers)

    @classmethod
    def random_like(cls, seed: int = 0, **like: Any) -> RoutingMask:
        """A mask with the budget of the mask `like` describes (as many skipped layers, attention
        and MLP sub-blocks) on uniformly random layers: the random-skipping ablation of a searched
        mask. `like` are `RoutingMask` fields, so a config merges it over a routing config."""
        mask = cls(**like)
        if mask.num_layers is None:
            raise ValueError("random_like needs a mask bound to a model: set its num_layers")
        rng = np.random.default_rng(seed)
        order = [int(i) for i in rng.permutation(mask.num_layers)]
        counts = (len(mask.skip_layers), len(mask.skip_attention), len(mask.skip_mlp))
        layers, attention, mlp = (tuple(order[sum(counts[:k]) : sum(counts[: k + 1])]) for k in range(3))
        return cls(
            layers,
            attention,
            mlp,
            num_layers=mask.num_layers,
            model=mask.model,
            provenance={"method": f"random, the budget of {mask.describe()}", "seed": seed},
        )

    @property
    def skips(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
        """(skip_layers, skip_attention, skip_mlp): what the mask does, without model or provenance."""
        return self.skip_layers, self.skip_attention, self.skip_mlp

    @property
    def touched_layers(self) -> tuple[int, ...]:
        """Layers of which at least one sub-block is skipped."""
        return tuple(sorted(set(self.skip_layers) | set(self.skip_attention) | set(self.skip_mlp)))

    @property
    def is_identity(self) -> bool:
        return not self.touched_layers

    @property
    def is_layer_mask(self) -> bool:
        """True when only whole layers are skipped (no sub-block entries)."""
        return not self.skip_attention and not self.skip_mlp

    def num_prefix_layers(self, num_layers: int) -> int:
        """p: layers [0, p) run unchanged, so slim and full compute the same hidden states there."""
        touched = self.touched_layers
        return min(touched) if touched else num_layers

    def runs_attention(self, layer: int) -> bool:
        return layer not in self.skip_layers and layer not in self.skip_attention

    def runs_mlp(self, layer: int) -> bool:
        return layer not in self.skip_layers and layer not in self.skip_mlp

    def skipped_cost(self, attention_share: float) -> float:
        """Skipped work in layer-equivalents; an attention sub-block counts `attention_share` of a layer."""
        return (
            len(self.skip_layers)
            + attention_share * len(self.skip_attention)
            + (1 - attention_share) * len(self.skip_mlp)
        )

    def describe(self) -> str:
        """Compact text, e.g. "skip layers 12-15; attention 3; mlp -"."""
        text = f"skip layers {format_layers(self.skip_layers)}"
        if not self.is_layer_mask:
            text += f"; attention {format_layers(self.skip_attention)}; mlp {format_layers(self.skip_mlp)}"
        return text

    def bind(self, num_layers: int, model: str | None = None) -> RoutingMask:
        """This mask with `num_layers` (and `model` if unset) filled in, after checking it fits."""
        self.check_fits(num_layers, model)
        return RoutingMask(
            self.skip_layers, self.skip_attention, self.skip_mlp, num_layers, self.model or model, self.provenance
        )

    # ----------------------------------------------------------------------------- YAML
    def to_dict(self) -> dict:
        """The Hydra config of this mask (`hydra.utils.instantiate` rebuilds it)."""
        return {
            "_target_": f"{RoutingMask.__module__.rsplit('.', 1)[0]}.RoutingMask",
            "_convert_": "all",
            "model": self.model,
            "num_layers": self.num_layers,
            "skip_layers": list(self.skip_layers),
            "skip_attention": list(self.skip_attention),
            "skip_mlp": list(self.skip_mlp),
            "provenance": _plain(self.provenance),
        }

    @classmethod
    def from_dict(cls, data: Mapping) -> RoutingMask:
        data = _plain(data)
        unknown = set(data) - {
            "_target_",
            "_convert_",
            "model",
            "num_layers",
            "skip_layers",
            "skip_attention",
            "skip_mlp",
            "provenance",
        }
        if unknown:
            raise ValueError(f"unknown routing mask field(s) {sorted(unknown)}")
        return cls(
            skip_layers=data.get("skip_layers") or (),
            skip_attention=data.get("skip_attention") or (),
            skip_mlp=data.get("skip_mlp") or (),
            num_layers=data.get("num_layers"),
            model=data.get("model"),
            provenance=data.get("provenance") or {},
        )

    def to_yaml(self, path: str | Path, comment: str | None = None) -> Path:
        """Write the mask as a Hydra-composable YAML file (a `# comment` header first, if given)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        header = comment or (
            f"Routing mask for {self.model or 'any model'}: {self.describe()}"
            + (f" (of {self.num_layers} layers)" if self.num_layers else "")
        )
        text = "".join(f"# {line}\n" for line in header.splitlines())
        text += yaml.safe_dump(self.to_dict(), sort_keys=False, default_flow_style=None, width=100)
        path.write_text(text)
        return path

    @classmethod
    def from_yaml(cls, path: str | Path) -> RoutingMask:
        data = yaml.safe_load(Path(path).read_text())
        if not isinstance(data, Mapping):
            raise ValueError(f"{path} does not hold a routing mask (a mapping with skip_layers, ...)")
        return cls.from_dict(data)
