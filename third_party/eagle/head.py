"""EAGLE draft heads (eagle-llm's `cnets.Model`): files, configs, and the state eagle-llm keeps in them.

Two folder formats, both with eagle-llm's `config.json`:
* eagle-llm's own: `pytorch_model.bin` holds every tensor, the target's token embeddings included
  (V x H: 28M parameters for SmolLM2, 233M for Qwen2.5-Coder-1.5B). `EaModel.from_pretrained`
  reads only this.
* compact (`head.safetensors`): the trained tensors only, in float16. The embeddings are the
  target's and are shared with it at load time. This is what the repository ships
  (`third_party/eagle/heads/`); `export_head` writes the eagle-llm format from it.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

CONFIG = "config.json"
FULL_WEIGHTS = "pytorch_model.bin"  # eagle-llm's format
COMPACT_WEIGHTS = "head.safetensors"  # ours: no embeddings
EMBEDDINGS = "embed_tokens.weight"


def head_config(target_config, intermediate_size: int | None = None, bias: bool = True) -> dict:
    """eagle-llm's `EConfig` fields for a one-layer head over `target_config` (hidden size, heads, vocab).

    `intermediate_size` sets the head's MLP width (None: the target's); the head's width need not
    match the target's, only H and V must.
    """
    c = target_config
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": int(c.vocab_size),
        "hidden_size": int(c.hidden_size),
        "intermediate_size": int(intermediate_size or c.intermediate_size),
        "num_hidden_layers": 1,
        "num_attention_heads": int(c.num_attention_heads),
        "num_key_value_heads": int(getattr(c, "num_key_value_heads", None) or c.num_attention_heads),
        "hidden_act": getattr(c, "hidden_act", "silu"),
        "max_position_embeddings": int(c.max_position_embeddings),
        "rms_norm_eps": float(c.rms_norm_eps),
        "rope_scaling": None,  # eagle-llm's head uses rope base 10000 whatever the target's is
        "pad_token_id": getattr(c, "pad_token_id", None),
        "bos_token_id": getattr(c, "bos_token_id", None),
        "eos_token_id": getattr(c, "eos_token_id", None),
        "bias": bool(bias),  # read by EaModel.__init__: the fc layer's bias
    }


def build_head(config: dict) -> nn.Module:
    """A fresh eagle-llm head (`cnets.Model`) from a `head_config` dict."""
    from eagle.model.cnets import Model
    from eagle.model.configs import EConfig

    fields = {k: v for k, v in config.items() if k != "bias"}
    return Model(EConfig(**fields), bias=config.get("bias", True))


def read_config(folder: str | Path) -> dict:
    path = Path(folder) / CONFIG
    if not path.is_file():
        raise ValueError(f"{folder} is not an EAGLE head folder: {CONFIG} is missing")
    return json.loads(path.read_text())


def is_head_folder(folder: str | Path) -> bool:
    folder = Path(folder)
    return (folder / CONFIG).is_file() and ((folder / FULL_WEIGHTS).is_file() or (folder / COMPACT_WEIGHTS).is_file())


def save_head(
    head: nn.Module,
    config: dict,
    folder: str | Path,
    full: bool = True,
    compact: bool = True,
    metadata: dict | None = None,
) -> Path:
    """Write `config.json`, and `pytorch_model.bin` (eagle-llm format) and/or `head.safetensors` (compact)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    state = {k: v.detach().cpu() for k, v in head.state_dict().items()}
    if full:
        torch.save({k: v.float().contiguous() for k, v in state.items()}, folder / FULL_WEIGHTS)
    if compact:
        trained = {k: v.to(torch.float16).contiguous() for k, v in state.items() if k != EMBEDDINGS}
        save_file(trained, folder / COMPACT_WEIGHTS, metadata={k: str(v) for k, v in (metadata or {}).items()})
    return folder


def load_head_state(folder: str | Path, embeddings: torch.Tensor) -> tuple[dict, bool]:
    """The head's state dict and whether it came from the compact file (embeddings = `embeddings`)."""
    folder = Path(folder)
    if (folder / COMPACT_WEIGHTS).is_file():
        state = load_file(folder / COMPACT_WEIGHTS)
        state[EMBEDDINGS] = embeddings
        return state, True
    if (folder / FULL_WEIGHTS).is_file():
        return torch.load(folder / FULL_WEIGHTS, map_location="cpu", weights_only=True), False
    raise ValueError(f"{folder} holds neither {COMPACT_WEIGHTS} nor {FULL_WEIGHTS}")


def export_head(folder: str | Path, embeddings: torch.Tensor, out: str | Path) -> Path:
    """Write the eagle-llm format (`config.json` + `pytorch_model.bin`) of the head in `folder`.

    `embeddings`: the target's input embedding matrix [V, H] (what the head was trained with).
    """
    config = read_config(folder)
    head = build_head(config)
    state, _ = load_head_state(folder, embeddings.detach().float().cpu())
    head.load_state_dict(state, strict=True)
    return save_head(head, config, out, full=True, compact=False)


# ----------------------------------------------------------------------------- the head's KV state
# eagle-llm's head keeps the keys and values of the (feature, token) pairs it has read in
# `ea_layer.stable_kv` (reset by `reset_kv`, extended by `topK_genrate`). Pair i is the target's
# feature at position i with the token at position i + 1.


def head_length(ea_layer: nn.Module) -> int:
    """Pairs the head has read."""
    kv = getattr(ea_layer, "stable_kv", None)
    return 0 if kv is None else int(kv[0][0].shape[2])


def rewind_head(ea_layer: nn.Module, length: int) -> None:
    """Forget the pairs after the first `length`."""
    if length >= head_length(ea_layer):
        return
    if length == 0:
        ea_layer.stable_kv = None
        return
    ea_layer.stable_kv = tuple((k[:, :, :length], v[:, :, :length]) for k, v in ea_layer.stable_kv)


@torch.no_grad()
def extend_head(ea_layer: nn.Module, features: torch.Tensor, next_tokens: torch.Tensor) -> None:
    """Read more pairs: features [1, n, H] of positions head_length.. with the tokens after them [1, n]."""
    kv = getattr(ea_layer, "stable_kv", None)
    ea_layer.reset()  # clears the tree mask topK_genrate leaves behind
    _, kv = ea_layer(features, input_ids=next_tokens, past_key_values=kv, use_cache=True)
    ea_layer.stable_kv = kv


@contextmanager
def tree_growth(ea_layer: nn.Module, tree_choices: list, tree_buffers: dict, draft_head: nn.Module | None = None):
    """While inside, `ea_layer` grows trees of shape `tree_choices` (`tree_buffers`: eagle-llm's
    `utils_c.generate_tree_buffers` of them), scored by `draft_head` when one is given.

    eagle-llm builds the head's tree layout once, for `mc_sim_7b_63`, whatever tree the caller
    verifies with, and its `initialize_tree` and `update_inference_inputs` pass the target's full
    LM head to `topK_genrate`. These are the seams that let a decoder choose both without copying
    them; the head is left as it was on exit.
    """
    saved = ea_layer.tree, ea_layer.tree_buffer
    ea_layer.tree, ea_layer.tree_buffer = tree_choices, tree_buffers
    if draft_head is not None:
        grow = type(ea_layer).topK_genrate

        def topK_genrate(hidden_states, input_ids, head=None, logits_processor=None, **kwargs):
            return grow(ea_layer, hidden_states, input_ids, draft_head, logits_processor, **kwargs)

        ea_layer.topK_genrate = topK_genrate
    try:
        yield
    finally:
        ea_layer.__dict__.pop("topK_genrate", None)
        ea_layer.tree, ea_layer.tree_buffer = saved
