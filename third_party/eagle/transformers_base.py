"""`TransformersEagleBase`: a standard transformers causal LM as eagle-llm's `EaModel.base_model`.

Why: `EaModel.from_pretrained` loads Llama targets with eagle-llm's own `modeling_llama_kv`
(which ignores `rope_theta`) and *every other architecture* as Mixtral, silently. Qwen2 targets
therefore never work, and Llama targets whose rope base is not 10000 (SmolLM2: 100000) decode a
different model than transformers does.

What eagle-llm asks of a base model (read off `ea_model.py`, `utils.py`, `kv_cache.py`):
* `base_model.model(input_ids=, attention_mask=, past_key_values=, position_ids=)` returning the
  normed last hidden states first, with `past_key_values` eagle-llm's list of `[key, value]`
  `KVCache` pairs, and the tree mask read from the attribute `base_model.model.tree_mask`
  (eagle-llm's `initialize_tree` / `reset_tree_mode` write it);
* `base_model.lm_head`, `base_model.config`, `base_model.dtype`, and
  `base_model.model.layers[i].self_attn.q_proj.weight` (its device lookups).

This class provides exactly that over the unmodified transformers model (shared, never copied);
the layers run through `tree.TransformersLayers` with 4D tree masks. Stock `EaModel.eagenerate`,
`tree_decoding`, `evaluate_posterior` and `update_inference_inputs` then work unchanged.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import CausalLMOutputWithPast

from .tree import TransformersLayers


class _TreeDecoder(nn.Module):
    """`base_model.model` for eagle-llm: the target's decoder, run with the tree mask eagle-llm sets."""

    def __init__(self, layers: TransformersLayers):
        super().__init__()
        self.embed_tokens = layers.body.embed_tokens
        self.layers = layers.body.layers
        self.norm = layers.body.norm
        self.tree_mask = None  # [1, 1, N, N]; set and cleared by eagle-llm's initialize_tree / reset_tree_mode
        self.tree_mode = None  # written by eagle-llm's reset_tree_mode; unused
        self._run = layers

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, position_ids=None, **unused):
        """eagle-llm's call: returns (normed hidden [1, n, H],)."""
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("eagle tree decoding does not support padding (batch size 1 only)")
        B, n = input_ids.shape
        if B != 1:
            raise ValueError(f"eagle tree decoding runs batch size 1, got {B}")
        if position_ids is None:
            past = 0
            if past_key_values is not None:
                past = int(next(p for p in past_key_values if p is not None)[0].current_length)
            position_ids = torch.arange(past, past + n, device=input_ids.device)
        # The tree mask covers the last N tokens only when the call feeds a tree (more than one token).
        tree_mask = self.tree_mask if self.tree_mask is not None and n > 1 else None
        return (self._run.forward(input_ids, position_ids, past_key_values, tree_mask),)


class TransformersEagleBase(nn.Module):
    """eagle-llm's base-model interface over a transformers Llama / Qwen2 / Qwen3 / Mistral causal LM."""

    def __init__(self, model: PreTrainedModel, step=None):
        """`step`: a faster forward of the model's layers (see `TransformersLayers`); None: its own."""
        super().__init__()
        self.tree_layers = TransformersLayers(model, step)  # raises for unsupported architectures
        self.target = model  # the transformers model itself (what AR decoding runs)
        self.model = _TreeDecoder(self.tree_layers)
        self.lm_head = model.get_output_embeddings()
        self.config = model.config

    # The target's, not the head's weight: a quantised head keeps no dense weight to ask.
    @property
    def dtype(self) -> torch.dtype:
        return self.target.dtype

    @property
    def device(self) -> torch.device:
        return self.target.device

    def forward(self, input_ids, past_key_values=None, position_ids=None, **unused):
        """Logits of every position (eagle-llm's `naive_generate` calls the base model this way)."""
        hidden = self.model(input_ids=input_ids, past_key_values=past_key_values, position_ids=position_ids)[0]
        return CausalLMOutputWithPast(logits=self.lm_head(hidden))
