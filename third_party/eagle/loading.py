"""Building eagle-llm `EaModel`s: from folders, or around a transformers model already loaded.

`EaModel.from_pretrained` (eagle-llm 1.2.1) picks its base-model class from `architectures[0]`:
`LlamaForCausalLM` gets eagle-llm's `modeling_llama_kv`, anything else `modeling_mixtral_kv`, with
no check. `load_ea_model` chooses explicitly and refuses what cannot work:

* backend "transformers" (default): the target as transformers loads it, wrapped by
  `TransformersEagleBase` (Llama, Qwen2, Qwen3, Mistral without sliding windows);
* backend "eagle": eagle-llm's own loader (Llama only), for parity with existing deployments.

Both construct the stock `EaModel` class (its `__init__` is called as is) and load the head
strictly; the head's embedding matrix is then the target's own tensor, never a second copy.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import torch
from eagle.model.ea_model import EaModel
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from .head import CONFIG, EMBEDDINGS, load_head_state
from .transformers_base import TransformersEagleBase

logger = logging.getLogger(__name__)

BACKENDS = ("transformers", "eagle")
_EAGLE_ROPE_BASE = 10000.0  # modeling_llama_kv's rotary base, whatever config.rope_theta says


def load_ea_model(
    base_model_path: str | Path,
    ea_model_path: str | Path,
    backend: str = "transformers",
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> EaModel:
    """An `EaModel` in eval mode: the target in `base_model_path`, the head in `ea_model_path`.

    The head folder may be eagle-llm's format or the compact one (see `head.py`).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    config = AutoConfig.from_pretrained(base_model_path)
    if backend == "eagle":
        arch = (config.architectures or ["?"])[0]
        if arch != "LlamaForCausalLM":
            raise ValueError(
                f"eagle-llm 1.2.1 loads only Llama targets correctly ({base_model_path} is {arch}; it would be"
                " loaded as Mixtral): use backend='transformers'"
            )
        rope = float(getattr(config, "rope_theta", _EAGLE_ROPE_BASE))
        if rope != _EAGLE_ROPE_BASE:
            logger.warning(
                "eagle-llm's Llama ignores rope_theta=%g (it uses %g): the stock target differs from the model"
                " transformers loads; backend='transformers' decodes the real one",
                rope,
                _EAGLE_ROPE_BASE,
            )
        from eagle.model.modeling_llama_kv import LlamaForCausalLM as EagleLlama

        base = EagleLlama.from_pretrained(base_model_path, torch_dtype=dtype).to(device)
    else:
        target = AutoModelForCausalLM.from_pretrained(base_model_path, dtype=dtype, attn_implementation="sdpa")
        base = TransformersEagleBase(target.to(device).eval())
    return _assemble(base, str(base_model_path), ea_model_path)


def ea_model_from_target(
    target: PreTrainedModel,
    ea_model_path: str | Path,
    tokenizer_path: str | Path | None = None,
    step=None,
    tokenizer=None,
) -> EaModel:
    """An `EaModel` around a transformers model already in memory (shared, not reloaded).

    EaModel reads the target's tokenizer from a folder: `tokenizer_path`, else the folder the target
    was loaded from, else `tokenizer` (a tokenizer object: written to a temporary folder for it).
    `step`: a faster forward of the target's layers (`TransformersLayers`).
    """
    path = tokenizer_path or getattr(target.config, "_name_or_path", "")
    if (not path or not Path(path).is_dir()) and tokenizer is not None:
        with tempfile.TemporaryDirectory() as folder:
            tokenizer.save_pretrained(folder)
            return _assemble(TransformersEagleBase(target, step), folder, ea_model_path)
    if not path or not Path(path).is_dir():
        raise ValueError(
            "EaModel loads the target's tokenizer from a folder: pass tokenizer_path (the target's folder)"
            f" or the tokenizer; the target's config names {path!r}"
        )
    return _assemble(TransformersEagleBase(target, step), str(path), ea_model_path)


def _assemble(base, base_model_path: str, ea_model_path: str | Path) -> EaModel:
    head_dir = Path(ea_model_path)
    if not (head_dir / CONFIG).is_file():
        raise ValueError(
            f"no EAGLE head at {head_dir} ({CONFIG} is missing): train one with `viasd-train-eagle`"
            " or point to an eagle-llm head folder"
        )
    model = EaModel(base, base_model_path, str(head_dir / CONFIG))
    embeddings = base.model.embed_tokens.weight
    state, compact = load_head_state(head_dir, embeddings.detach())
    if state[EMBEDDINGS].shape != embeddings.shape:
        raise ValueError(
            f"the head in {head_dir} was made for embeddings {tuple(state[EMBEDDINGS].shape)}, the target has"
            f" {tuple(embeddings.shape)}: it belongs to another model"
        )
    model.ea_layer.load_state_dict(state, strict=True)
    if compact or torch.equal(state[EMBEDDINGS].to(embeddings.dtype), embeddings.detach()):
        model.ea_layer.embed_tokens.weight = embeddings  # the target's tensor, not a copy
    return model.eval()
