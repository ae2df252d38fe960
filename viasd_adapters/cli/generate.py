"""`viasd-generate`: decode one prompt with the configured model pair, framework and verifier."""

from __future__ import annotations

import hydra
from hydra.utils import instantiate
from omegaconf import DictConfig

from ..decode import GenerationResult
from ..pipeline import Pipeline
from . import CONFIG_DIR


def run(cfg: DictConfig) -> tuple[str, GenerationResult]:
    pipeline = Pipeline.from_config(cfg)
    result = pipeline.generate(cfg.prompt, cfg.max_new_tokens, instantiate(cfg.sampling))
    return pipeline.decode(result.tokens), result


@hydra.main(config_path=CONFIG_DIR, config_name="generate", version_base="1.3")
def main(cfg: DictConfig) -> None:
    text, result = run(cfg)
    print(text)
    print(f"[{cfg.framework.name}] {result.stats.summary()}")


if __name__ == "__main__":
    main()
