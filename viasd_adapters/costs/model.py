"""The cost model: what one forward costs as a function of the tokens it feeds `n` and the
decoder layers it runs `l`, fitted to a latency profile (`CostModel.fit`) or modelled by ratios
(`CostModel.synthetic`):

    ms(n, l) = a + b * l + (c + d * l) * n          (decode-sized forwards, n <= ~16)

`a` and `c` are what does not scale with depth (embedding, final norm, LM head, Python and cache
bookkeeping per call), `b` and `d` one decoder layer. The target's line is fitted by least
squares on its entries whole and as slim views (routing masks), so the slim verifier of any mask
is priced by its `l` without a measurement of its own; the drafter (in the variant that runs:
"bfloat16+int8-weight" is its own line) gets `ms(n) = a + c * n`. Prefill (the first forward of
a generation) is priced on a separate line per model, fitted on the context-0 entries. With a
linear `ms(n)` a generation's total depends only on the counts benchmark records keep
(`CostModel.seconds`; `bench/costmodel.py` prices records with it).

Modelled cost models describe a device by ratios only (a draft step at 0.05 of a target step, a
verify as cheap as a decode step, as on a GPU): their predictions are modelled figures and are
labelled as such wherever they are printed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from scipy.optimize import nnls
from transformers import PreTrainedModel

from .profile import LatencyEntry, LatencyProfile, at_context

ROLES = ("target", "draft", "slim")  # the `DecodeStats.model_calls` keys a cost model prices


def attention_share(model: PreTrainedModel) -> float:
    """Share of a decoder layer's weights in its attention sub-block (a proxy for its decode cost),
    which prices a mask's skipped sub-blocks in layers (`RoutingMask.skipped_cost`)."""
    layer = model.get_decoder().layers[0]
    attention, mlp = _weight_count(layer.self_attn), _weight_count(layer.mlp)
    return attention / (attention + mlp)


def _weight_count(block: torch.nn.Module) -> int:
    """Multiply-adds per token of a block's linear layers, counted from their shapes: an int8
    layer keeps its packed weights out of `parameters()`."""
    return sum(
        m.in_features * m.out_features
        for m in block.modules()
        if hasattr(m, "in_features") and hasattr(m, "out_features")
    )


@dataclass(frozen=True)
class Line:
    """ms of one forward as an affine function of tokens fed and layers run (see the module doc)."""

    a: float  # ms per call, depth-independent
    b: float = 0.0  # ms per call per layer
    c: float = 0.0  # ms per token, depth-independent
    d: float = 0.0  # ms per token per layer

    def ms(self, tokens: float, layers: float = 0.0) -> float:
        return self.a + self.b * layers + (self.c + self.d * layers) * tokens

    def per_call(self, layers: float = 0.0) -> float:
        return self.a + self.b * layers

    def per_token(self, layers: float = 0.0) -> float:
        return self.c + self.d * layers


def fit_line(points: list[tuple[float, float, float]], with_layers: bool) -> Line:
    """Least-squares `Line` through (tokens, layers, ms) points: ms against tokens, and layers when asked.

    Non-negative: every term is a cost, and an unconstrained fit to noisy timings (a busy host)
    can price a forward below zero."""
    if not points:
        raise ValueError("no measurements to fit")
    n, l, y = (np.array(column, dtype=float) for column in zip(*points))
    X = np.stack([np.ones_like(n), l, n, n * l] if with_layers else [np.ones_like(n), n], axis=1)
    coef, _ = nnls(X, y)
    if with_layers:
        return Line(*map(float, coef))
    return Line(a=float(coef[0]), c=float(coef[1]))


def _fit_role(found: list[LatencyEntry], depth, context: int, model: str, variant: str) -> tuple[Line, Line | None]:
    """(decode line, prefill line or None) of one model's entries; `depth(entry)` -> layers it ran."""
    cached = [e for e in found if e.context > 0]
    if not cached:
        raise KeyError(
            f"the latency profile has only prefill entries for {model} in {variant}: measure"
            " decode-sized forwards after a cached context (contexts > 0)"
        )
    small = at_context(cached, context)
    decode = fit_line([(e.new_tokens, depth(e), e.ms) for e in small], with_layers=len({depth(e) for e in small}) > 1)
    whole = [e for e in found if e.context == 0 and e.layers is None]
    if len(whole) < 2:
        return decode, None
    return decode, fit_line([(e.new_tokens, 0.0, e.ms) for e in whole], with_layers=False)


@dataclass
class CostModel:
    """What a pair's forwards cost on one device: fitted lines (`CostModel.fit`) or modelled ratios."""

    device: str  # e.g. "Intel(R) Xeon(R) ... (AMX-BF16, ...; 2 cores), 2 torch threads" or "modelled: ..."
    num_layers: int  # L of the target
    decode: dict[str, Line]  # "target" (over layers) and "draft": forwards of a few tokens
    prefill: dict[str, Line]  # the first forward of a generation (the prompt), per model
    modelled: bool = False  # True: ratios assumed, not measured (never mix with measured figures)
    facts: dict = field(default_factory=dict)  # dtypes, threads, torch version, date

    @classmethod
    def fit(
        cls,
        profile: LatencyProfile,
        target: str,
        draft: str | None = None,
        dtype: str = "bfloat16",
        draft_dtype: str | None = None,
        threads: int | None = None,
        context: int = 256,
    ) -> CostModel:
        """The cost model of `target` in `dtype` and `draft` in `draft_dtype` (default: `dtype`;
        a quantised variant is its own line), fitted on `profile`'s entries at `threads`
        (default: torch's): decode lines on the measured context nearest to `context`, prefill
        lines on the context-0 entries of the whole models (the decode line where there are
        fewer than two)."""
        threads = threads or torch.get_num_threads()
        if target not in profile.model_layers:
            raise ValueError(
                f"the latency profile has no layer count for {target} (measured before the cost model"
                " used one): run viasd-profile remeasure=true, or viasd-costmodel mode=profile"
            )
        L = profile.model_layers[target]
        decode, prefill = {}, {}
        for role, model, variant in (("target", target, dtype), ("draft", draft, draft_dtype or dtype)):
            if model is None:
                continue
            depth = (lambda e: float(L if e.layers is None else e.layers)) if role == "target" else (lambda e: 0.0)
            found = profile.entries_of(model, variant, threads)
            decode[role], prompt = _fit_role(found, depth, context, model, variant)
            if prompt is None:  # no prompt-sized forwards measured: price the prompt on the decode line
                layers = L if role == "target" else 0.0
                prompt = Line(a=decode[role].per_call(layers), c=decode[role].per_token(layers))
            prefill[role] = prompt
        label = f"{profile.hardware or profile.device}, {threads} torch thread{'s' if threads > 1 else ''}"
        facts = {
            "dtype": dtype,
            "draft_dtype": draft_dtype or dtype,
            "threads": threads,
            "torch": profile.torch_version,
            "created": profile.created,
        }
        return cls(label, L, decode, prefill, False, facts)

    def _priced_as(self, role: str, slim: float | str | None, full: float | None = None) -> tuple[str, float]:
        """(line, layers) that price a forward of `role`: the slim verifier is the target running
        `slim` layers, or, for an independent middle model (slim="draft"), the draft; the target
        runs `full` layers (an escalation over a shared prefix) or all of them."""
        if role not in ROLES:
            raise ValueError(f"model_calls key {role!r} is not one the cost model prices ({ROLES})")
        if role == "slim":
            if slim is None:
                raise ValueError("pricing a slim forward needs the layers it runs (or 'draft' for a separate model)")
            return ("draft", 0.0) if slim == "draft" else ("target", float(slim))
        if role == "target":
            return role, float(self.num_layers if full is None else full)
        return role, 0.0

    def forward_ms(
        self, role: str, tokens: int, slim: float | str | None = None, first: bool = False, full: float | None = None
    ) -> float:
        """ms of one forward of `tokens` new tokens (`first`: the generation's prefill)."""
        line, layers = self._priced_as(role, slim, full)
        if line not in self.decode:
            raise ValueError(f"the cost model has no {line!r} line (it prices {sorted(self.decode)})")
        if first:  # a slim prefill runs its share of the target's layers
            scale = layers / self.num_layers if line == "target" else 1.0
            return scale * self.prefill[line].ms(tokens)
        return self.decode[line].ms(tokens, layers)

    def seconds(
        self,
        model_calls: dict[str, dict],
        prompt_tokens: int,
        slim: float | str | None = None,
        full: float | None = None,
    ) -> float:
        """Predicted wall seconds of a generation from its `model_calls` ({role: {calls, tokens}}):
        `(calls - 1) * ms(0, l) + (tokens - prompt) * slope(l) + prefill(prompt, l)` per role.
        `slim`: layers the slim verifier runs; `full`: layers a target forward runs (escalations
        over a shared prefix run L - p; None: all L)."""
        total_ms = 0.0
        for role, c in model_calls.items():
            calls, tokens = int(c["calls"]), int(c["tokens"])
            if calls == 0:
                continue
            first = min(prompt_tokens, tokens)
            line, layers = self._priced_as(role, slim, full)
            decode = self.decode[line]
            total_ms += self.forward_ms(role, first, slim, first=True, full=full)
            total_ms += (calls - 1) * decode.per_call(layers) + (tokens - first) * decode.per_token(layers)
        return total_ms / 1e3

    @classmethod
    def synthetic(
        cls,
        num_layers: int,
        draft_ratio: float,
        per_layer_share: float = 0.9,
        verify_token_ratio: float = 0.0,
        name: str | None = None,
    ) -> CostModel:
        """A modelled device, in units of one target decode step (1.0).

        Args:
            draft_ratio: one draft step relative to one target step (0.05-0.1 on a GPU).
            per_layer_share: share of a target step that scales with its decoder layers (the rest:
                embedding, LM head, launch overhead), which decides what a slim forward costs.
            verify_token_ratio: extra cost of each further token fed, relative to a step (about 0 on
                a GPU for a few tokens: a verify of K tokens costs one step).
        """
        if draft_ratio <= 0 or not 0 <= per_layer_share <= 1:
            raise ValueError(
                f"need draft_ratio > 0 and 0 <= per_layer_share <= 1, got {draft_ratio}, {per_layer_share}"
            )
        b = per_layer_share / num_layers
        a = 1.0 - per_layer_share
        target = Line(a=a, b=b, c=verify_token_ratio * a, d=verify_token_ratio * b)
        draft = Line(a=draft_ratio, c=verify_token_ratio * draft_ratio)
        label = name or (
            f"modelled: draft {draft_ratio:g} of a target step, verify of K tokens "
            f"{'= one step' if verify_token_ratio == 0 else f'+{verify_token_ratio:g} per token'}"
        )
        # Units of "ms" are target steps here; prefill priced as a step (GPU prefill of a short prompt).
        return cls(
            label,
            num_layers,
            {"target": target, "draft": draft},
            {"target": Line(a=1.0), "draft": Line(a=draft_ratio)},
            True,
            {"draft_ratio": draft_ratio, "per_layer_share": per_layer_share, "verify_token_ratio": verify_token_ratio},
        )
