"""Stock eagle-llm `eagenerate` against our EAGLE adapter with the tiers off, on one loaded model.

    python tools/compare_eagle.py --reps 3
    python tools/compare_eagle.py --model qwen2.5-coder-1.5b-instruct --head outputs/eagle/qwen2.5-coder-1.5b-instruct

The check that upgrading a deployment changes nothing: per prompt and repetition both decode the
same prompt back to back, in an order alternated by (prompt + rep) so that machine drift hits
both alike. Reported: token identity of the adapter (`EagleDecoder`, `verifier=full`) with stock
`eagenerate`, and the median of per-generation speed ratios. Everything else, AR and tiered EAGLE
included, is a `viasd-bench` method (`method=[ar,eagle,eagle-tiered]`, docs/results/eagle.md).
Run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from viasd_adapters.bench import splits  # noqa: E402
from viasd_adapters.bench.tasks import read_prompts_file
from viasd_adapters.hosts.eagle import SHIPPED_HEADS, EagleDecoder, resolve_head
from viasd_adapters.models import ModelSpec, load_model
from viasd_adapters.pipeline import encode_prompt
from viasd_adapters.third_party.eagle import ea_model_from_target

CATEGORIES = ["writing", "coding", "translation", "summarization", "qa", "math_reasoning"]


def prompts(path: str, per_category: int, max_tokens: int, loaded) -> list[tuple[str, torch.Tensor]]:
    rows = read_prompts_file(path)
    out = []
    groups = splits.evaluation(splits.by_category(rows, lambda row: row["category"], CATEGORIES), per_category)
    for r in (r for group in groups for r in group):  # the benchmark's split: the first ones
        text = r["turns"][0]
        ids = loaded.tokenizer(text, add_special_tokens=False).input_ids
        if len(ids) > max_tokens:
            text = loaded.tokenizer.decode(ids[:max_tokens])
        out.append((f"{r['category']}/{r['question_id']}", encode_prompt(loaded, text)))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--head", default=None, help="EAGLE head folder (default: the one the package ships for --model)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--prompts", required=True, help="a prompt file in Spec-Bench's format (question.jsonl)")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="JSON file for the records")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    head = resolve_head(args.head or SHIPPED_HEADS / args.model)
    loaded = load_model(ModelSpec(args.model, weights=args.dtype))
    ea = ea_model_from_target(loaded.model, head)
    adapter = EagleDecoder(ea_model=ea)  # the tiers off: what verifier=full builds
    N = args.max_new_tokens
    eos = ea.tokenizer.eos_token_id

    def stock(ids) -> tuple[list[int], float]:
        """Stock `eagenerate` on the same EaModel (its own stop rule: eos, or more than N new tokens)."""
        begin = time.perf_counter()
        out = ea.eagenerate(ids, max_new_tokens=N)
        return out[0, ids.shape[1] :].tolist(), time.perf_counter() - begin

    def ours(ids) -> tuple[list[int], float]:
        result = adapter.generate(ids, N, stop_token_ids=(eos,))
        return result.tokens, result.stats.seconds

    work = prompts(args.prompts, args.per_category, args.max_prompt_tokens, loaded)
    print(f"{len(work)} prompts, {args.reps} reps, {N} new tokens, {args.dtype}, threads {args.threads}", flush=True)
    stock(work[0][1]), ours(work[0][1])  # warm-up
    records = []
    for rep in range(args.reps):
        for i, (pid, ids) in enumerate(work):
            order = [("stock", stock), ("ours", ours)]
            row = {"prompt": pid, "rep": rep}
            for name, run in order if (i + rep) % 2 == 0 else order[::-1]:
                tokens, seconds = run(ids)
                row[name] = {"tokens": tokens, "seconds": seconds}
            records.append(row)
            print(
                pid,
                rep,
                {k: round(len(v["tokens"]) / v["seconds"], 2) for k, v in row.items() if isinstance(v, dict)},
                flush=True,
            )
    # stock stops after more than N tokens (eagle-llm's rule), ours at N: compare the first N, all of them
    same = sum(r["ours"]["tokens"] == r["stock"]["tokens"][:N] for r in records)
    ratio = statistics.median(
        (len(r["ours"]["tokens"]) / r["ours"]["seconds"]) / (len(r["stock"]["tokens"]) / r["stock"]["seconds"])
        for r in records
    )
    print(f"adapter (tiers off) token-identical to stock eagenerate: {same}/{len(records)} generations")
    print(f"speed, adapter / stock: {ratio:.3f} (median of per-generation ratios)")
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
