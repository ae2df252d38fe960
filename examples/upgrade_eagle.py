"""Upgrading an existing eagle-llm deployment to VIA-SD: same target, same draft head, a few lines.

    python examples/upgrade_eagle.py                        # SmolLM2-135M-Instruct and its shipped head
    python examples/upgrade_eagle.py --routing PATH.yaml    # another routing mask (viasd-search writes mask.yaml)
    python examples/upgrade_eagle.py --base FOLDER --head FOLDER --routing PATH.yaml   # your deployment

An eagle-llm deployment holds an `EaModel` (target + EAGLE draft head) and calls `eagenerate`. The
upgrade wraps that same object in `TieredEagle` with a routing mask (the slim verifier: the
target with some layers skipped) and tier thresholds; `eagenerate` keeps its signature. With
`policy=None` the wrapper is stock EAGLE token for token. Every step prints what it does and how
long it took (the first run converts SmolLM2 from its PyPI GGUF once, ~20 s).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import time

import torch


@contextlib.contextmanager
def step(what: str):
    """Print what is about to happen, then how long it took."""
    print(f"{what} ...", flush=True)
    begin = time.perf_counter()
    yield
    print(f"  done in {time.perf_counter() - begin:.1f} s", flush=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="smollm2-135m-instruct", help="target folder (or an offline zoo name)")
    parser.add_argument("--head", default="smollm2-135m-instruct", help="EAGLE head folder (or a shipped head's name)")
    parser.add_argument(
        "--routing",
        default="smollm2-135m-2l",
        help="routing mask: a YAML path or a shipped mask's name (default: SmolLM2's DIMR mask, 2 layers)",
    )
    parser.add_argument("--policy", nargs=2, type=float, default=(0.9, 0.9), metavar=("TAU_ACCEPT", "TAU_SLIM"))
    parser.add_argument("--prompt", default="Explain in two sentences why the sky is blue.")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="  %(message)s")  # the zoo reports a first-run conversion
    if args.threads:
        torch.set_num_threads(args.threads)

    from viasd_adapters import pretrained_path, routing_mask
    from viasd_adapters.hosts.eagle import TieredEagle, resolve_head
    from viasd_adapters.third_party.eagle import load_ea_model
    from viasd_adapters.verify import ConfidencePolicy

    # --- the existing deployment (eagle-llm; our loader also handles non-Llama targets, see
    # third_party/eagle/README.md). With stock eagle-llm: EaModel.from_pretrained(...).eval()
    with step(f"loading {args.base} with the EAGLE head {args.head}"):
        model = load_ea_model(pretrained_path(args.base), resolve_head(args.head), dtype=torch.float32)
    if model.tokenizer.chat_template:
        ids = model.tokenizer.apply_chat_template(
            [{"role": "user", "content": args.prompt}], add_generation_prompt=True, return_tensors="pt"
        )
    else:  # a base model: the prompt as it is
        ids = model.tokenizer(args.prompt, return_tensors="pt").input_ids
    T = ids.shape[1]
    runs = {}

    def generate(name: str, eagle) -> None:
        with step(f"{name}: eagenerate, up to {args.max_new_tokens} new tokens"):
            begin = time.perf_counter()
            out = eagle.eagenerate(ids, temperature=0.0, max_new_tokens=args.max_new_tokens)
            seconds = time.perf_counter() - begin
        n = out.shape[1] - T
        print(f"  {n} tokens, {n / seconds:.1f} tok/s")
        runs[name] = {"ids": out, "seconds": seconds}

    generate("stock EAGLE", model)

    # --- the upgrade: wrap the same EaModel; eagenerate keeps its signature
    model = TieredEagle(
        model,
        routing=routing_mask(args.routing),
        policy=ConfidencePolicy(tau_accept=args.policy[0], tau_slim=args.policy[1]),
    )
    generate("VIA-SD EAGLE", model)
    calls = {name: c.calls for name, c in model.stats.items()}
    print(f"  forward calls: {calls}")

    decode = lambda out: model.tokenizer.decode(out[0, T:], skip_special_tokens=True)
    stock, tiered = runs["stock EAGLE"]["ids"], runs["VIA-SD EAGLE"]["ids"]
    n = min(stock.shape[1], tiered.shape[1]) - T
    agreement = float((stock[0, T : T + n] == tiered[0, T : T + n]).float().mean()) if n > 0 else 1.0
    print(f"\nstock EAGLE : {decode(stock)}\nVIA-SD EAGLE: {decode(tiered)}")
    print(
        f"token agreement with stock EAGLE: {agreement:.3f}; speed ratio (stock time / VIA-SD time):"
        f" {runs['stock EAGLE']['seconds'] / runs['VIA-SD EAGLE']['seconds']:.2f} (one run: noisy)"
    )
    return {"agreement": agreement, "calls": calls, "tokens": {k: v["ids"].shape[1] - T for k, v in runs.items()}}


if __name__ == "__main__":
    main()
