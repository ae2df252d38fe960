"""int8 linear layers: the `int8` precision of a whole model (target or draft), and cheaper
draft copies.

* "int8" (`runtime.weights=int8`, `runtime.draft_weights=int8`, activations null or int8): W8A8. Weights int8 per output
  channel; activations quantised at run time per row (token), so a row's output never depends on
  the other rows fed with it: a batched verify computes what one-token steps compute, and SD on
  the int8 target reproduces int8 AR (docs/results/int8.md). fbgemm's dynamic int8 GEMM multiplies: on
  CPUs without AVX-512 BF16 it is the cheapest kernel at every row count and grows far slower with
  rows than bf16 does (measured in docs/results/int8.md). Everything but the linear layers computes in fp32.
  Projections a layer feeds the same input (q / k / v, gate / up) share one GEMM.
* A drafter's precision never changes a lossless output (the target decides every token), only
  how often its drafts are accepted; docs/results/drafting.md has the measured cost and acceptance of the
  draft-only variants below.

* "int8-weight" (a model: `weights=int8` with float `activations`): weight-only int8, per output
  channel; activations stay in the model's dtype
  and `torch.ops.aten._weight_int8pack_mm` multiplies (the kernel gpt-fast uses on CPU). That
  kernel's time grows with the rows fed (2 threads of a Sapphire Rapids, 896 -> 4864 in bf16: 0.26
  ms for 1 row, 0.78 for 8, 11 for 150, against 0.5-1.0 ms for the bf16 matmul), so forwards of
  more than `INT8_MAX_ROWS` rows (a prompt, a re-fed block) use the model's own weights, which the
  copy shares.
* "int8-dynamic": torch.ao dynamic quantisation (int8 weights and activations, fbgemm /
  onednn); the layer computes in fp32 and returns the model's dtype.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import warnings
from collections.abc import Callable

import torch
from transformers import PreTrainedModel

from .int4_gemv import Int4Gemv
from .int8_gemv import GEMV_MAX_ROWS, Int8Gemv, gemv_enabled, gemv_for

# Rows up to which the int8 kernel beats the dense one (measured above); more go dense.
INT8_MAX_ROWS = 4


class Int8WeightLinear(torch.nn.Module):
    """y = x W^T + b with W stored as int8 rows times one scale per output channel; inputs of
    more than `max_rows` rows use the original (shared, not copied) dense weight."""

    def __init__(self, linear: torch.nn.Linear, max_rows: int = INT8_MAX_ROWS):
        super().__init__()
        self.dense_weight = linear.weight  # a plain attribute: shared with the source model, not state
        self.max_rows = max_rows
        w = linear.weight.detach().float()  # [out, in]
        scales = w.abs().amax(dim=1).clamp_min(1e-8) / 127.0  # [out]
        self.register_buffer("weight", torch.round(w / scales[:, None]).clamp(-128, 127).to(torch.int8))
        self.register_buffer("scales", scales.to(linear.weight.dtype))
        self.bias = None if linear.bias is None else torch.nn.Parameter(linear.bias.detach(), requires_grad=False)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape[:-1]
        if shape.numel() > self.max_rows:
            return torch.nn.functional.linear(x, self.dense_weight, self.bias)
        scales = self.scales if self.scales.dtype == x.dtype else self.scales.to(x.dtype)
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, self.in_features), self.weight, scales)
        y = y.reshape(*shape, self.out_features)
        return y if self.bias is None else y + self.bias


class DynamicInt8Linear(torch.nn.Module):
    """torch.ao's dynamically quantised linear behind a dtype cast (it only takes fp32)."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        from torch.ao.nn.quantized.dynamic import Linear as QuantizedLinear

        fp32 = torch.nn.Linear(linear.in_features, linear.out_features, bias=linear.bias is not None)
        fp32.weight.data = linear.weight.detach().float()
        if linear.bias is not None:
            fp32.bias.data = linear.bias.detach().float()
        fp32.qconfig = torch.ao.quantization.default_dynamic_qconfig
        self.inner = QuantizedLinear.from_float(fp32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.float()).to(x.dtype)


@contextlib.contextmanager
def _fbgemm():
    """fbgemm packs the weights: its AVX2 kernels run on every x86-64 CPU, AMX ones included."""
    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"
    try:
        with warnings.catch_warnings():
            # Packing goes through a quantized tensor (deprecated in torch 2.13, see `Int8Linear`).
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions.*")
            yield
    finally:
        torch.backends.quantized.engine = engine


def _quantize_per_channel(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] float -> int8 quantised tensor, one symmetric scale per output channel (row)."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1).clamp_min(1e-12) / 127.0).double()  # [N]
    with _fbgemm():
        return torch.quantize_per_channel(w, scales, torch.zeros_like(scales, dtype=torch.long), 0, torch.qint8)


def _per_channel(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """int8 values [N, K] and float64 scales [N] -> the per-channel quantised tensor they make."""
    with _fbgemm():
        return torch._make_per_channel_quantized_tensor(values, scales, torch.zeros_like(scales, dtype=torch.long), 0)


class Int8Weights:
    """Where int8 layers get their per-channel weights, by key: quantised from the float weight,
    or taken from an earlier quantisation's `state()` (`models.int8_cache`), in which case the
    float weight is never read."""

    def __init__(self, stored: dict[str, torch.Tensor] | None = None, keep: bool = False):
        """`keep`: remember every weight handed out, for `state()`."""
        self.stored, self.keep = stored or {}, keep
        self.kept: dict[str, torch.Tensor] = {}
        self.quantized: list[str] = []  # keys quantised from a float weight (not in `stored`)

    def __call__(self, key: str, weight: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The per-channel int8 weight of `key`; `weight` gives the [N, K] float weight and is called
        only when `key` is not stored."""
        if f"{key}.int8" in self.stored:
            q = _per_channel(self.stored[f"{key}.int8"], self.stored[f"{key}.scales"])
        else:
            q = _quantize_per_channel(weight())
            self.quantized.append(key)
        if self.keep:
            self.kept[key] = q
        return q

    def state(self) -> dict[str, torch.Tensor]:
        """Every kept weight as `<key>.int8` [N, K] int8 and `<key>.scales` [N] float64, handed
        over: each is dropped here as it is converted, so a model's weights are held twice at most."""
        state = {}
        while self.kept:
            key, q = self.kept.popitem()
            state[f"{key}.int8"], state[f"{key}.scales"] = q.int_repr(), q.q_per_channel_scales()
        return state


class _RowQuantGemm:
    """x W^T with W int8 per output channel and each row of x quantised by itself (W8A8).

    fbgemm's dynamic GEMM quantises its whole input with one range. Each row is divided by its
    own absolute maximum first, and one fixed row [1, -1, 0, ...] is appended, so that range is
    always [-1, 1]: every row is quantised exactly as it would be alone, and the integer product
    (exact in int32) with per-element rescaling makes each output row independent of the others.
    Activations use 7 bits (fbgemm's `reduce_range`, which keeps AVX2's 16-bit pair sums from
    saturating), the same on every CPU.

    The weights are packed through torch's quantized tensors, deprecated in torch 2.13; when they
    are gone this raises at construction (tests/models/test_int8.py fails with it).
    """

    def __init__(self, weight: torch.Tensor):
        """`weight`: [N, K] float, quantised here, or an int8 per-channel quantised tensor."""
        qweight = weight if weight.is_quantized else _quantize_per_channel(weight)
        with _fbgemm():
            self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.out_features = qweight.shape[0]
        self.bounds = torch.zeros(1, qweight.shape[1])
        self.bounds[0, 0], self.bounds[0, -1] = 1.0, -1.0
        # The GEMV keeps its own copy of the int8 weight (int8_gemv.py says what it costs), taken
        # before packing: unpacking it again would cost a third of a cached model's load.
        self.gemv: Int8Gemv | Int4Gemv | None = gemv_for(qweight)

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """[M, K] fp32 -> [M, N] fp32."""
        if self.gemv is not None and rows.shape[0] <= GEMV_MAX_ROWS and gemv_enabled():
            return self.gemv(rows)  # bitwise what follows (int8_gemv.py), at nearer the memory's rate
        # abs().amax(): the same value as linalg's inf-norm, 4-13x faster on CPU (8 x 8960: 8 against 110 µs).
        peak = rows.abs().amax(dim=-1, keepdim=True).clamp_min_(1e-30)  # [M, 1]
        unit = torch.cat([rows / peak, self.bounds])
        return torch.ops.quantized.linear_dynamic(unit, self.packed, True)[:-1].mul_(peak)

    def quantized_weight(self) -> torch.Tensor:
        """[N, K] int8 per-channel quantised tensor."""
        return torch.ops.quantized.linear_unpack(self.packed)[0]

    def dequantized(self) -> torch.Tensor:
        return self.quantized_weight().dequantize()

    def select_outputs(self, ids: torch.Tensor) -> _RowQuantGemm:
        """The GEMM of output channels `ids` [n] alone: each computes what it computes here."""
        q = self.quantized_weight()
        selected = _RowQuantGemm(_per_channel(q.int_repr()[ids], q.q_per_channel_scales()[ids]))
        if isinstance(self.gemv, Int4Gemv):  # a drafter's 4-bit steps: the same channels' 4-bit rows
            selected.gemv = self.gemv.select_outputs(ids)
        return selected


class Int8Linear(torch.nn.Module):
    """y = x W^T + b in W8A8 (`_RowQuantGemm`), with the input channels that carry activation
    outliers in a group of their own.

    A few input channels (down_proj's above all: its inputs `act(gate) * up` reach 10-400x their
    median) would set every row's scale and leave the rest a handful of levels. `outliers` names
    them (`calibrate_outliers`); they are quantised per row among themselves by a second, narrow
    GEMM, so both groups keep their resolution and every row stays independent of the others.
    """

    def __init__(
        self,
        linear: torch.nn.Linear,
        outliers: torch.Tensor | list[torch.Tensor] | None = None,
        weights: Int8Weights | None = None,
        key: str = "weight",
    ):
        """`outliers`: input channels quantised apart from the rest, or several such groups (inputs of
        different scales side by side, as an EAGLE head's token embedding and feature); `weights`,
        `key`: where the int8 weight comes from (default: quantised from `linear`'s)."""
        super().__init__()
        weights = weights or Int8Weights()
        w = linear.weight.detach()
        groups = [outliers] if isinstance(outliers, torch.Tensor) else list(outliers or [])
        groups = [g.sort().values for g in groups if len(g)]
        if not groups:
            channels, gemms = None, [_RowQuantGemm(weights(key, lambda: w))]
        else:
            inliers = torch.ones(linear.in_features, dtype=torch.bool)
            for g in groups:
                inliers[g] = False
            channels = [inliers.nonzero().squeeze(1), *groups]  # [K - k], [k_1], ...
            parts = ["inliers", "outliers", *(f"outliers{i}" for i in range(2, len(groups) + 1))]
            gemms = [_RowQuantGemm(weights(f"{key}.{part}", lambda c=c: w[:, c])) for part, c in zip(parts, channels)]
        self._assign(gemms, channels, None if linear.bias is None else linear.bias.detach().float(), linear.in_features)

    def _assign(
        self,
        gemms: list[_RowQuantGemm],
        channels: list[torch.Tensor] | None,
        bias: torch.Tensor | None,
        in_features: int,
    ) -> None:
        self._gemms, self.channels = gemms, channels
        self.bias = None if bias is None else torch.nn.Parameter(bias, requires_grad=False)
        self.in_features, self.out_features = in_features, gemms[0].out_features
        self._dense: torch.Tensor | None = None

    @classmethod
    def from_parts(
        cls,
        gemms: list[_RowQuantGemm],
        channels: list[torch.Tensor] | None,
        bias: torch.Tensor | None,
        in_features: int,
    ) -> Int8Linear:
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer._assign(gemms, channels, bias, in_features)
        return layer

    def select_outputs(self, ids: torch.Tensor) -> Int8Linear:
        """A layer of output channels `ids` [n] alone (a reduced LM head), each computed exactly
        as it is here."""
        bias = None if self.bias is None else self.bias.detach()[ids]
        return Int8Linear.from_parts(
            [gemm.select_outputs(ids) for gemm in self._gemms], self.channels, bias, self.in_features
        )

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised weight [out, in] (fp32), for code that reads a layer's rows (a reduced
        draft head): one fp32 copy, made on first use and kept. Shapes come from in/out_features."""
        if self._dense is None:
            if self.channels is None:
                self._dense = self._gemms[0].dequantized()
            else:
                self._dense = torch.empty(self.out_features, self.in_features)
                for channels, gemm in zip(self.channels, self._gemms):
                    self._dense[:, channels] = gemm.dequantized()
        return self._dense

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """[..., in] -> [..., out] in x's dtype."""
        rows = x.reshape(-1, self.in_features).float()
        if self.channels is None:
            y = self._gemms[0](rows)
        else:
            y = sum(gemm(rows.index_select(1, c)) for c, gemm in zip(self.channels, self._gemms))
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        k = [] if self.channels is None else [len(c) for c in self.channels[1:]]
        return f"in_features={self.in_features}, out_features={self.out_features}, w8a8 per-token, outlier groups {k}"


class _SharedInputGemm:
    """One `Int8Linear` over sibling projections that a decoder layer feeds the same tensor
    (q / k / v, gate / up): their rows quantised once and one GEMM call instead of one each.

    Each output channel computes exactly what its own layer computes (per-channel weights, per-row
    activations, an exact integer product), so fusing changes no bit. The first projection called
    with an input computes them all; the others take their slice of that result, which is dropped
    once every projection had its share. A call with any other input computes afresh, so a host
    that feeds the projections different tensors gets the right answer, only without the saving.
    """

    def __init__(self, linears: list[torch.nn.Linear], weights: Int8Weights | None = None, key: str = "weight"):
        gemm = _RowQuantGemm((weights or Int8Weights())(key, lambda: torch.cat([m.weight.detach() for m in linears])))
        bias = (
            None
            if all(m.bias is None for m in linears)
            else torch.cat(
                [m.bias.detach().float() if m.bias is not None else torch.zeros(m.out_features) for m in linears]
            )
        )
        self.linear = Int8Linear.from_parts([gemm], None, bias, linears[0].in_features)
        ends = list(itertools.accumulate(m.out_features for m in linears))
        self.spans = list(zip([0, *ends[:-1]], ends))  # each projection's output columns
        self._input, self._version, self._output, self._pending = None, -1, None, set()

    def output(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """[..., in] -> [..., out of projection `index`]."""
        version = _version(x)
        if x is not self._input or version != self._version or index not in self._pending:
            self._input, self._version, self._output = x, version, self.linear(x)
            self._pending = set(range(len(self.spans)))
        output = self._output[..., slice(*self.spans[index])]
        self._pending.discard(index)
        if not self._pending:
            self._input = self._output = None
        return output


def _version(x: torch.Tensor) -> int:
    """x's in-place write counter; inference-mode tensors keep none (-1: identity alone decides)."""
    return -1 if x.is_inference() else x._version


class Int8Projection(torch.nn.Module):
    """One projection of a `_SharedInputGemm`, in its layer's place: [..., in] -> [..., out]."""

    def __init__(self, group: _SharedInputGemm, index: int):
        super().__init__()
        self._group, self._index = group, index  # the group is not a module: shared, not registered twice
        self.in_features = group.linear.in_features
        self.out_features = group.spans[index][1] - group.spans[index][0]

    @property
    def weight(self) -> torch.Tensor:
        """The dequantised weight [out, in] (fp32), as `Int8Linear.weight`."""
        return self._group.linear.weight[slice(*self._group.spans[self._index])]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._group.output(x, self._index)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, w8a8 per-token, one GEMM with its siblings"


# Projections every supported decoder layer (Llama, Qwen2, Mistral naming) feeds the same tensor.
SHARED_INPUT_PROJECTIONS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


# The project's own calibration text: prose, code, arithmetic and chat, as the tasks have them.
CALIBRATION_TEXT = (
    "The museum opens at nine, and by noon the hall with the old maps is always crowded.\n"
    "def moving_average(values, window):\n    total = sum(values[:window])\n    out = [total / window]\n"
    "    for i in range(window, len(values)):\n        total += values[i] - values[i - window]\n"
    "        out.append(total / window)\n    return out\n"
    "A train leaves at 3:15 pm and travels 180 km at 72 km/h, so it arrives 2.5 hours later, at 5:45 pm.\n"
    "Translate into German: The weather will improve tomorrow afternoon.\n"
    "Q: Which planet has the shortest year? A: Mercury, at about 88 Earth days.\n"
)
OUTLIER_SHARE = 1 / 64  # of each down_proj's input channels given their own group (140 of 8960)


@torch.no_grad()
def calibrate_outliers(
    model: PreTrainedModel, tokenizer, text: str = CALIBRATION_TEXT, share: float = OUTLIER_SHARE
) -> dict[str, torch.Tensor]:
    """For each down_proj (the MLP's output projection): the `share` of its input channels with
    the largest magnitude on `text`, by module name."""
    ids = tokenizer(text, return_tensors="pt").input_ids.to(model.device)
    return input_outliers(model, lambda: model(ids[:, : model.config.max_position_embeddings]), ("down_proj",), share)


@torch.no_grad()
def input_outliers(
    module: torch.nn.Module, run: Callable[[], object], suffixes: tuple[str, ...], share: float = OUTLIER_SHARE
) -> dict[str, torch.Tensor]:
    """For each linear layer of `module` whose name ends with one of `suffixes`: the `share` of its
    input channels with the largest magnitude while `run()` runs, by module name."""
    peaks: dict[str, torch.Tensor] = {}

    def record(name):
        def hook(_module, args):
            x = args[0].detach().float().reshape(-1, args[0].shape[-1]).abs().amax(0)
            peaks[name] = x if name not in peaks else torch.maximum(peaks[name], x)

        return hook

    handles = [
        m.register_forward_pre_hook(record(n))
        for n, m in module.named_modules()
        if isinstance(m, torch.nn.Linear) and n.endswith(suffixes)
    ]
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return {name: peak.topk(max(1, int(len(peak) * share))).indices for name, peak in peaks.items()}


def _share_input_gemms(
    name: str, module: torch.nn.Module, outliers: dict[str, torch.Tensor], weights: Int8Weights
) -> None:
    """Puts each group of `SHARED_INPUT_PROJECTIONS` that `module` has whole (dense, one input
    width, no outlier channels) on one int8 GEMM, in place."""
    for names in SHARED_INPUT_PROJECTIONS:
        linears = [getattr(module, n, None) for n in names]
        if (
            all(isinstance(m, torch.nn.Linear) for m in linears)
            and len({m.in_features for m in linears}) == 1
            and not any(f"{name}.{n}" in outliers for n in names)
        ):
            group = _SharedInputGemm(linears, weights, f"{name}.{'+'.join(names)}")
            for index, projection in enumerate(names):
                setattr(module, projection, Int8Projection(group, index))


def int8_products(model: torch.nn.Module) -> list[_RowQuantGemm]:
    """Every W8A8 product of `model`, once each (a shared-input group's one, not per projection)."""
    gemms: dict[int, _RowQuantGemm] = {}
    for module in model.modules():
        layer = module._group.linear if isinstance(module, Int8Projection) else module
        if isinstance(layer, Int8Linear):
            gemms.update((id(g), g) for g in layer._gemms)
    return list(gemms.values())


QUANTIZATIONS = {"int8": Int8Linear, "int8-weight": Int8WeightLinear, "int8-dynamic": DynamicInt8Linear}


def quantized_copy(model: PreTrainedModel, kind: str, keep_head: bool = False) -> PreTrainedModel:
    """A copy of `model` whose decoder linear layers (and LM head, unless `keep_head`) are int8.

    Every other parameter and buffer (embeddings, norms) is shared with `model`, not copied;
    `model` itself is not modified.
    """
    # Share tensors: deepcopy maps every parameter and buffer to itself.
    memo = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return quantize_linears(copy.deepcopy(model, memo), kind, keep_head)


def quantize_linears(
    model: PreTrainedModel,
    kind: str,
    keep_head: bool = False,
    outliers: dict[str, torch.Tensor] | None = None,
    weights: Int8Weights | None = None,
) -> PreTrainedModel:
    """`model` with its decoder linear layers (and LM head, unless `keep_head`) replaced, in place
    (int8: q / k / v and gate / up each on one shared GEMM). int8 only: `outliers`, input channels
    kept in a group of their own, by module name; `weights`, where the int8 weights come from
    (keyed by module name)."""
    if model.device.type != "cpu":
        raise ValueError(f"{kind} runs on CPU only (fbgemm / CPU int8 kernels), the model is on {model.device}")
    head = model.get_output_embeddings()
    quantize_module(model, kind, skip=(head,) if keep_head else (), outliers=outliers, weights=weights)
    return model.eval()


def quantize_module(
    module: torch.nn.Module,
    kind: str,
    skip: tuple[torch.nn.Module, ...] = (),
    outliers: dict[str, torch.Tensor] | None = None,
    weights: Int8Weights | None = None,
) -> torch.nn.Module:
    """Every `torch.nn.Linear` of `module` but those in `skip` replaced by `kind`, in place (see
    `quantize_linears`; module names are relative to `module`)."""
    if kind not in QUANTIZATIONS:
        raise ValueError(f"quantization {kind!r} is not one of {sorted(QUANTIZATIONS)}")
    weights = weights or Int8Weights()
    for module_name, parent in list(module.named_modules()):
        if kind == "int8":
            _share_input_gemms(module_name, parent, outliers or {}, weights)
        for child_name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear) and not any(child is s for s in skip):
                name = f"{module_name}.{child_name}" if module_name else child_name
                extra = {"weights": weights, "key": name} if kind == "int8" else {}
                if outliers and name in outliers:
                    extra["outliers"] = outliers[name]
                setattr(parent, child_name, QUANTIZATIONS[kind](child, **extra))
    return module
