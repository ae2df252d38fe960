"""PEARL from Python, without and with VIA-SD's tiers: the same draft model, the same target.

    python examples/pearl.py                        # Qwen2.5-Coder 0.5B drafts for 1.5B (offline, from PyPI)
    python examples/pearl.py --backend thread       # the drafter in a thread instead of its own process

PEARL (Liu et al., ICLR 2025) drafts and verifies at the same time (pre-verify / post-verify,
adaptive draft length). `framework="pearl"` runs it with the project's drafter and verifier: with
`policy=None` it is plain, lossless PEARL (greedy: token for token the target's own output); with a
routing mask and thresholds, VIA-SD's slim verifier sits inside PEARL's verify step and settles
confident tokens without the target. On a CPU both sides share the cores: `--draft-threads` and
`--target-threads` split them (compare methods at equal cores).
"""

from __future__ import annotations

import argparse
import logging
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import viasd_adapters as vsd


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct", help="hub id, folder, or offline zoo name")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct", help="a draft model of the same tokenizer")
    parser.add_argument("--routing", default="qwen2.5-coder-1.5b-4l", help="mask YAML path or shipped mask name")
    parser.add_argument("--policy", nargs=2, type=float, default=(0.8, 0.8), metavar=("TAU_ACCEPT", "TAU_SLIM"))
    parser.add_argument("--prompt", default="Write a Python function that merges two sorted lists.")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--window-size", type=int, default=3, help="gamma: drafts per PEARL round")
    parser.add_argument("--backend", default="process", choices=["process", "thread"], help="where the drafter runs")
    parser.add_argument("--draft-threads", type=int, default=1)
    parser.add_argument("--target-threads", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="the target's dtype")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    begin = time.perf_counter()
    target_path = vsd.pretrained_path(args.target)
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    target = AutoModelForCausalLM.from_pretrained(target_path, dtype=getattr(torch, args.dtype)).eval()
    draft = AutoModelForCausalLM.from_pretrained(vsd.pretrained_path(args.draft), dtype=torch.bfloat16).eval()
    print(f"loaded {args.target} and {args.draft} in {time.perf_counter() - begin:.1f} s")
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": args.prompt}], tokenize=False, add_generation_prompt=True
        )
        input_ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    else:
        input_ids = tokenizer(args.prompt, return_tensors="pt").input_ids
    T = input_ids.shape[1]

    pearl_options = dict(
        framework="pearl",
        window_size=args.window_size,
        backend=args.backend,
        draft_threads=args.draft_threads,
        target_threads=args.target_threads,
        tokenizer=tokenizer,
    )
    runs = {
        "plain": vsd.build(target, draft, policy=None, **pearl_options),
        "tiered": vsd.build(target, draft, routing=args.routing, policy=tuple(args.policy), **pearl_options),
    }
    torch.set_num_threads(args.target_threads)  # the AR reference gets the target's cores, no more
    begin = time.perf_counter()
    reference = target.generate(input_ids, max_new_tokens=args.max_new_tokens, do_sample=False)
    ar_seconds = time.perf_counter() - begin
    print(f"{'AR (target.generate)':<18} {reference.shape[1] - T:4d} tokens {ar_seconds:6.2f} s")
    results = {}
    try:
        for name, generator in runs.items():
            print(f"{generator.method}: starting the draft worker and decoding ...", flush=True)
            generator.generate(input_ids, max_new_tokens=4)  # warm-up: the process backend starts its worker here
            out = generator.generate(input_ids, max_new_tokens=args.max_new_tokens, return_dict_in_generate=True)
            s = out.stats
            identical = torch.equal(out.sequences, reference)
            print(
                f"{generator.method:<18} {s.new_tokens:4d} tokens {s.seconds:6.2f} s {s.tokens_per_second:6.2f} tok/s"
                f" | accepted length {s.mean_accepted_length:.2f} | tiers {dict(s.tier_counts)}"
                f" | identical to AR: {identical}"
            )
            results[name] = {
                "identical": identical,
                "tiers": dict(s.tier_counts),
                "text": tokenizer.decode(out.new_tokens, skip_special_tokens=True),
            }
    finally:
        for generator in runs.values():
            generator.close()  # stop PEARL's draft workers
    print("\n" + results["tiered"]["text"])
    return results


if __name__ == "__main__":
    main()
