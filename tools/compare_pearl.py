"""PEARL against AR and plain SD on a real model pair: speed (interleaved, medians) and identity.

Every prompt is decoded by every decoder, in an order that rotates from prompt to prompt, so
slow phases of the machine hit all decoders alike. Speedups are medians over prompts of
(AR seconds / decoder seconds); identity compares each decoder's tokens with AR's.

Decoders, as NAME[@THREADS]:
  ar@N            autoregressive target, N torch threads
  sd@N            SpeculativeDecoder, ModelDrafter + LosslessVerifier, K = --sd-k, N threads
  pearl[-thread][-eager][-tiered][:GAMMA]
                  PearlDecoder: process backend unless -thread, window schedule unless -eager,
                  LosslessVerifier unless -tiered, gamma = --window unless :GAMMA
                  (target / draft threads: --pearl-threads)
  tiered-sd@N     SD with TieredVerifier (slim = target minus --skip-layers)

Example (bf16, 5 prompts, 64 tokens):
  python tools/compare_pearl.py --questions question.jsonl --prompts 5 --decoders ar@2,ar@1,sd@2,pearl,pearl-thread
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from viasd_adapters.decode import AutoregressiveDecoder, SpeculativeDecoder
from viasd_adapters.draft import ModelDrafter
from viasd_adapters.hosts.pearl import PearlDecoder
from viasd_adapters.models import ModelSpec, load_model
from viasd_adapters.pipeline import encode_prompt
from viasd_adapters.routing import RoutingMask, SlimModel
from viasd_adapters.verify import ConfidencePolicy, LosslessVerifier, TieredVerifier


def load_prompts(path: Path, count: int, offset: int) -> list[dict]:
    """`count` questions spread over the file (every len/count-th), first turn only."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    stride = max(1, len(rows) // max(count, 1))
    picked = rows[offset::stride][:count]
    return [{"id": r["question_id"], "category": r["category"], "text": r["turns"][0]} for r in picked]


class Threaded:
    """Runs a decoder with a fixed torch thread count (restored afterwards)."""

    def __init__(self, decoder, threads: int | None):
        self.decoder = decoder
        self.threads = threads

    def generate(self, *args, **kw):
        saved = torch.get_num_threads()
        if self.threads:
            torch.set_num_threads(self.threads)
        try:
            return self.decoder.generate(*args, **kw)
        finally:
            torch.set_num_threads(saved)

    def close(self):
        if hasattr(self.decoder, "close"):
            self.decoder.close()


def build(spec: str, draft, target, args):
    name, _, threads = spec.partition("@")
    threads = int(threads) if threads else None

    def verifier(tiered: bool):
        if not tiered:
            return LosslessVerifier(target)
        mask = RoutingMask(skip_layers=tuple(args.skip_layers))
        policy = ConfidencePolicy(tau_accept=args.tau, tau_slim=args.tau)
        return TieredVerifier(target, lambda t: SlimModel(t, mask), policy)

    t_threads, d_threads = args.pearl_threads
    if name == "ar":
        return Threaded(AutoregressiveDecoder(target), threads)
    if name in ("sd", "tiered-sd"):
        return Threaded(SpeculativeDecoder(ModelDrafter(draft), verifier(name == "tiered-sd"), args.sd_k), threads)
    base, _, gamma = name.partition(":")
    flags = set(base.split("-"))
    if "pearl" in flags and flags <= {"pearl", "thread", "eager", "tiered"}:
        return PearlDecoder(
            ModelDrafter(draft),
            verifier("tiered" in flags),
            window_size=int(gamma) if gamma else args.window,
            schedule="eager" if "eager" in flags else "window",
            backend="thread" if "thread" in flags else "process",
            draft_threads=d_threads,
            target_threads=t_threads,
        )
    raise ValueError(f"unknown decoder {spec!r}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--questions", type=Path, required=True, help="Spec-Bench's question.jsonl (or a file of its shape)"
    )
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--dtype", default="bfloat16", help="target dtype (defines the output)")
    ap.add_argument("--draft-dtype", default="bfloat16")
    ap.add_argument("--prompts", type=int, default=5)
    ap.add_argument("--offset", type=int, default=0, help="first question (then every len/prompts-th)")
    ap.add_argument(
        "--ids",
        type=lambda s: [int(x) for x in s.split(",")],
        default=None,
        help="question ids to run instead of --prompts/--offset",
    )
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--decoders", default="ar@2,sd@2,pearl")
    ap.add_argument("--sd-k", type=int, default=5)
    ap.add_argument("--window", type=int, default=3, help="PEARL's gamma")
    ap.add_argument(
        "--pearl-threads",
        type=lambda s: tuple(int(x) for x in s.split(",")),
        default=(1, 1),
        help="target,draft torch threads of PEARL",
    )
    ap.add_argument("--skip-layers", type=lambda s: [int(x) for x in s.split(",")], default=[12, 13, 14, 15])
    ap.add_argument("--tau", type=float, default=0.9, help="tiered tau_accept = tau_slim")
    ap.add_argument("--out", default=None, help="JSON lines of every generation")
    args = ap.parse_args()

    target_loaded = load_model(ModelSpec(args.target, weights=args.dtype))
    draft = load_model(ModelSpec(args.draft, weights=args.draft_dtype)).model
    target = target_loaded.model
    specs = args.decoders.split(",")
    decoders = {spec: build(spec, draft, target, args) for spec in specs}
    if args.ids:
        every = {p["id"]: p for p in load_prompts(args.questions, 10**6, 0)}
        prompts = [every[i] for i in args.ids]
    else:
        prompts = load_prompts(args.questions, args.prompts, args.offset)
    stop = target_loaded.stop_token_ids
    encoded = [encode_prompt(target_loaded, p["text"]) for p in prompts]

    warm = encoded[0]
    for spec, decoder in decoders.items():  # start workers, fill allocator caches
        begin = time.perf_counter()
        decoder.generate(warm, 8, stop_token_ids=stop)
        print(f"warm-up {spec}: {time.perf_counter() - begin:.1f} s", flush=True)

    records = []
    out = open(args.out, "w") if args.out else None
    for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
        order = specs[i % len(specs) :] + specs[: i % len(specs)]
        row = {}
        for spec in order:
            result = decoders[spec].generate(ids, args.max_new_tokens, stop_token_ids=stop)
            s = result.stats
            row[spec] = {
                "tokens": result.tokens,
                "seconds": s.seconds,
                "new_tokens": s.new_tokens,
                "steps": s.steps,
                "acceptance": s.acceptance_rate,
                "mean_accepted_length": s.mean_accepted_length,
                "tier_counts": dict(s.tier_counts),
                "calls": {k: v.calls for k, v in s.model_calls.items()},
                "model_seconds": {k: round(v.seconds, 3) for k, v in s.model_calls.items()},
            }
            if out:
                out.write(
                    json.dumps({"prompt": prompt["id"], "category": prompt["category"], "decoder": spec, **row[spec]})
                    + "\n"
                )
                out.flush()
        records.append(row)
        line = " | ".join(f"{spec} {row[spec]['seconds']:.1f}s/{row[spec]['new_tokens']}" for spec in specs)
        print(f"[{i + 1}/{len(prompts)}] q{prompt['id']} {prompt['category']}: {line}", flush=True)

    base = next((s for s in specs if s.startswith("ar")), specs[0])
    print(f"\n{len(prompts)} prompts, {args.max_new_tokens} new tokens, target {args.dtype}, draft {args.draft_dtype}")
    print(
        f"{'decoder':14s} {'tok/s':>7s} {'speedup vs ' + base:>18s} {'accept':>7s} {'tok/step':>8s} {'identical to ' + base:>18s}"
    )
    for spec in specs:
        rs = [r[spec] for r in records]
        tps = sum(r["new_tokens"] for r in rs) / sum(r["seconds"] for r in rs)
        speedup = statistics.median(r[base]["seconds"] / r[spec]["seconds"] for r in records)
        same = sum(r[spec]["tokens"] == r[base]["tokens"] for r in records)
        acc = statistics.mean(x["acceptance"] for x in rs)
        mal = statistics.mean(x["mean_accepted_length"] for x in rs)
        print(f"{spec:14s} {tps:7.2f} {speedup:18.2f} {acc:7.3f} {mal:8.2f} {same:>15d}/{len(records)}")
    for spec in specs:
        for r in records:
            a, b = r[spec]["tokens"], r[base]["tokens"]
            if a != b:
                k = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                print(f"  {spec} differs from {base} at token {k} ({len(a)} vs {len(b)} tokens)")
    for decoder in decoders.values():
        if hasattr(decoder, "close"):
            decoder.close()


if __name__ == "__main__":
    main()
