"""4-bit weights for a drafter's steps: the int8 GEMV's reads halved.

A one-row step of the int8 0.5B draft costs about what reading its weights costs (the GEMV streams
them near the memory's rate: docs/results/compiled.md), and the draft's steps are most of a
speculative round. Its weights in 4 bits read in about half the time. A drafter's rounding decides
only which tokens it proposes, never the output (the target verifies every token), so a draft
that rounds its weights coarser stays lossless; it costs acceptance only, measured in
docs/results/drafting.md.

`four_bit_copy(model)` copies a W8A8 model (sharing its tensors) with each int8 product
(`quantize._RowQuantGemm`) given 4-bit weights for calls of up to `GEMV_MAX_ROWS` rows (decode
steps, short blocks); longer inputs (a prompt) keep fbgemm's int8 GEMM. So a row's output depends
on how many rows came with it: such a model drafts (`ModelDrafter(quantize="int4")`, what
`auto` weighs as the variant "int8+int4"), it is never a target.

The format (int4_gemv.c): per group of `GROUP` input channels a float scale and minimum and 16
levels (asymmetric: a skewed group uses all of them), the span chosen for the least squared error;
each row quantised to int8 by its own absolute maximum; exact integer dot products per group.
"""

from __future__ import annotations

import copy
import hashlib
import logging
import time
from pathlib import Path
from typing import TypeVar

import torch

from . import native, tensor_cache
from .int8_gemv import Int8Gemv
from .offline import cache_root

logger = logging.getLogger(__name__)
Model = TypeVar("Model", bound=torch.nn.Module)

GROUP = 64  # input channels per scale and minimum (int4_gemv.h)
# Fractions of a group's range its 16 levels span, centred on the range: letting the extremes clip a
# little often rounds the rest better; each group keeps the one of least squared error.
RANGE_FRACTIONS = (1.0, 0.95, 0.9, 0.85, 0.8)
FORMAT = 1  # of the cached 4-bit weights: raise when their meaning changes
# Weights from which a model's 4-bit weights are cached (the 0.5B draft's take 11-14 s to make);
# a smaller model's are made in under a second.
CACHED_FROM_WEIGHTS = 2**25
_ARGS = ("packed", "scales", "minima")


def quantize_int4(weight: torch.Tensor, rows_per_chunk: int = 2048) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, K] float -> (packed [N, Kp / 2] uint8, scales [N, Kp / GROUP], minima [N, Kp / GROUP] fp32),
    Kp = K rounded up to GROUP (zero weights past K): weight = scale * u + minimum, u in [0, 15],
    laid out as int4_gemv.h says. `rows_per_chunk` rows at a time keep the candidates' temporaries
    in cache."""
    n, k = weight.shape
    padded = -(-k // GROUP) * GROUP
    packed = torch.empty(n, padded // 2, dtype=torch.uint8)
    scales, minima = torch.empty(n, padded // GROUP), torch.empty(n, padded // GROUP)
    for start in range(0, n, rows_per_chunk):
        rows = slice(start, min(start + rows_per_chunk, n))
        packed[rows], scales[rows], minima[rows] = _quantize_rows(weight[rows], padded)
    return packed, scales, minima


def _quantize_rows(weight: torch.Tensor, padded: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n, k = weight.shape
    w = torch.zeros(n, padded, dtype=torch.float32)
    w[:, :k] = weight
    groups = w.reshape(n, padded // GROUP, GROUP)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)  # [n, G, 1]
    best = None
    for fraction in RANGE_FRACTIONS:
        scales = ((high - low) * fraction / 15).clamp_min(1e-12)
        minima = (low + high) / 2 - scales * 7.5
        levels = ((groups - minima) / scales).round_().clamp_(0, 15)
        error = (levels * scales + minima - groups).square_().sum(-1, keepdim=True)
        if best is None:
            best = [levels, scales, minima, error]
        else:
            better = error < best[3]
            best = [torch.where(better, new, old) for new, old in zip((levels, scales, minima, error), best)]
    levels, scales, minima, _ = best
    nibbles = levels.to(torch.uint8).reshape(n, padded // GROUP, 2, GROUP // 2)
    packed = nibbles[:, :, 0] | (nibbles[:, :, 1] << 4)  # byte j: weight j, weight j + 32
    return packed.reshape(n, padded // 2), scales.reshape(n, -1), minima.reshape(n, -1)


def dequantize_int4(packed: torch.Tensor, scales: torch.Tensor, minima: torch.Tensor) -> torch.Tensor:
    """The inverse of `quantize_int4`: [N, Kp] fp32 (the padding included)."""
    n = packed.shape[0]
    halves = packed.reshape(n, -1, 1, GROUP // 2)
    levels = torch.cat([halves & 0x0F, halves >> 4], dim=2).reshape(n, -1, GROUP).float()
    return (levels * scales[:, :, None] + minima[:, :, None]).reshape(n, -1)


class Int4Gemv:
    """x W^T with W in 4 bits (`quantize_int4`), on up to `int8_gemv.GEMV_MAX_ROWS` rows."""

    op_name = "w4a8_gemv"  # the operator in torch.ops.viasd

    def __init__(self, weight: torch.Tensor):
        """`weight`: [N, K] float. RuntimeError where the native operators are not built."""
        _require_native()
        self.args = quantize_int4(weight)  # the operator's arguments after the rows
        self.out_features, self.in_features = weight.shape

    @classmethod
    def from_args(cls, args: tuple[torch.Tensor, torch.Tensor, torch.Tensor], in_features: int) -> Int4Gemv:
        """The product of weights `quantize_int4` made earlier: (packed, scales, minima)."""
        gemv = cls.__new__(cls)
        gemv.args, gemv.out_features, gemv.in_features = args, args[0].shape[0], in_features
        return gemv

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """[M, K] fp32 -> [M, N] fp32."""
        return torch.ops.viasd.w4a8_gemv(rows, *self.args)

    def select_outputs(self, ids: torch.Tensor) -> Int4Gemv:
        """The product of output channels `ids` [n] alone, each channel's 4-bit values unchanged."""
        return Int4Gemv.from_args(tuple(t[ids].contiguous() for t in self.args), self.in_features)


def _require_native() -> None:
    reason = native.load()
    if reason is not None:
        raise RuntimeError(f"4-bit draft weights need the project's native operators: {reason}")


def four_bit_copy(model: Model) -> Model:
    """A copy of the W8A8 `model` whose products of up to `GEMV_MAX_ROWS` rows read 4-bit weights;
    every tensor is shared, `model` is unchanged. Where `model` has a compiled decode step, the
    copy gets its own. The 4-bit weights of a model of `CACHED_FROM_WEIGHTS` or more are kept in
    `$VIASD_CACHE/int4/`, keyed by the int8 weights they are made from. ValueError for a model
    without W8A8 products, RuntimeError where the native operators are not built."""
    # quantize and compiled import this module
    from .compiled import attach_step, decode_step
    from .quantize import int8_products

    gemms = int8_products(model)
    if not gemms:
        raise ValueError(
            "4-bit draft steps are made from a W8A8 draft's int8 weights, and this draft has none:"
            " load it with runtime.draft_weights=int8"
        )
    _require_native()
    start = time.perf_counter()
    sources = [_int8_source(gemm) for gemm in gemms]
    path, key = _cache_file(sources) if sum(w.numel() for w, _ in sources) >= CACHED_FROM_WEIGHTS else (None, {})
    stored = None if path is None else tensor_cache.read(path, key, "4-bit weights", "making them anew")
    if stored is None:
        levels = [quantize_int4(gemm.dequantized()) for gemm in gemms]
    else:
        levels = [tuple(stored[f"{i}.{a}"] for a in _ARGS) for i in range(len(gemms))]
    memo = {id(t): t for t in [*model.parameters(), *model.buffers()]}  # deepcopy shares what it maps
    for gemm, (weight, _), args in zip(gemms, sources, levels):
        four_bit = copy.copy(gemm)  # fbgemm's packed int8 weights shared: long blocks still run them
        four_bit.gemv = Int4Gemv.from_args(args, weight.shape[1])
        memo[id(gemm)] = four_bit
    duplicate = copy.deepcopy(model, memo)
    how = "made" if stored is None else f"read from {path}"
    logger.info("4-bit step weights for %d products %s in %.1f s", len(gemms), how, time.perf_counter() - start)
    if stored is None and path is not None:
        state = {f"{i}.{a}": t for i, args in enumerate(levels) for a, t in zip(_ARGS, args)}
        tensor_cache.write(path, key, state, "4-bit weights")
    if decode_step(model) is not None:
        attach_step(duplicate)
    return duplicate


def _int8_source(gemm) -> tuple[torch.Tensor, torch.Tensor]:
    """What identifies a W8A8 product's weights: its int8 weight [N, K] and per-channel factors [N],
    from the int8 GEMV's own copy where it has one (unpacking fbgemm's costs 2-3 s for the 0.5B)."""
    if isinstance(gemm.gemv, Int8Gemv):
        weight, _, multipliers, *_ = gemm.gemv.args
        return weight, multipliers
    q = gemm.quantized_weight()
    return q.int_repr().contiguous(), q.q_per_channel_scales()


def _cache_file(sources: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[Path, dict]:
    """The cache file of the 4-bit weights made from these int8 weights, and its key."""
    digest = hashlib.sha256()
    for weight, scales in sources:
        digest.update(str(tuple(weight.shape)).encode())
        digest.update(weight.numpy())
        digest.update(scales.contiguous().numpy())
    key = {"format": FORMAT, "group": GROUP, "range_fractions": list(RANGE_FRACTIONS), "int8": digest.hexdigest()}
    return cache_root() / "int4" / f"{digest.hexdigest()[:20]}.safetensors", key
