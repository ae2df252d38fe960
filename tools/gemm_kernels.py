"""One-row int8 GEMM kernels per layer shape of a model, with weights read from memory.

    python tools/gemm_kernels.py qwen2.5-coder-0.5b-instruct [--threads 2] [--cold-gb 1.0] [--rows 1]

For each of the model's projection shapes (q/k/v fused, o, gate/up fused, down, LM head), times
`--rows` new rows through the project's int8 GEMV and each int8 kernel torch ships for CPUs, cycling over enough copies of the
weight (`--cold-gb`) that each call reads it from memory, not from the last-level cache:

* `int8 gemv`: the project's kernel (`models.int8_gemv`), what the int8 models run on up to
  `GEMV_MAX_ROWS` rows, bitwise fbgemm's output;
* `int4 gemv`: the 4-bit product a drafter's steps run (`models.int4_gemv`, other numerics);
* `fbgemm dynamic`: `quantized::linear_dynamic`, what they run on more rows (`_RowQuantGemm`: the
  rows plus the bounds row, activations quantised at run time);
* `fbgemm given qparams`: the same kernel told the input's range instead of measuring it
  (`quantized::linear_with_input_q_dq_qweight_dq_output_fp32`), bitwise the same output;
* `int8pack fp32` / `int8pack bf16`: `aten._weight_int8pack_mm`, weight-only int8 (other numerics);
* `onednn`: `onednn.qlinear_pointwise`, uint8 x int8 with an fp32 output;
* `int_mm`: `aten._int_mm`, int8 x int8 with exact int32 sums (the epilogue would be ours);
* `inductor gemv`: an int32 multiply-and-sum over K compiled by Inductor (exact int32 sums too).

Medians in µs and the weight bytes read per second (each kernel's own bytes: the 4-bit
product's packed levels, scales and minima). `--kernels` times only the named ones. Run it on an
idle machine; prefix the AVX2 limits (docs/results/int8.md) to emulate an AVX2-only CPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from transformers import AutoConfig

from viasd_adapters.hardware import device_label
from viasd_adapters.models.int4_gemv import Int4Gemv
from viasd_adapters.models.offline import ensure_cached
from viasd_adapters.models.quantize import _RowQuantGemm


def shapes(model: str) -> dict[str, tuple[int, int]]:
    """Projection name -> (K in, N out) of one decoder layer and the LM head."""
    c = AutoConfig.from_pretrained(ensure_cached(model))
    d = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    h, q, kv = c.hidden_size, c.num_attention_heads * d, c.num_key_value_heads * d
    i = c.intermediate_size
    return {"qkv": (h, q + 2 * kv), "o": (q, h), "gate_up": (h, 2 * i), "down": (i, h), "lm_head": (h, c.vocab_size)}


def kernels(k: int, n: int, copies: int, rows: int) -> dict[str, tuple[Callable[[int], object], int]]:
    """Kernel name -> (call(i) on copy i of one random [n, k] int8 weight, the bytes a call reads)."""
    gemms = [_RowQuantGemm(torch.randn(n, k)) for _ in range(copies)]
    unit = torch.rand(rows + 1, k) * 2 - 1
    unit[-1] = 0
    unit[-1, 0], unit[-1, -1] = 1.0, -1.0  # the bounds row
    scale = 2 / 127  # fbgemm's reduce_range parameters for [-1, 1]
    zero_point = round(1 / scale)
    q = [g.quantized_weight() for g in gemms]
    ints = [w.int_repr().contiguous() for w in q]
    w_scales = [w.q_per_channel_scales().float() for w in q]
    onednn = [torch.ops.onednn.qlinear_prepack(w, [1, k]) for w in ints]
    x, xb, xu = unit[:-1].contiguous(), unit[:-1].bfloat16(), torch.randint(0, 127, (rows, k), dtype=torch.uint8)
    zeros = torch.zeros(n, dtype=torch.long)
    xs = torch.randint(-64, 64, (rows, k), dtype=torch.int8)
    gemv_kernels: dict[str, Callable[[int], object]] = {}
    if gemms[0].gemv is not None:
        four_bit = Int4Gemv(q[0].dequantize())  # copies of one weight's levels: the same bytes to read
        four_bits = [Int4Gemv.from_args(tuple(t.clone() for t in four_bit.args), k) for _ in range(copies)]
        gemv_kernels = {"int8 gemv": lambda i: gemms[i].gemv(x), "int4 gemv": lambda i: four_bits[i](x)}
    gemv = torch.compile(lambda a, w: (a[:, None].to(torch.int32) * w.to(torch.int32)).sum(-1), dynamic=False)
    calls = {
        **gemv_kernels,
        "fbgemm dynamic": lambda i: torch.ops.quantized.linear_dynamic(unit, gemms[i].packed, True),
        "fbgemm given qparams": lambda i: torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
            unit, scale, zero_point, gemms[i].packed
        ),
        "int8pack fp32": lambda i: torch.ops.aten._weight_int8pack_mm(x, ints[i], w_scales[i]),
        "int8pack bf16": lambda i: torch.ops.aten._weight_int8pack_mm(xb, ints[i], w_scales[i].bfloat16()),
        "onednn": lambda i: torch.ops.onednn.qlinear_pointwise(
            xu, 0.01, 0, onednn[i], w_scales[i], zeros, None, 1.0, 0, torch.float32, "none", [], ""
        ),
        "int_mm": lambda i: torch._int_mm(xs, ints[i].t()),
        "inductor gemv": lambda i: gemv(xs, ints[i]),
    }
    four_bit_bytes = sum(t.nbytes for t in four_bits[0].args) if gemv_kernels else 0
    return {name: (call, four_bit_bytes if name == "int4 gemv" else k * n) for name, call in calls.items()}


def median_us(call: Callable[[int], object], copies: int, rounds: int) -> float:
    for i in range(copies):
        call(i)
    times = []
    for _ in range(rounds):
        for i in range(copies):
            begin = time.perf_counter()
            call(i)
            times.append(time.perf_counter() - begin)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a model name of the zoo, e.g. qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cold-gb", type=float, default=1.0, help="weight copies cycled per shape, in GB")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rows", type=int, default=1, help="rows per call (a decode step: 1)")
    parser.add_argument("--kernels", nargs="+", help="time only these kernels (names as in the table)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore", message=".*quantize.*deprecated")  # the packing path's own warning
    print(f"{args.model}, {args.rows} row(s), {args.threads} threads, {device_label(torch.device('cpu'))}")
    print("| shape (K x N) | kernel | µs | GB/s |\n|---|---|---|---|")
    for name, (k, n) in shapes(args.model).items():
        copies = max(2, int(args.cold_gb * 1e9 // (k * n)))
        for kernel, (call, nbytes) in kernels(k, n, copies, args.rows).items():
            if args.kernels and kernel not in args.kernels:
                continue
            us = median_us(call, copies, args.rounds)
            print(f"| {name} ({k} x {n}) | {kernel} | {us:.0f} | {nbytes / us / 1e3:.1f} |", flush=True)


if __name__ == "__main__":
    main()
