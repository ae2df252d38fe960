"""Tiny random causal LMs and a byte-level tokenizer, built locally for tests."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

from .spec import LoadedModel, ModelSpec, TinyModelConfig

EOS_TOKEN = "<|eos|>"
_CONFIGS = {"llama": LlamaConfig, "qwen2": Qwen2Config}


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """256 byte tokens plus an end-of-sequence token (id 256)."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    vocab[EOS_TOKEN] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN)


def build_tiny_model(spec: ModelSpec) -> LoadedModel:
    cfg = spec.tiny or TinyModelConfig()
    if cfg.architecture not in _CONFIGS:
        raise ValueError(f"tiny architecture {cfg.architecture!r} is not one of {sorted(_CONFIGS)}")
    tokenizer = byte_tokenizer()
    config = _CONFIGS[cfg.architecture](
        vocab_size=cfg.vocab_size or len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    config._attn_implementation = "sdpa"
    model = AutoModelForCausalLM.from_config(config)
    generator = torch.Generator().manual_seed(cfg.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                continue  # keep RMSNorm at identity
            param.normal_(0.0, cfg.init_std / (param.shape[-1] ** 0.5) * 8, generator=generator)
        if cfg.perturb:
            perturb_weights(model, cfg.perturb, cfg.perturb_seed)
    model = model.to(device=spec.device, dtype=spec.torch_dtype).eval()
    return LoadedModel(model, tokenizer, spec, stop_token_ids=(tokenizer.eos_token_id,))


@torch.no_grad()
def perturb_weights(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """Add relative Gaussian noise (`scale` x each tensor's std) to every weight, in place.

    Applied to a copy of a target, this makes a draft that agrees with it most of the time
    (tiny-random's draft), so tests exercise both accepted and rejected drafts.
    """
    generator = torch.Generator().manual_seed(seed)
    for param in model.parameters():
        noise = torch.randn(param.shape, generator=generator, dtype=torch.float32)
        param.add_((noise * param.float().std() * scale).to(param.dtype))
    return model
