"""The int8 product of a few rows: an AVX2 kernel that reads the weights once, near the memory's
rate, with bitwise fbgemm's result.

A decode step and a verify block multiply 1-8 rows by every weight. fbgemm's dynamic GEMM packs
the rows, writes an int32 buffer and requantises it in a second pass; on one or two rows it reads
the weights at about 0.64 of the rate a plain sum reads memory (docs/results/compiled.md). This
kernel (int8_gemv.c) streams each output channel's int8 weights once against every row's uint8
activations and writes the floats directly.

It computes bit for bit what `quantize._RowQuantGemm` computes with fbgemm: each row scaled into
[-1, 1] by its absolute maximum, quantised with fbgemm's fixed parameters for that range (7-bit
uint8, zero point 64), the exact integer dot products, then fbgemm's per-channel epilogue and the
row's maximum (tests/models/test_int8_gemv.py). Which kernel runs therefore changes no output:
row counts up to `GEMV_MAX_ROWS` take this one, more (a prompt) take fbgemm's, which is faster on
many rows. It keeps its own plain copy of the int8 weight, taken before fbgemm packs it: the
packed object holds only its packed layout. So an int8 model holds its weights twice, about
1.5 GB more for Qwen2.5-Coder-1.5B.

The kernel is one of the project's native operators (`torch.ops.viasd.w8a8_gemv`, native.py), built
on first use. Where they cannot be built or run, it is not used (one log line) and fbgemm serves
every row count. `fbgemm_only()` turns it off within a block, for comparisons.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools

import torch

from . import native

# Rows up to which the kernel beats fbgemm's GEMM over a layer's products (2 threads, weights read
# from memory; docs/results/compiled.md): on a Zen 3 1.24 / 1.23 / 1.20 / 1.15x for 1-4 rows and
# 0.94x for 6 (the 1.5B's layer); on the AVX2-emulated Xeon 1.2-1.5x one row, 0.92-1.04x three.
# The C side allows 64.
GEMV_MAX_ROWS = 4

_enabled: contextvars.ContextVar[bool] = contextvars.ContextVar("viasd_int8_gemv", default=True)


@contextlib.contextmanager
def fbgemm_only():
    """Within this block every int8 product runs fbgemm's GEMM (the same outputs, its speed)."""
    token = _enabled.set(False)
    try:
        yield
    finally:
        _enabled.reset(token)


@functools.cache
def _activation_quantization() -> tuple[float, int]:
    """fbgemm's scale and zero point for rows whose range is [-1, 1], with 7-bit activations."""
    scale, zero_point = torch._choose_qparams_per_tensor(torch.tensor([-1.0, 1.0]), True)
    return scale, zero_point


class Int8Gemv:
    """x W^T for `_RowQuantGemm`'s per-channel int8 weight W, on up to `GEMV_MAX_ROWS` rows."""

    op_name = "w8a8_gemv"  # the operator in torch.ops.viasd

    def __init__(self, qweight: torch.Tensor):
        """`qweight`: [N, K] int8 per-channel quantised with zero points 0."""
        if bool(qweight.q_per_channel_zero_points().any()):
            raise ValueError("the int8 GEMV needs symmetric per-channel scales")
        scale, zero_point = _activation_quantization()
        act_scale = torch.tensor(scale, dtype=torch.float32)
        weight = qweight.int_repr().contiguous()  # [N, K] int8
        multiplier = act_scale * qweight.q_per_channel_scales().float()  # [N], fbgemm's float product
        # `torch.ops.viasd.w8a8_gemv`'s arguments after the rows (a compiled graph passes them itself)
        self.args = (weight, _channel_sums(weight), multiplier, float(1.0 / act_scale), zero_point)
        self.out_features, self.in_features = qweight.shape

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """[M, K] fp32 -> [M, N] fp32, M <= GEMV_MAX_ROWS."""
        return torch.ops.viasd.w8a8_gemv(rows, *self.args)


def _channel_sums(weight: torch.Tensor) -> torch.Tensor:
    """[N] int32: each row of the [N, K] int8 `weight` summed, exactly. As an int8 product with
    ones (exact int32 sums): 2 ms for the 1.5B's MLP weight on a Zen 5, against 30 ms for
    `weight.sum(1)`, which made a tenth of a cached model's load."""
    try:
        return torch._int_mm(weight, torch.ones(weight.shape[1], 8, dtype=torch.int8))[:, 0].contiguous()
    except (RuntimeError, AttributeError):  # a torch without the CPU kernel
        return weight.sum(1, dtype=torch.int32)


def gemv_for(qweight: torch.Tensor) -> Int8Gemv | None:
    """The kernel over `qweight`, or None where it cannot run."""
    return None if native.load() is not None else Int8Gemv(qweight)


def gemv_enabled() -> bool:
    """False inside `fbgemm_only()`."""
    return _enabled.get()
