"""How far a one-token int8 step is from its GEMMs, without the profiler's own overhead.

    python tools/step_breakdown.py qwen2.5-coder-1.5b-instruct            # compiled step
    python tools/step_breakdown.py qwen2.5-coder-1.5b-instruct --eager    # transformers' forward
    python tools/step_breakdown.py qwen2.5-coder-1.5b-instruct --fbgemm   # fbgemm's GEMM for one row
    python tools/step_breakdown.py qwen2.5-coder-0.5b-instruct --draft-vocabulary qwen2.5-coder-0.5b-instruct-32768-sharegpt
    python tools/step_breakdown.py qwen2.5-coder-0.5b-instruct --weights int4   # a drafter's 4-bit steps

Times a runner call (one new token after `--context` cached, LM head and argmax included), then
every int8 GEMM that call makes (the decoder's and the LM head's, each fed one row through the
kernel the step uses: the int8 GEMV, or fbgemm's with `--fbgemm`) back to back: the step's time
if nothing but its GEMMs cost. Medians
of `--repeats` after 5 warm-up calls. Also the time to read the int8 weights once at the
machine's read bandwidth (an fp32 sum over 1 GB), the floor of a step. Run it on an idle machine; prefix the AVX2 limits
(docs/results/int8.md) to emulate an AVX2-only CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable

import torch

from viasd_adapters.hardware import device_label
from viasd_adapters.models import ModelSpec, load_model
from viasd_adapters.models.int4_gemv import four_bit_copy
from viasd_adapters.models.int8_gemv import fbgemm_only
from viasd_adapters.models.quantize import _RowQuantGemm, int8_products
from viasd_adapters.models.vocab import DraftVocabulary, ReducedHead
from viasd_adapters.runner import CausalLMRunner


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        fn()
        times.append(time.perf_counter() - begin)
    return statistics.median(times) * 1e3


def weight_bytes(gemm: _RowQuantGemm, gemv: bool) -> int:
    """What one row's product reads: the GEMV's own weight tensors, or fbgemm's int8 bytes."""
    if gemv and gemm.gemv is not None:
        return sum(t.nbytes for t in gemm.gemv.args if isinstance(t, torch.Tensor))
    return gemm.out_features * gemm.bounds.shape[1]


def read_bandwidth_gb_s(gigabytes: float = 1.0, repeats: int = 7) -> float:
    """This machine's read bandwidth at torch's threads: a sum over `gigabytes` of fp32 (median)."""
    data = torch.ones(int(gigabytes * 2**30) // 4)
    return data.numel() * 4 / 1e9 / (median_ms(data.sum, repeats) / 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a ModelSpec name, e.g. qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--eager", action="store_true", help="transformers' forward instead of the compiled step")
    parser.add_argument("--context", type=int, default=256, help="tokens cached before the timed one")
    parser.add_argument(
        "--fbgemm", action="store_true", help="fbgemm's GEMM for every row count (int8_gemv.fbgemm_only)"
    )
    parser.add_argument(
        "--draft-vocabulary", help="score only this DraftVocabulary's ids (a drafter's reduced LM head, FR-Spec)"
    )
    parser.add_argument(
        "--weights",
        choices=("int8", "int4"),
        default="int8",
        help="int4: a drafter's 4-bit steps (ModelDrafter(quantize='int4'))",
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=40)
    args = parser.parse_args()
    with fbgemm_only() if args.fbgemm else contextlib.nullcontext():
        measure(args)


def measure(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    loaded = load_model(ModelSpec(args.model, weights="int8", compile=not args.eager))
    model = loaded.model if args.weights == "int8" else four_bit_copy(loaded.model)
    head = ReducedHead(model, DraftVocabulary.load(args.draft_vocabulary)) if args.draft_vocabulary else None
    runner = CausalLMRunner(model, compiled=not args.eager, head=head)
    ids = torch.randint(100, 20000, (1, args.context + 1), generator=torch.Generator().manual_seed(0))
    runner.logits(ids[:, :-1], 1)

    def step() -> None:
        runner.crop(args.context)
        runner.logits(ids, 1).argmax()

    gemms = int8_products(model.get_decoder()) + int8_products(head or model.get_output_embeddings())
    rows = [torch.randn(1, gemm.bounds.shape[1]) for gemm in gemms]

    def gemms_only() -> None:
        for gemm, row in zip(gemms, rows):
            gemm(row)

    step_ms, gemm_ms = median_ms(step, args.repeats), median_ms(gemms_only, args.repeats)
    weight_gb = sum(weight_bytes(gemm, not args.fbgemm) for gemm in gemms) / 1e9
    bandwidth = read_bandwidth_gb_s()
    memory_ms = weight_gb / bandwidth * 1e3
    path = ("eager" if args.eager else "compiled") + (", fbgemm" if args.fbgemm else f", {args.weights} GEMV")
    if head is not None:
        path += f", {head.token_ids.numel()}-id head"
    print(f"{args.model} {args.weights}, {path}, {args.threads} threads, {device_label(loaded.model.device)}")
    print(f"step {step_ms:.1f} ms, its {len(gemms)} GEMMs alone {gemm_ms:.1f} ms, step / GEMMs {step_ms / gemm_ms:.2f}")
    print(
        f"weights read {weight_gb:.2f} GB, read bandwidth {bandwidth:.1f} GB/s (fp32 sum): memory time"
        f" {memory_ms:.1f} ms, step / memory time {step_ms / memory_ms:.2f}, GEMMs / memory time {gemm_ms / memory_ms:.2f}"
    )


if __name__ == "__main__":
    main()
