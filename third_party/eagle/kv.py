"""Preallocated KV buffers in eagle-llm's layout, for the full target or any view of its layers.

eagle-llm 1.2.1 keeps one preallocated tensor per device for all layers' keys and values
(`kv_cache.initialize_past_key_values`) and hands its models a list, one `[key, value]` pair of
`KVCache` objects per decoder layer; `utils.update_inference_inputs` compacts the accepted tree
path by copying buffer positions in every tensor of a list and resetting every current length.
`KVBuffers` is the same interface for any subset of layers (a slim view keeps only the layers it
attends with), with the length sized by the caller instead of `max_position_embeddings`, so its
`tensors` and `lengths` can be passed to eagle-llm's own `update_inference_inputs`. Each key and
each value buffer is a tensor of its own: the compiled decode step writes a layer's keys and
values in place, and when two graph inputs view one storage, torch.compile copies that storage
in and out around every layer call (2 x 4 MB a layer call of Qwen2.5-Coder-1.5B at 2048
positions).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from eagle.model.kv_cache import KVCache


def head_dim(config) -> int:
    """D of one attention head (models such as Qwen3 set it apart from hidden_size / heads)."""
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


class KVBuffers:
    """Keys and values of one model view, for the layers in `layers`, at most `max_length` positions.

    `caches[i]` is the `[key, value]` `KVCache` pair of the target's decoder layer i (None for a
    layer the view does not attend with): the `past_key_values` list eagle-llm's models take.
    """

    def __init__(self, config, layers: Iterable[int], max_length: int, dtype: torch.dtype, device: torch.device | str):
        layers = sorted(set(layers))
        L = int(config.num_hidden_layers)
        if not layers or layers[0] < 0 or layers[-1] >= L:
            raise ValueError(f"layers {layers} do not index a {L}-layer model")
        H_kv = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        self.layers = tuple(layers)
        self.max_length = int(max_length)
        # 2 L' buffers [1, H_kv, S, D] (layer j's key, then its value) and one length each, the
        # lengths on the CPU as eagle-llm keeps them
        shape = (1, H_kv, self.max_length, head_dim(config))
        self.tensors = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(2 * len(layers))]
        self.lengths = torch.zeros(2 * len(layers), dtype=torch.long)
        self.caches: list[list[KVCache] | None] = [None] * L
        for j, i in enumerate(layers):
            self.caches[i] = [KVCache(self.tensors[2 * j + k], self.lengths[2 * j + k]) for k in range(2)]

    @property
    def length(self) -> int:
        """Positions held (equal for every layer)."""
        return int(self.lengths[0])

    def reset(self) -> None:
        self.lengths.zero_()

    def crop(self, length: int) -> None:
        """Keep the first `length` positions."""
        assert 0 <= length <= self.length
        self.lengths.fill_(length)

    def keep(self, start: int, positions: torch.Tensor) -> None:
        """Move `positions` ([n] long, all >= start) to start..start+n-1 and drop everything after.

        The compaction of eagle-llm's `update_inference_inputs`: the accepted tree path replaces the
        whole tree.
        """
        src = positions.to(self.tensors[0].device)
        n = src.numel()
        for buffer in self.tensors:
            buffer[..., start : start + n, :] = buffer[..., src, :]
        self.lengths.fill_(start + n)

    def room(self, n: int) -> None:
        """Raise if `n` more positions do not fit."""
        if self.length + n > self.max_length:
            raise ValueError(
                f"the KV buffers hold {self.max_length} positions; {self.length} are used and {n} more are"
                " needed: raise max_length"
            )


class BufferCache:
    """The `Cache.update` call a transformers decoder layer makes, served from `KVBuffers` caches.

    Only `update` is used: the layers run by `tree.TransformersLayers` never see another Cache
    method (masks and positions are built outside). Keys are indexed by the target's layer index.
    """

    def __init__(self, caches: list[list[KVCache] | None]):
        self.caches = caches

    def update(self, key_states, value_states, layer_idx: int, cache_kwargs=None):
        pair = self.caches[layer_idx]
        assert pair is not None, f"layer {layer_idx} has no KV buffer in this view"
        return pair[0].cat(key_states, dim=2), pair[1].cat(value_states, dim=2)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        pair = self.caches[layer_idx]
        return int(pair[0].current_length) if pair is not None else 0
