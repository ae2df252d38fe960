"""Cheaper draft models: int8 copies of a model's linear layers, sharing everything else.

A drafter's precision never changes a lossless output (the target decides every token), only
how often its drafts are accepted; docs/drafting.md has the measured cost and acceptance.

* "int8-weight": weight-only int8, per output channel; activations stay in the model's dtype
  and `torch.ops.aten._weight_int8pack_mm` multiplies (the kernel gpt-fast uses on CPU). That
  kernel's time grows with the rows fed (2 threads of a Sapphire Rapids, 896 -> 4864 in bf16: 0.26
  ms for 1 row, 0.78 for 8, 11 for 150, against 0.5-1.0 ms for the bf16 matmul), so forwards of
  more than `INT8_MAX_ROWS` rows (a prompt, a re-fed block) use the model's own weights, which the
  copy shares.
* "int8-dynamic": torch.ao dynamic quantisation (int8 weights and activations, fbgemm /
  onednn); the layer computes in fp32 and returns the model's dtype.
"""

from __future__ import annotations

import copy

import torch
from transformers import PreTrainedModel


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


QUANTIZATIONS = {"int8-weight": Int8WeightLinear, "int8-dynamic": DynamicInt8Linear}


def quantized_copy(model: PreTrainedModel, kind: str, keep_head: bool = False) -> PreTrainedModel:
    """A copy of `model` whose decoder linear layers (and LM head, unless `keep_head`) are int8.

    Every other parameter and buffer (embeddings, norms) is shared with `model`, not copied;
    `model` itself is not modified.
    """
    if kind not in QUANTIZATIONS:
        raise ValueError(f"quantization {kind!r} is not one of {sorted(QUANTIZATIONS)}")
    if model.device.type != "cpu":
        raise ValueError(f"int8 draft quantization runs on CPU only, the model is on {model.device}")
    # Share tensors: deepcopy maps every parameter and buffer to itself.
    memo = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    clone = copy.deepcopy(model, memo)
    head = clone.get_output_embeddings()
    for module_name, module in list(clone.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, torch.nn.Linear) and (child is not head or not keep_head):
                setattr(module, child_name, QUANTIZATIONS[kind](child))
    return clone.eval()
