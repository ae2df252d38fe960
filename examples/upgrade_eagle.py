"""Upgrading an existing eagle-llm deployment to VIA-SD: same target, same draft head, a few lines.

    python examples/upgrade_eagle.py                      # SmolLM2-135M-Instruct and the shipped head
    python examples/upgrade_eagle.py --routing PATH.yaml  # another routing mask (viasd-search writes them)
"""

from __future__ import annotations

import argparse

import torch

from viasd_adapters.hosts.eagle.adapter import SHIPPED_HEADS, resolve_routing
from viasd_adapters.models.offline import ensure_cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default=str(ensure_cached("smollm2-135m-instruct")), help="target folder")
    parser.add_argument("--head", default=str(SHIPPED_HEADS / "smollm2-135m-instruct"), help="EAGLE head folder")
    parser.add_argument("--routing", default="smollm2-135m-2l",
                        help="routing mask: a YAML path or a shipped mask's name (default: the DIMR-searched SmolLM2 mask, layers 3 and 5)")
    parser.add_argument("--prompt", default="Explain in two sentences why the sky is blue.")
    args = parser.parse_args()

    # --- an existing deployment (eagle-llm; our loader also fixes non-Llama targets, see viasd_adapters/hosts/eagle) ---
    from viasd_adapters.hosts.eagle import load_ea_model

    model = load_ea_model(args.base, args.head, dtype=torch.float32)  # or: EaModel.from_pretrained(...).eval()
    ids = model.tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}],
                                              add_generation_prompt=True, return_tensors="pt")
    stock = model.eagenerate(ids, temperature=0.0, max_new_tokens=64)

    # --- the upgrade: wrap the same EaModel; eagenerate keeps its signature ---
    from viasd_adapters.hosts.eagle.adapter import TieredEagle
    from viasd_adapters.routing import RoutingMask
    from viasd_adapters.verify import ConfidencePolicy

    model = TieredEagle(model, routing=RoutingMask.from_yaml(resolve_routing(args.routing)),
                        policy=ConfidencePolicy(tau_accept=0.9, tau_slim=0.9))
    tiered = model.eagenerate(ids, temperature=0.0, max_new_tokens=64)

    decode = lambda out: model.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)  # noqa: E731
    print("stock EAGLE :", decode(stock))
    print("VIA-SD EAGLE:", decode(tiered))
    print("forward calls:", {name: c.calls for name, c in model.stats.items()})


if __name__ == "__main__":
    main()
