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
many rows. It keeps its own unpacked copy of the int8 weight: fbgemm's packed object holds only
its packed layout, and unpacking builds a new tensor (about 80 ms for a 1.5B MLP weight), so an
int8 model holds its weights twice, about 1.5 GB more for Qwen2.5-Coder-1.5B.

The kernel is compiled on first use with the C compiler Inductor uses (`$CC`, else `cc`) into
the project's cache, once per source and compiler. Where there is no x86-64 CPU with AVX2 and FMA,
no compiler, or the build fails, it is not used (one log line) and fbgemm serves every row count.
`fbgemm_only()` turns it off within a block, for comparisons.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import functools
import hashlib
import logging
import os
import platform
import subprocess
import time
from pathlib import Path

import torch

from .offline import cache_root

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("int8_gemv.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
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


class _Weight(ctypes.Structure):
    _fields_ = [
        ("weight", ctypes.c_void_p),
        ("colsum", ctypes.c_void_p),
        ("multiplier", ctypes.c_void_p),
        ("k", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("inverse_scale", ctypes.c_float),
        ("zero_point", ctypes.c_int32),
    ]


def _cpu_supported() -> str | None:
    """Why this CPU cannot run the kernel, or None."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"a {platform.machine()} CPU, not x86-64"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return f"torch reports CPU capability {capability}, not AVX2"
    return None


def _build() -> Path:
    """The kernel's shared library, compiled into the cache unless it is there."""
    compiler = os.environ.get("CC", "cc")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256("\n".join([SOURCE.read_text(), compiler, version, *FLAGS]).encode()).hexdigest()[:16]
    path = cache_root() / "kernels" / f"int8_gemv-{key}.so"
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        subprocess.run([compiler, *FLAGS, str(SOURCE), "-o", str(tmp)], capture_output=True, text=True, check=True)
        os.replace(tmp, path)  # whole or not at all: another process may be building it too
    finally:
        tmp.unlink(missing_ok=True)
    logger.info("built the int8 GEMV kernel in %.1f s: %s", time.perf_counter() - start, path)
    return path


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernel, or None (with the reason logged once) where it cannot run."""
    reason = _cpu_supported()
    if reason is None:
        try:
            lib = ctypes.CDLL(str(_build()))
        except (OSError, subprocess.CalledProcessError) as err:
            detail = getattr(err, "stderr", None) or err
            reason = f"it could not be built or loaded ({str(detail).strip()[:300]})"
        else:
            lib.w8a8_gemm.argtypes = [
                ctypes.POINTER(_Weight),
                ctypes.c_void_p,
                ctypes.c_int64,
                ctypes.c_int64,
                ctypes.c_void_p,
                ctypes.c_int64,
                ctypes.c_int,
            ]
            lib.w8a8_gemm.restype = ctypes.c_int
            return lib
    logger.warning("int8 GEMV kernel not used: %s; fbgemm's GEMM serves every row count", reason)
    return None


@functools.cache
def _activation_quantization() -> tuple[float, int]:
    """fbgemm's scale and zero point for rows whose range is [-1, 1], with 7-bit activations."""
    scale, zero_point = torch._choose_qparams_per_tensor(torch.tensor([-1.0, 1.0]), True)
    return scale, zero_point


class Int8Gemv:
    """x W^T for `_RowQuantGemm`'s per-channel int8 weight W, on up to `GEMV_MAX_ROWS` rows."""

    def __init__(self, qweight: torch.Tensor, lib: ctypes.CDLL):
        """`qweight`: [N, K] int8 per-channel quantised with zero points 0, contiguous; it is read
        in place, and this object keeps it."""
        if not qweight.is_contiguous() or bool(qweight.q_per_channel_zero_points().any()):
            raise ValueError("the int8 GEMV needs a contiguous weight with symmetric per-channel scales")
        scale, zero_point = _activation_quantization()
        act_scale = torch.tensor(scale, dtype=torch.float32)
        self._lib, self.qweight = lib, qweight
        self.colsum = qweight.int_repr().sum(1, dtype=torch.int32)  # [N]
        self.multiplier = act_scale * qweight.q_per_channel_scales().float()  # [N], fbgemm's float product
        self.out_features, self.in_features = qweight.shape
        self._weight = _Weight(
            qweight.data_ptr(),
            self.colsum.data_ptr(),
            self.multiplier.data_ptr(),
            self.in_features,
            self.out_features,
            float(1.0 / act_scale),
            zero_point,
        )

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """[M, K] fp32 -> [M, N] fp32, M <= GEMV_MAX_ROWS."""
        if rows.stride(-1) != 1:
            rows = rows.contiguous()
        out = rows.new_empty(rows.shape[0], self.out_features)
        status = self._lib.w8a8_gemm(
            self._weight, rows.data_ptr(), rows.stride(0), rows.shape[0], out.data_ptr(), self.out_features,
            torch.get_num_threads(),
        )  # fmt: skip
        if status:
            raise RuntimeError(f"int8 GEMV failed on {rows.shape[0]} rows (1-64 allowed, or out of memory)")
        return out


def gemv_for(qweight: torch.Tensor) -> Int8Gemv | None:
    """The kernel over `qweight`, or None where it cannot run."""
    lib = library()
    return None if lib is None else Int8Gemv(qweight, lib)


def gemv_enabled() -> bool:
    """False inside `fbgemm_only()`."""
    return _enabled.get()
