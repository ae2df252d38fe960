"""Measure how to run a draft and a target model concurrently on this CPU.

One PEARL round is "the target scores a block of K tokens while the drafter drafts K tokens".
This script times that round, interleaved over repetitions (medians), in five ways:

  seq     one after the other, each op using every core (plain SD's schedule)
  thr-1   two threads of one process, each with torch.set_num_threads(1)
  thr-N   two threads, each with all cores (oversubscribed)
  proc-1  the drafter in a spawned process with 1 thread, the target in this one with 1
  proc-N  as proc-1 with all cores in each process (oversubscribed)

Usage:
  python tools/measure_pearl_concurrency.py --draft qwen2.5-coder-0.5b-instruct \
      --target qwen2.5-coder-1.5b-instruct --dtype bfloat16 --block 5 --reps 8
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time

import torch
import torch.multiprocessing as mp

from viasd_adapters.models import ModelSpec, load_model
from viasd_adapters.runner import CausalLMRunner


def prompt_ids(loaded, length: int) -> torch.Tensor:
    text = "Write a Python function that parses a CSV file and returns the rows as dictionaries. " * 20
    ids = loaded.tokenizer(text, return_tensors="pt").input_ids[:, :length]
    return ids


def draft_round(runner: CausalLMRunner, prefix: torch.Tensor, k: int) -> None:
    ids = prefix
    for _ in range(k):
        token = int(runner.logits(ids, 1)[0].argmax())
        ids = torch.cat([ids, ids.new_tensor([[token]])], dim=1)


def target_round(runner: CausalLMRunner, prefix: torch.Tensor, k: int) -> None:
    block = torch.arange(100, 100 + k)[None]
    runner.logits(torch.cat([prefix, block], dim=1), k + 1)


def _draft_worker(spec: ModelSpec, threads: int, prefix: torch.Tensor, k: int, conn) -> None:
    torch.set_num_threads(threads)
    runner = CausalLMRunner(load_model(spec).model, "draft")
    runner.logits(prefix, 1)
    conn.send("ready")
    while True:
        msg = conn.recv()
        if msg is None:
            return
        torch.set_num_threads(msg)
        draft_round(runner, prefix, k)
        conn.send("done")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--target", required=True)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--block", type=int, default=5, help="K: tokens verified and drafted per round")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--reps", type=int, default=8)
    args = ap.parse_args()
    cores = torch.get_num_threads()

    draft_spec = ModelSpec(args.draft, weights=args.dtype, device=args.device)
    target_spec = ModelSpec(args.target, weights=args.dtype, device=args.device)
    target_loaded = load_model(target_spec)
    target = CausalLMRunner(target_loaded.model, "target")
    draft = CausalLMRunner(load_model(draft_spec).model, "draft")
    prefix = prompt_ids(target_loaded, args.prompt_tokens)
    k = args.block
    target.logits(prefix, 1)
    draft.logits(prefix, 1)

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_draft_worker, args=(draft_spec, 1, prefix, k, child), daemon=True)
    proc.start()
    assert parent.poll(600) and parent.recv() == "ready"

    def timed(fn) -> float:
        begin = time.perf_counter()
        fn()
        return time.perf_counter() - begin

    def seq():
        torch.set_num_threads(cores)
        target_round(target, prefix, k)
        draft_round(draft, prefix, k)

    def threads(n):
        def run():
            def drafter():
                torch.set_num_threads(n)
                draft_round(draft, prefix, k)

            t = threading.Thread(target=drafter)
            t.start()
            torch.set_num_threads(n)
            target_round(target, prefix, k)
            t.join()
            torch.set_num_threads(cores)

        return run

    def processes(n):
        def run():
            parent.send(n)
            torch.set_num_threads(n)
            target_round(target, prefix, k)
            assert parent.poll(600) and parent.recv() == "done"
            torch.set_num_threads(cores)

        return run

    def alone(runner_fn, n):
        def run():
            torch.set_num_threads(n)
            runner_fn()
            torch.set_num_threads(cores)

        return run

    modes = {
        "target alone, 1 thread": alone(lambda: target_round(target, prefix, k), 1),
        f"target alone, {cores} threads": alone(lambda: target_round(target, prefix, k), cores),
        "draft alone, 1 thread": alone(lambda: draft_round(draft, prefix, k), 1),
        f"draft alone, {cores} threads": alone(lambda: draft_round(draft, prefix, k), cores),
        "seq": seq,
        "thr-1": threads(1),
        f"thr-{cores}": threads(cores),
        "proc-1": processes(1),
        f"proc-{cores}": processes(cores),
    }
    for fn in modes.values():  # warm up every path once
        fn()
    times = {name: [] for name in modes}
    for _ in range(args.reps):
        for name, fn in modes.items():
            times[name].append(timed(fn))
    parent.send(None)
    proc.join(30)

    base = statistics.median(times["seq"])
    print(f"K={k}, prompt {prefix.shape[1]} tokens, {args.dtype}, {cores} cores, {args.reps} reps (medians)")
    print(f"{'mode':28s} {'median s':>9s} {'/ seq':>7s}")
    for name, ts in times.items():
        m = statistics.median(ts)
        print(f"{name:28s} {m:9.3f} {m / base:7.2f}")


if __name__ == "__main__":
    main()
