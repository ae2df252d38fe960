"""`viasd-train-eagle`: train an EAGLE draft head for the model pair's target (or export one).

viasd-train-eagle model_pair=smollm2-135m ship=true
viasd-train-eagle model_pair=qwen2.5-coder-0.5b-1.5b training=sharegpt stop_after=features  # features only
viasd-train-eagle export.head=smollm2-135m-instruct export.out=/tmp/eagle-head
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig

from ..checks import check_config
from . import entry_point, set_threads

logger = logging.getLogger(__name__)


def run(cfg: DictConfig):
    """Train (or, with export.head and export.out set, export) and return the TrainResult / folder."""
    check_config(cfg)
    set_threads(cfg.runtime.threads)
    from ..models import load_model

    if cfg.export.head or cfg.export.out:
        if not (cfg.export.head and cfg.export.out):
            raise ValueError("export needs both export.head and export.out")
        return export(cfg)
    from ..train.eagle import train_eagle_head

    self_distill = cfg.training.get("corpus", {}).get("self_distill", True)
    if (
        self_distill and cfg.training.split.get("spec_bench") and cfg.training.split.get("prompts") is None
    ):  # fail now, naming the key
        from ..bench.tasks import read_prompts_file

        read_prompts_file(cfg.training.split.spec_bench, "training.split.spec_bench")
    corpus = cfg.training.get("corpus", {})
    if corpus.get("sharegpt"):  # fail now, not after loading the target
        from ..train.corpus import resolve_sharegpt

        resolve_sharegpt(corpus.get("sharegpt_path"))
    spec = instantiate(cfg.model_pair.target, _convert_="all")
    # Training runs whole-sequence forwards and generate(): a compiled decode step would only cost its compile time.
    spec.compile = False
    loaded = load_model(spec)
    training = instantiate(cfg.training, _convert_="all")
    result = train_eagle_head(
        loaded, training, cfg.out_dir, progress=cfg.progress, resume=cfg.resume, stop_after=cfg.get("stop_after")
    )
    if not result.steps:
        return result
    logger.info("head written to %s (%d steps, held-out top-1 %.3f)", result.out_dir, result.steps, result.eval_top1)
    if cfg.ship:
        ship = Path(cfg.ship_dir)
        ship.mkdir(parents=True, exist_ok=True)
        for name in ("config.json", "head.safetensors", "recipe.json"):
            shutil.copy2(Path(result.out_dir) / name, ship / name)
        logger.info("shipped to %s", ship)
    return result


def export(cfg: DictConfig) -> Path:
    """eagle-llm's format (config.json + pytorch_model.bin) of a head, with the target's embeddings."""
    from viasd_adapters.third_party.eagle import export_head

    from ..hosts.eagle import resolve_head
    from ..models import load_model

    loaded = load_model(instantiate(cfg.model_pair.target, _convert_="all"))
    out = export_head(resolve_head(cfg.export.head), loaded.model.get_input_embeddings().weight, cfg.export.out)
    logger.info("eagle-llm head written to %s (EaModel.from_pretrained(ea_model_path=...))", out)
    return out


@entry_point("train_eagle")
def main(cfg: DictConfig) -> None:
    result = run(cfg)
    print(result)


if __name__ == "__main__":
    main()
