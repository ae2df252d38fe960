"""`viasd-calibrate`: choose tier thresholds for a quality target and write them into the
model pair's config."""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from ..pipeline import encode_prompt, load_pair, uses_draft_model
from ..search.calibration import PromptSource, select_prompts
from ..search.thresholds import ThresholdResult, choose, evaluate_thresholds, select_policy_in_pair_config, write_policy
from . import CONFIG_DIR, set_threads

logger = logging.getLogger(__name__)


def run(cfg: DictConfig) -> tuple[ThresholdResult, list[ThresholdResult], Path]:
    set_threads(cfg.runtime.get("threads"))
    pair = load_pair(cfg.model_pair, uses_draft_model(cfg.framework.drafter, cfg.verifier))
    prompts = [
        encode_prompt(pair.target, text, cfg.chat_template)
        for source in cfg.prompts.sources
        for _, text in select_prompts(PromptSource(**source), cfg.prompts.split, cfg.prompts.per_category)
    ]
    grid = [(float(a), float(s)) for a, s in cfg.grid]
    results = evaluate_thresholds(
        pair, cfg.framework, cfg.verifier, prompts, grid, cfg.max_new_tokens, cfg.progress
    )
    best, met = choose(results, cfg.target_agreement)
    if not met:
        logger.warning("no setting reached agreement %.3f; writing the most faithful one", cfg.target_agreement)
    conf = Path(CONFIG_DIR)
    name = cfg.output_name or cfg.model_pair.name
    facts = {
        "model_pair": cfg.model_pair.name,
        "routing": cfg.routing.get("provenance", {}).get("method", "?") + f" skip {list(cfg.routing.skip_layers)}",
        "framework": cfg.framework.name,
        "dtype": cfg.runtime.dtype,
        "prompts": len(prompts),
        "max_new_tokens": cfg.max_new_tokens,
        "grid": [list(g) for g in grid],
    }
    policy_dir = Path(cfg.policy_dir) if cfg.policy_dir else conf / "policy"
    path = write_policy(policy_dir / f"{name}.yaml", best, met, cfg.target_agreement, facts)
    if cfg.select_in_pair_config:
        pair_config = conf / "model_pair" / f"{cfg.model_pair.name}.yaml"
        if not select_policy_in_pair_config(pair_config, name):
            logger.warning("%s has no /policy default: select it with policy=%s", pair_config, name)
    return best, results, path


@hydra.main(config_path=CONFIG_DIR, config_name="calibrate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    best, results, path = run(cfg)
    print("tau_accept tau_slim agreement exact full/token slim/token tok/s")
    for r in results:
        mark = " <- chosen" if r is best else ""
        print(
            f"{r.tau_accept:10.2f} {r.tau_slim:8.2f} {r.agreement:9.3f} {r.exact_rate:5.2f}"
            f" {r.full_calls_per_token:10.3f} {r.slim_calls_per_token:10.3f} {r.tokens_per_second:5.2f}{mark}"
        )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
