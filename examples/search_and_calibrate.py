"""Search a routing mask for your model, calibrate the tier thresholds for it, and use both.

    python examples/search_and_calibrate.py                          # Qwen2.5-Coder 0.5B -> 1.5B, a 4-layer mask
    python examples/search_and_calibrate.py --model-pair smollm2-135m --budget 2 --search quick

Three steps, each the console command it prints (run here through this interpreter):

1. `viasd-search`: DIMR finds which decoder layers the slim verifier may skip, on calibration
   text the target writes itself; the mask goes to the run directory and, as
   `routing/<name>.yaml`, to your user config directory, so `routing=<name>` selects it.
2. `viasd-calibrate`: tries a grid of (tau_accept, tau_slim) with that mask and keeps the
   cheapest setting whose greedy output agrees with the lossless output on `--agreement` of the
   tokens; written as `policy/<name>.yaml` there too.
3. Both in use: `viasd-generate verifier=tiered routing=<name> policy=<name>`, and from Python,
   `viasd_adapters.build(target, draft, routing=<name>, policy=<name>)`.

The user config directory is `$VIASD_CONFIG_DIR`, else `~/.config/viasd-adapters/conf`. A full
search of a 1.5B target takes tens of minutes on a CPU; `--search quick` is a smoke run.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path


def command(name: str, *overrides: str) -> None:
    """Print the console command, then run it through this interpreter (a checkout works like an install)."""
    print(f"\n$ viasd-{name} {shlex.join(overrides)}", flush=True)
    begin = time.perf_counter()
    subprocess.run([sys.executable, "-m", f"viasd_adapters.cli.{name}", *overrides], check=True)
    print(f"  ({time.perf_counter() - begin:.0f} s)", flush=True)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-pair", default="qwen2.5-coder-0.5b-1.5b", help="a model_pair config name")
    parser.add_argument(
        "--search", default="layers", help="a conf/search/ option: layers (a real search), quick, blocks"
    )
    parser.add_argument("--budget", type=int, default=4, help="decoder layers to skip")
    parser.add_argument("--name", default=None, help="option name of the results (default: <model_pair>-<budget>l)")
    parser.add_argument("--agreement", type=float, default=0.98, help="calibration's quality target")
    parser.add_argument("--prompt", default="Write a Python function that reverses the words of a sentence.")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads for every step")
    parser.add_argument(
        "--out-dir", type=Path, default=Path("outputs/examples") / time.strftime("search-%Y%m%d-%H%M%S")
    )
    parser.add_argument("--search-overrides", nargs="*", default=[], help="more viasd-search overrides")
    parser.add_argument("--calibrate-overrides", nargs="*", default=[], help="more viasd-calibrate overrides")
    args = parser.parse_args(argv)
    name = args.name or f"{args.model_pair}-{args.budget}l"
    threads = [f"runtime.threads={args.threads}"] if args.threads else []

    # 1. the mask
    command(
        "search",
        f"model_pair={args.model_pair}",
        f"search={args.search}",
        f"search.budget.amount={args.budget}",
        f"mask_name={name}",
        f"out_dir={args.out_dir / 'search'}",
        *threads,
        *args.search_overrides,
    )
    # 2. the thresholds for that mask
    command(
        "calibrate",
        f"model_pair={args.model_pair}",
        f"routing={name}",
        f"output_name={name}",
        f"target_agreement={args.agreement}",
        f"out_dir={args.out_dir / 'calibrate'}",
        *threads,
        *args.calibrate_overrides,
    )
    # 3a. both, from the command line
    prompt_file = args.out_dir / "prompt.txt"
    prompt_file.parent.mkdir(parents=True, exist_ok=True)
    prompt_file.write_text(args.prompt, encoding="utf-8")
    command(
        "generate",
        f"model_pair={args.model_pair}",
        "verifier=tiered",
        f"routing={name}",
        f"policy={name}",
        f"prompt_file={prompt_file}",
        f"max_new_tokens={args.max_new_tokens}",
        *([f"runtime.threads={args.threads}"] if args.threads else []),
    )

    # 3b. both, from Python: the names resolve in the user config directory
    import torch
    from hydra import compose, initialize_config_dir

    import viasd_adapters as vsd
    from viasd_adapters.configs import CONFIG_DIR
    from viasd_adapters.pipeline import encode_text, load_pair

    if args.threads:
        torch.set_num_threads(args.threads)
    with initialize_config_dir(config_dir=CONFIG_DIR, version_base="1.3"):
        cfg = compose(config_name="generate", overrides=[f"model_pair={args.model_pair}"])
    pair = load_pair(cfg.model_pair)  # the pair's target and draft (for your own models: from_pretrained)
    generator = vsd.build(pair.target, pair.draft, routing=name, policy=name)
    mask, policy = vsd.routing_mask(name), vsd.tier_policy(name)
    print(f"\nPython: vsd.build(target, draft, routing={name!r}, policy={name!r}) -> {generator.method}")
    print(f"  mask: {mask.describe()}; thresholds: {policy}")
    ids = encode_text(pair.target.tokenizer, args.prompt).to(pair.target.model.device)
    out = generator.generate(ids, max_new_tokens=args.max_new_tokens, return_dict_in_generate=True)
    print(f"  {out.stats.summary()} | tiers {dict(out.stats.tier_counts)}")
    print(pair.target.tokenizer.decode(out.new_tokens, skip_special_tokens=True))
    return {"name": name, "mask": mask, "policy": policy, "stats": out.stats}


if __name__ == "__main__":
    main()
