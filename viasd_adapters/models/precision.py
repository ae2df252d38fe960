"""A model's precision, stated as two settings: how its weights are stored and what its linear
layers multiply them with.

| weights | activations | what runs | label |
|---|---|---|---|
| float32 / bfloat16 / float16 | null (the same) | the model in that dtype | `bfloat16` |
| int8 | null or int8 | W8A8: int8 weights per output channel, int8 activations per row (fbgemm), the rest fp32 | `int8` |
| int8 | float32 / bfloat16 | weight-only int8 linears, everything else in the activations' dtype | `bfloat16+int8-weight` |

The label is how a latency profile names a precision (`costs.profile`): one string per line of
costs, and the same names the drafter's own quantised copies are timed under. int8 weights have
CPU kernels only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FLOATS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
INT8 = "int8"
WEIGHTS = (*FLOATS, INT8)
WEIGHT_ONLY = "int8-weight"  # the `models.quantize` scheme of int8 weights under float activations


@dataclass(frozen=True)
class Precision:
    """`weights` and `activations` (None: as the weights; int8 weights then mean W8A8)."""

    weights: str = "bfloat16"
    activations: str | None = None

    def __post_init__(self) -> None:
        check_precision(self.weights, self.activations)

    @property
    def resolved_activations(self) -> str:
        return self.activations or self.weights

    @property
    def quantization(self) -> str | None:
        """The `models.quantize` scheme applied after loading: "int8" (W8A8), "int8-weight", or None."""
        if self.weights != INT8:
            return None
        return INT8 if self.resolved_activations == INT8 else WEIGHT_ONLY

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype the model loads in, and everything but its quantised layers computes in."""
        return FLOATS.get(self.resolved_activations, torch.float32)

    @property
    def label(self) -> str:
        """The profile's name: "bfloat16", "int8" (W8A8) or "bfloat16+int8-weight"."""
        if self.quantization == WEIGHT_ONLY:
            return f"{self.resolved_activations}+{WEIGHT_ONLY}"
        return self.weights

    @classmethod
    def from_label(cls, label: str) -> Precision:
        """The inverse of `label`."""
        base, plus, scheme = label.partition("+")
        if not plus:
            return cls(base)
        if scheme != WEIGHT_ONLY:
            raise ValueError(f"{label!r}: a model loads as {', '.join(WEIGHTS)} or <float>+{WEIGHT_ONLY}")
        return cls(INT8, base)

    def settings(self) -> dict[str, str | None]:
        """The `ModelSpec` (and runtime) keys of this precision."""
        return {"weights": self.weights, "activations": self.activations}

    def __str__(self) -> str:
        return self.weights if self.activations is None else f"{self.weights} weights, {self.activations} activations"


def check_precision(weights: str, activations: str | None = None, device: str = "cpu", prefix: str = "") -> None:
    """ValueError for a combination with no kernel (on `device`); `prefix` names the settings in
    the message ("runtime.draft_" gives runtime.draft_weights=...)."""
    weights_key, activations_key = f"{prefix}weights", f"{prefix}activations"
    if weights not in WEIGHTS:
        raise ValueError(f"{weights_key}={weights} is not one of {', '.join(WEIGHTS)}")
    if activations is not None and activations not in WEIGHTS:
        raise ValueError(f"{activations_key}={activations} is not one of {', '.join(WEIGHTS)}, null")
    if weights in FLOATS and activations not in (None, weights):
        raise ValueError(
            f"{weights_key}={weights} with {activations_key}={activations}: a float model multiplies in its"
            f" weights' dtype; set {activations_key}=null, or {weights_key}=int8 for int8 weights"
        )
    if weights == INT8 and torch.device(device).type != "cpu":
        raise ValueError(
            f"{weights_key}=int8: its kernels (fbgemm, weight-only int8) run on CPUs only, not on {device};"
            f" use {weights_key}=bfloat16 on {device}, or device=cpu"
        )


def precision_label(weights: str, activations: str | None = None) -> str:
    """`Precision(weights, activations).label`: the configs' `${viasd.precision:...}` resolver."""
    return Precision(weights, activations or None).label


def runtime_precision(runtime, draft: bool = False) -> Precision:
    """The target's (or the draft's) precision in a `runtime` config."""
    prefix = "draft_" if draft else ""
    return Precision(runtime[f"{prefix}weights"], runtime.get(f"{prefix}activations"))
