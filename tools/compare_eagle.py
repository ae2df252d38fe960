"""Stock EAGLE vs VIA-SD (tiered) EAGLE vs AR on the same target, head and prompts; interleaved.

    python tools/compare_eagle.py --routing outputs/search/.../mask.yaml --reps 3
    python tools/compare_eagle.py --model qwen2.5-coder-1.5b-instruct \
        --routing qwen2.5-coder-1.5b-4l --reps 1 --taus 0.9 0.6

Per prompt and repetition every method decodes once, in an order rotated by (prompt + rep) so that
machine drift hits all alike. Reported: token identity of our adapter (slim tier off) with stock
`eagenerate`, agreement with AR, medians of tokens/s and of per-prompt speed ratios, mean
accepted length, rejection rate and tier shares. Run from the repository root.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from viasd_adapters.hosts.eagle import ea_model_from_target  # noqa: E402
from viasd_adapters.hosts.eagle.adapter import (  # noqa: E402
    SHIPPED_HEADS,
    EagleDecoder,
    TieredEagle,
    resolve_head,
    resolve_routing,
)
from viasd_adapters.bench.tasks import read_prompts_file  # noqa: E402
from viasd_adapters.decode import AutoregressiveDecoder  # noqa: E402
from viasd_adapters.models import ModelSpec, load_model  # noqa: E402
from viasd_adapters.pipeline import encode_prompt  # noqa: E402
from viasd_adapters.routing import RoutingMask  # noqa: E402
from viasd_adapters.verify import ConfidencePolicy  # noqa: E402

CATEGORIES = ["writing", "coding", "translation", "summarization", "qa", "math_reasoning"]


def prompts(path: str, per_category: int, max_tokens: int, loaded) -> list[tuple[str, torch.Tensor]]:
    rows = read_prompts_file(path)
    out = []
    for c in CATEGORIES:
        for r in [r for r in rows if r["category"] == c][:per_category]:  # the benchmark's split: the first ones
            text = r["turns"][0]
            ids = loaded.tokenizer(text, add_special_tokens=False).input_ids
            if len(ids) > max_tokens:
                text = loaded.tokenizer.decode(ids[:max_tokens])
            out.append((f"{c}/{r['question_id']}", encode_prompt(loaded, text)))
    return out


def agreement(a: list[int], b: list[int]) -> float:
    """Share of positions where both generations agree, up to the shorter one."""
    n = min(len(a), len(b))
    return sum(x == y for x, y in zip(a[:n], b[:n])) / n if n else 1.0


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--head", default=None,
                   help="default: the head the package ships for <model>, else outputs/eagle/<model> (viasd-train-eagle's)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--routing", default="smollm2-135m-2l",
                   help="routing mask: a YAML path or a shipped mask's name (the default is SmolLM2's; other targets need their own)")
    p.add_argument("--taus", type=float, nargs="+", default=[0.9], help="one tiered method per value (tau_accept = tau_slim)")
    p.add_argument("--max-unverified", type=int, default=16)
    p.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--max-prompt-tokens", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="JSON file for the records")
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    routing = RoutingMask.from_yaml(resolve_routing(args.routing))
    if routing.model and routing.model != args.model:
        p.error(f"{args.routing} was made for {routing.model}, not {args.model}: pass --routing")
    if args.head is None:  # the shipped head, else the one viasd-train-eagle left in outputs/
        shipped, trained = SHIPPED_HEADS / args.model, Path("outputs") / "eagle" / args.model
        args.head = str(trained if trained.is_dir() and not shipped.is_dir() else shipped)
    head = resolve_head(args.head)
    loaded = load_model(ModelSpec(args.model, dtype=args.dtype))
    ea = ea_model_from_target(loaded.model, head)
    stops = loaded.stop_token_ids
    N = args.max_new_tokens
    methods = {
        "ar": AutoregressiveDecoder(loaded.model),
        "eagle": EagleDecoder(ea_model=ea),  # our adapter, slim tier off
    }
    for tau in args.taus:
        methods[f"tiered@{tau:g}"] = EagleDecoder(ea_model=ea, routing=routing, max_unverified=args.max_unverified,
                                                 policy=ConfidencePolicy(tau_accept=tau, tau_slim=tau))

    def stock(ids):
        """Stock eagle-llm `eagenerate` on the same EaModel (its own stop rule: eos, > N new tokens)."""
        begin = time.perf_counter()
        out = ea.eagenerate(ids, max_new_tokens=N)
        seconds = time.perf_counter() - begin
        tokens = out[0, ids.shape[1]:].tolist()
        return tokens, seconds

    work = prompts(args.prompts, args.per_category, args.max_prompt_tokens, loaded)
    print(f"{len(work)} prompts, {args.reps} reps, {N} new tokens, {args.dtype}, threads {args.threads}, "
          f"routing {routing.describe()}, ConfidencePolicy taus {args.taus}", flush=True)
    # warm-up
    for name, dec in methods.items():
        dec.generate(work[0][1], 8, stop_token_ids=stops)
    stock(work[0][1])
    records = []
    names = ["stock"] + list(methods)
    for rep in range(args.reps):
        for i, (pid, ids) in enumerate(work):
            shift = (i + rep) % len(names)
            row = {"prompt": pid, "rep": rep}
            for name in names[shift:] + names[:shift]:
                if name == "stock":
                    tokens, seconds = stock(ids)
                    row["stock"] = {"tokens": tokens, "seconds": seconds}
                    continue
                result = methods[name].generate(ids, N, stop_token_ids=stops)
                s = result.stats
                row[name] = {"tokens": result.tokens, "seconds": s.seconds, "steps": s.steps,
                             "drafted": s.drafted, "accepted": s.accepted, "tier_counts": dict(s.tier_counts),
                             "calls": {k: (c.calls, round(c.seconds, 4)) for k, c in s.model_calls.items()}}
            records.append(row)
            print(pid, rep, {k: round(len(v["tokens"]) / v["seconds"], 2) for k, v in row.items()
                              if isinstance(v, dict)}, flush=True)
    report(records, N)
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))


def report(records: list[dict], N: int) -> None:
    def tps(r, k):
        return len(r[k]["tokens"]) / r[k]["seconds"]

    tiered = [k for k in records[0] if k.startswith("tiered")]

    med = statistics.median
    print("\n== token identity ==")
    same = [r["eagle"]["tokens"] == r["stock"]["tokens"][: len(r["eagle"]["tokens"])] for r in records]
    print(f"adapter (slim off) == stock eagenerate: {sum(same)}/{len(same)} generations")
    print(f"eagle vs AR agreement: {statistics.mean(agreement(r['eagle']['tokens'], r['ar']['tokens']) for r in records):.3f}"
          f" (identical {sum(r['eagle']['tokens'] == r['ar']['tokens'] for r in records)}/{len(records)})")
    for t in tiered:
        print(f"{t} vs eagle agreement: "
              f"{statistics.mean(agreement(r[t]['tokens'], r['eagle']['tokens']) for r in records):.3f}, identical"
              f" {sum(r[t]['tokens'] == r['eagle']['tokens'] for r in records)}/{len(records)}, vs AR"
              f" {statistics.mean(agreement(r[t]['tokens'], r['ar']['tokens']) for r in records):.3f}")
    print("\n== speed (median tokens/s; ratios: median over generations of per-generation ratios) ==")
    for k in ["ar", "stock", "eagle"] + tiered:
        print(f"{k:11s} {med(tps(r, k) for r in records):7.2f} tok/s")
    for a, b in [("eagle", "ar"), ("stock", "ar"), ("eagle", "stock")] + [(t, "eagle") for t in tiered] + [(t, "ar") for t in tiered]:
        print(f"{a}/{b}: {med(tps(r, a) / tps(r, b) for r in records):.3f}")
    print("\n== acceptance ==")
    for k in ["eagle"] + tiered:
        steps = sum(r[k]["steps"] for r in records)
        tokens = sum(len(r[k]["tokens"]) for r in records)
        drafted = sum(r[k]["drafted"] for r in records)
        accepted = sum(r[k]["accepted"] for r in records)
        tiers: dict[str, int] = {}
        for r in records:
            for t, n in r[k]["tier_counts"].items():
                tiers[t] = tiers.get(t, 0) + n
        calls = {}
        for r in records:
            for name, (c, s) in r[k]["calls"].items():
                calls.setdefault(name, [0, 0.0])
                calls[name][0] += c
                calls[name][1] += s
        print(f"{k}: mean accepted length {tokens / steps:.2f} tokens/round, rejection rate {1 - accepted / drafted:.3f}"
              f" (accepted {accepted} of {drafted} drafted), tiers {tiers}, calls "
              f"{ {n: (c, round(s, 1)) for n, (c, s) in calls.items()} }")


if __name__ == "__main__":
    main()
