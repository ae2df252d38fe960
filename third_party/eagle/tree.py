"""Running a standard transformers decoder over [lagging tokens + draft tree]: the target's forward
that `TransformersEagleBase` gives eagle-llm (Llama, Qwen2, Qwen3, Mistral without sliding windows).

* an explicit 4D mask: causal over the new tokens, then eagle-llm's tree mask on the last N
  (a tree node sees the context and its ancestors only);
* explicit position ids (tree nodes at depth d share position `start + d`);
* keys and values in eagle-llm's `KVCache` pairs (`KVBuffers`), through `BufferCache`.

Nothing is copied: the modules called are the target's own. (A routed subset of the layers, the
slim verifier, is the adapter's business: `viasd_adapters.routing.SlimModel` runs trees too.)
"""

from __future__ import annotations

import torch
from torch import nn

from .kv import BufferCache


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


class TransformersLayers:
    """A transformers decoder run layer by layer over new tokens with a tree mask and KV buffers."""

    SUPPORTED = ("llama", "qwen2", "qwen3", "mistral")

    def __init__(self, model: nn.Module, step=None):
        """`step`: a faster forward of the same layers, called as `step(ids [n], kv, mask [n, past + n],
        positions [n]) -> hidden [n, H]` with `kv = step.buffers(keys, values, past)` over the KV
        buffers (layer -> [H_kv, S, D]); None: the model's own layers, one by one."""
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
        self.body = model.get_decoder()  # embed_tokens, layers, norm, rotary_emb
        self.lm_head = model.get_output_embeddings()
        self.config = config
        self.step = step

    def forward(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, caches: list | None, tree_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Normed last hidden states [1, n, H] of `input_ids` ([1, n]) at `position_ids` ([n]).

        `caches` (eagle-llm's list of [key, value] `KVCache` pairs) gets the new keys and values;
        None runs without a cache (training, features).
        """
        past = 0
        if caches is not None:
            past = int(next(pair for pair in caches if pair is not None)[0].current_length)
        n = input_ids.shape[1]
        if self.step is not None and caches is not None:
            return self._step(input_ids, position_ids, caches, tree_mask, past)
        hidden = self.body.embed_tokens(input_ids)
        position_ids = position_ids.reshape(1, n).to(hidden.device)
        cache = BufferCache(caches) if caches is not None else None
        kwargs = dict(
            attention_mask=tree_mask_4d(past, n, tree_mask, hidden.device),
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
            cache_position=torch.arange(past, past + n, device=hidden.device),
            position_embeddings=self.body.rotary_emb(hidden, position_ids),
        )
        for layer in self.body.layers:
            out = layer(hidden, **kwargs)
            hidden = out[0] if isinstance(out, tuple) else out
        return self.body.norm(hidden)

    def _step(self, input_ids, position_ids, caches: list, tree_mask, past: int) -> torch.Tensor:
        n = input_ids.shape[1]
        pairs = {i: pair for i, pair in enumerate(caches) if pair is not None}
        kv = self.step.buffers(
            {i: p[0].data[0] for i, p in pairs.items()}, {i: p[1].data[0] for i, p in pairs.items()}, past
        )
        # a causal block (the prompt) is the step's default; a tree is a mask
        mask = None if tree_mask is None else tree_mask_4d(past, n, tree_mask, input_ids.device)[0, 0]  # [n, past + n]
        hidden = self.step(input_ids[0], kv, mask=mask, positions=position_ids.reshape(n))
        for pair in pairs.values():
            for buffer in pair:
                buffer.current_length.fill_(past + n)
        return hidden[None]
