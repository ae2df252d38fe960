"""Running a target's own decoder layers over [lagging tokens + draft tree], all or a routed subset.

Two layer conventions exist: eagle-llm 1.2.1's `modeling_llama_kv` (what `EaModel.from_pretrained`
loads for Llama targets) and standard transformers decoders (Llama, Qwen2, Qwen3, Mistral without
sliding windows). Each `TreeLayers` runs one of them with

* an explicit 4D mask: causal over the new tokens, then eagle-llm's tree mask on the last N
  (a tree node sees the context and its ancestors only);
* explicit position ids (tree nodes at depth d share position `start + d`);
* keys and values in `KVBuffers` (one view's own buffers; a slim view attends with fewer layers);
* an optional `RoutingMask`: the layers (or attention / MLP sub-blocks) it skips are not run.

Nothing is copied: the modules called are the target's own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from .kv import BufferCache, KVBuffers


def tree_mask_4d(past: int, n: int, tree_mask: torch.Tensor | None, device) -> torch.Tensor:
    """[1, 1, n, past + n] bool, True where attending: causal, then `tree_mask` on the last N rows/columns.

    Args:
        past: positions already in the KV buffers.
        n: new tokens (lagging committed tokens, then the N tree nodes).
        tree_mask: eagle-llm's [1, 1, N, N] tree attention mask (1: ancestor or self), or None.
    """
    rows = torch.arange(n, device=device)[:, None] + past
    cols = torch.arange(past + n, device=device)[None, :]
    allowed = cols <= rows  # [n, past + n]
    if tree_mask is not None:
        N = tree_mask.shape[-1]
        allowed[-N:, -N:] &= tree_mask[0, 0].to(device=device, dtype=torch.bool)
    return allowed[None, None]


class TreeLayers(ABC):
    """A target's decoder, run layer by layer over new tokens with a tree mask and KV buffers."""

    def __init__(self, body: nn.Module, lm_head: nn.Module, config):
        self.body = body  # the decoder: embed_tokens, layers, norm
        self.lm_head = lm_head
        self.config = config

    @property
    def num_layers(self) -> int:
        return len(self.body.layers)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[1, n] ids -> [1, n, H]."""
        return self.body.embed_tokens(input_ids)

    def norm(self, hidden: torch.Tensor) -> torch.Tensor:
        """The final norm: eagle-llm's features are the normed last hidden states."""
        return self.body.norm(hidden)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, kv: KVBuffers | list | None,
                tree_mask: torch.Tensor | None, routing=None) -> torch.Tensor:
        """Normed last hidden states [1, n, H] of `input_ids` ([1, n]) at `position_ids` ([n]).

        `kv` (KVBuffers, or eagle-llm's list of [key, value] KVCache pairs) gets the new keys and
        values of every layer that attends; None runs without a cache (training, features).
        """
        caches = kv.caches if isinstance(kv, KVBuffers) else kv
        past = 0
        if caches is not None:
            first = next(i for i, pair in enumerate(caches) if pair is not None)
            past = int(caches[first][0].current_length)
        hidden = self.embed(input_ids)
        n = input_ids.shape[1]
        position_ids = position_ids.reshape(1, n).to(hidden.device)
        mask = self.mask(past, n, tree_mask, hidden)
        ctx = self.context(hidden, position_ids, past, caches)
        for i in range(self.num_layers):
            attention = routing is None or routing.runs_attention(i)
            mlp = routing is None or routing.runs_mlp(i)
            if attention and mlp:
                hidden = self.layer(i, hidden, mask, position_ids, ctx)
            elif attention or mlp:
                layer = self.body.layers[i]
                if attention:
                    hidden = hidden + self.attention(i, layer.input_layernorm(hidden), mask, position_ids, ctx)
                if mlp:
                    hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.norm(hidden)

    @abstractmethod
    def mask(self, past: int, n: int, tree_mask, hidden: torch.Tensor) -> torch.Tensor:
        """The attention mask in the form these layers take."""

    def context(self, hidden, position_ids, past, caches) -> dict:
        """Per-call inputs shared by all layers (rotary embeddings, cache objects)."""
        return {"caches": caches}

    @abstractmethod
    def layer(self, i: int, hidden, mask, position_ids, ctx) -> torch.Tensor:
        """Decoder layer i, whole."""

    @abstractmethod
    def attention(self, i: int, normed, mask, position_ids, ctx) -> torch.Tensor:
        """The self-attention sub-block of layer i on already normed input (residual not added)."""


class EagleLlamaLayers(TreeLayers):
    """eagle-llm 1.2.1's own Llama (`modeling_llama_kv`): additive float32 masks, KVCache pairs.

    The mask reproduces `LlamaModel._prepare_decoder_attention_mask` of that file (float32, the
    minimum where masked), so with every layer kept this computes what the stock model does.
    """

    def mask(self, past, n, tree_mask, hidden):
        allowed = tree_mask_4d(past, n, tree_mask, hidden.device)
        return torch.zeros(allowed.shape, dtype=torch.float32, device=hidden.device).masked_fill(
            ~allowed, torch.finfo(torch.float32).min)

    def layer(self, i, hidden, mask, position_ids, ctx):
        kv = ctx["caches"][i] if ctx["caches"] is not None else None
        return self.body.layers[i](hidden, attention_mask=mask, position_ids=position_ids, past_key_value=kv,
                                   use_cache=kv is not None)[0]

    def attention(self, i, normed, mask, position_ids, ctx):
        kv = ctx["caches"][i] if ctx["caches"] is not None else None
        return self.body.layers[i].self_attn(hidden_states=normed, attention_mask=mask, position_ids=position_ids,
                                             past_key_value=kv, use_cache=kv is not None)[0]


class TransformersLayers(TreeLayers):
    """A standard transformers decoder (Llama, Qwen2, Qwen3, Mistral): bool 4D masks, rotary outside.

    Keys and values go to `KVBuffers` through `BufferCache`, so eagle-llm's compaction applies.
    """

    SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")

    def __init__(self, model: nn.Module):
        config = model.config
        if config.model_type not in self.SUPPORTED:
            raise ValueError(
                f"EAGLE tree decoding on transformers models supports model types {', '.join(self.SUPPORTED)};"
                f" {type(model).__name__} is {config.model_type!r}"
            )
        sliding = [t for t in (getattr(config, "layer_types", None) or []) if t != "full_attention"]
        if sliding or (config.model_type == "mistral" and getattr(config, "sliding_window", None)):
            raise NotImplementedError(
                f"{config.model_type} with sliding-window layers: the tree mask here is causal over the whole"
                " context; a windowed tree mask is not written yet"
            )
        body = model.get_decoder()
        super().__init__(body, model.get_output_embeddings(), config)

    def mask(self, past, n, tree_mask, hidden):
        return tree_mask_4d(past, n, tree_mask, hidden.device)

    def context(self, hidden, position_ids, past, caches):
        n = hidden.shape[1]
        return {
            "cache": BufferCache(caches) if caches is not None else None,
            "cache_position": torch.arange(past, past + n, device=hidden.device),
            "position_embeddings": self.body.rotary_emb(hidden, position_ids),
        }

    def layer(self, i, hidden, mask, position_ids, ctx):
        out = self.body.layers[i](
            hidden, attention_mask=mask, position_ids=position_ids, past_key_values=ctx["cache"],
            use_cache=ctx["cache"] is not None, cache_position=ctx["cache_position"],
            position_embeddings=ctx["position_embeddings"],
        )
        return out[0] if isinstance(out, tuple) else out

    def attention(self, i, normed, mask, position_ids, ctx):
        return self.body.layers[i].self_attn(
            hidden_states=normed, attention_mask=mask, position_embeddings=ctx["position_embeddings"],
            past_key_values=ctx["cache"], cache_position=ctx["cache_position"],
        )[0]


def layers_for(base_model: nn.Module) -> TreeLayers:
    """The `TreeLayers` of an `EaModel.base_model` (eagle-llm's Llama or `TransformersEagleBase`)."""
    from .transformers_base import TransformersEagleBase  # noqa: PLC0415 (cycle)

    if isinstance(base_model, TransformersEagleBase):
        return base_model.tree_layers
    from eagle.model.modeling_llama_kv import LlamaForCausalLM as EagleLlama

    if isinstance(base_model, EagleLlama):
        return EagleLlamaLayers(base_model.model, base_model.lm_head, base_model.config)
    raise ValueError(
        f"the slim tree pass supports eagle-llm's Llama and transformers targets loaded through"
        f" viasd_adapters.third_party.eagle.load_ea_model, not {type(base_model).__name__} (eagle-llm loads every"
        " non-Llama target as Mixtral: load it with viasd_adapters.third_party.eagle.load_ea_model instead)"
    )
