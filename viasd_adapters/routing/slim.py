"""The slim verifier u: a view of the target q that runs only the decoder layers its mask keeps.

`SlimModel(target, mask)` holds references to the target's own modules (embeddings, rotary
embedding, decoder layers, final norm, LM head): no weight is copied and nothing global is
changed, so any number of slim views and the full target work side by side. It is called like a
transformers causal LM,

    out = slim(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=m)
    out.logits  # [B, m, V]

so a `CausalLMRunner(slim)` drives it with its own `DynamicCache`, rollback (crop) included.
The cache holds KV only for the layers whose attention runs; positions come from the first of
those layers (`cache_layer`), never from layer 0, which the slim may skip.

Staged API (prefix reuse). Layers [0, p) with p = `num_prefix_layers` compute the same thing in
the slim view and in the full model. Run them once and hand the hidden states to both:

    state = slim.embed(new_ids, start)                      # [B, T, H] entering layer 0
    state = slim.run_layers(state, shared_cache, stop=p)    # layers [0, p): KV into shared_cache
    u = slim.head(slim.run_layers(state, slim_cache), m)    # slim's kept layers in [p, L)
    q = full.head(full.run_layers(state, full_cache), m)    # full = SlimModel(target, RoutingMask.none())

Every cache is indexed by the target's layer numbers, so `shared_cache` may simply be
`full_cache` (its layers [0, p) then run ahead of its layers [p, L)). See docs/results/routing.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import Cache
from transformers.masking_utils import (
    ALL_MASK_ATTENTION_FUNCTIONS,
    causal_mask_function,
    sliding_window_causal_mask_function,
)
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..models.compiled import StaticKV, decode_step, register_step
from .mask import RoutingMask

FULL, SLIDING = "full_attention", "sliding_attention"


@dataclass(frozen=True)
class _Family:
    """How one transformers architecture wires its decoder (what differs between families)."""

    embed_scale: bool = False  # the model body multiplies embeddings by sqrt(H) (Gemma 1/2)
    local_rotary: bool = False  # sliding layers use a second rotary embedding (Gemma 3)
    logit_softcap: bool = False  # logits = c * tanh(logits / c), c = config.final_logit_softcapping
    sliding_by_default: bool = False  # layers without `attention_type` slide when config.sliding_window is set
    # Layers are pre-norm blocks x + attn(input_layernorm(x)), then x + mlp(post_attention_layernorm(x)),
    # so attention and MLP can be skipped separately.
    sub_blocks: bool = True


FAMILIES: dict[str, _Family] = {
    "llama": _Family(),
    "qwen2": _Family(),
    "qwen3": _Family(),
    "mistral": _Family(sliding_by_default=True),
    "gemma": _Family(embed_scale=True),
    "gemma2": _Family(embed_scale=True, logit_softcap=True, sub_blocks=False),
    "gemma3_text": _Family(local_rotary=True, logit_softcap=True, sub_blocks=False),
}


@dataclass
class HiddenState:
    """Hidden states of T consecutive tokens between two decoder layers (batch B)."""

    hidden: torch.Tensor  # [B, T, H], the input of decoder layer `next_layer`
    start: int  # position of the first of the T tokens
    next_layer: int  # 0..L; L means every decoder layer ran (ready for `head`)

    @property
    def end(self) -> int:
        return self.start + self.hidden.shape[1]

    def cat(self, later: HiddenState) -> HiddenState:
        """These tokens followed by `later`'s (same layer, consecutive positions)."""
        if later.next_layer != self.next_layer or later.start != self.end:
            raise ValueError(
                f"cannot join states at layer {self.next_layer} positions [{self.start}, {self.end}) and "
                f"layer {later.next_layer} positions [{later.start}, {later.end})"
            )
        return replace(self, hidden=torch.cat([self.hidden, later.hidden], dim=1))

    def positions(self, begin: int, end: int | None = None) -> HiddenState:
        """The tokens at absolute positions [begin, end)."""
        end = self.end if end is None else end
        if not self.start <= begin <= end <= self.end:
            raise ValueError(f"positions [{begin}, {end}) are not inside [{self.start}, {self.end})")
        return replace(self, hidden=self.hidden[:, begin - self.start : end - self.start], start=begin)


@dataclass(frozen=True)
class _Step:
    layer: int  # the target's decoder layer index
    attention: bool  # run its self-attention sub-block
    mlp: bool  # run its MLP sub-block


class SlimModel(nn.Module):
    """The target with the decoder layers (or sub-blocks) of `mask` skipped; a view, never a copy."""

    def __init__(self, target: PreTrainedModel, mask: RoutingMask):
        super().__init__()
        model_type = getattr(target.config, "model_type", None)
        if model_type not in FAMILIES:
            raise ValueError(
                f"the slim verifier does not support {type(target).__name__} (model_type {model_type!r}); "
                f"supported model types: {', '.join(sorted(FAMILIES))}"
            )
        body = target.get_decoder()
        for part in ("embed_tokens", "layers", "norm", "rotary_emb"):
            if not hasattr(body, part):
                raise ValueError(
                    f"{type(target).__name__}'s decoder {type(body).__name__} has no `{part}`: "
                    "the slim verifier needs a decoder-only transformers causal LM"
                )
        self.family = FAMILIES[model_type]
        num_layers = len(body.layers)
        name = Path(getattr(target.config, "_name_or_path", "") or model_type).name
        self.mask = mask.bind(num_layers, name)
        if not self.mask.is_layer_mask and not self.family.sub_blocks:
            raise ValueError(
                f"sub-block masks (skip_attention / skip_mlp) are not supported for {model_type}: "
                "its layers add extra norms around each sub-block; skip whole layers instead"
            )
        self.config = target.config  # shared, read-only
        self.num_layers = num_layers
        # References to the target's modules (registered, so .parameters() lists the shared tensors).
        self.embed_tokens = body.embed_tokens
        self.rotary_emb = body.rotary_emb
        self.rotary_emb_local = body.rotary_emb_local if self.family.local_rotary else None
        self.norm = body.norm
        self.lm_head = target.get_output_embeddings()
        self.layers = nn.ModuleDict(
            {str(i): body.layers[i] for i in range(num_layers) if i not in self.mask.skip_layers}
        )
        self.plan = tuple(
            _Step(i, self.mask.runs_attention(i), self.mask.runs_mlp(i))
            for i in range(num_layers)
            if i not in self.mask.skip_layers
        )
        self.cache_layer = next(s.layer for s in self.plan if s.attention)  # the mask keeps >= 1 attention
        self.num_prefix_layers = self.mask.num_prefix_layers(num_layers)
        self._attention_types = {i: self._attention_type(body.layers[i]) for i in range(num_layers)}

    # ------------------------------------------------------------------ what a runner reads
    @property
    def device(self) -> torch.device:
        return self.norm.weight.device  # not the head's: an int8 head has no dense weight

    @property
    def dtype(self) -> torch.dtype:
        return self.norm.weight.dtype

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def get_input_embeddings(self) -> nn.Module:
        return self.embed_tokens

    def cached_length(self, cache: Cache) -> int:
        """Tokens this view's cache holds (read from its first attention layer, not layer 0)."""
        return cache.get_seq_length(self.cache_layer)

    def extra_repr(self) -> str:
        return f"{self.mask.describe()}, {len(self.plan)} of {self.num_layers} layers run"

    # ------------------------------------------------------------------ the causal-LM call
    def forward(
        self,
        input_ids: torch.Tensor,
        past_key_values: Cache | None = None,
        use_cache: bool = True,
        logits_to_keep: int | slice = 0,
        attention_mask: torch.Tensor | None = None,
    ) -> CausalLMOutputWithPast:
        """Logits of the last `logits_to_keep` positions (0: all), as `PreTrainedModel.forward`.

        Args:
            input_ids: [B, T] the tokens `past_key_values` does not hold yet.
            past_key_values: this view's own cache (created when None and use_cache).
            attention_mask: None or all ones; padding is not supported.
        Returns:
            `.logits` [B, m, V] and `.past_key_values`.
        """
        if attention_mask is not None and not bool(attention_mask.all()):
            raise ValueError("the slim verifier does not support padding: pass unpadded sequences")
        if past_key_values is None and use_cache:
            past_key_values = DynamicCache()
        start = self.cached_length(past_key_values) if past_key_values is not None else 0
        state = self.run_layers(self.embed(input_ids, start), past_key_values)
        logits = self.head(state, logits_to_keep)
        # transformers annotates `logits` as the legacy FloatTensor subclass, which no model's logits are
        return CausalLMOutputWithPast(logits=logits, past_key_values=past_key_values)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ staged API
    def embed(self, input_ids: torch.Tensor, start: int) -> HiddenState:
        """[B, T] token ids at positions [start, start + T) -> the input of decoder layer 0."""
        hidden = self.embed_tokens(input_ids)  # [B, T, H]
        if self.family.embed_scale:
            hidden = hidden * torch.tensor(self.config.hidden_size**0.5, dtype=hidden.dtype)
        return HiddenState(hidden, int(start), 0)

    def run_layers(
        self,
        state: HiddenState,
        past_key_values: Cache | None,
        stop: int | None = None,
        tree: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> HiddenState:
        """Run this view's steps for decoder layers [state.next_layer, stop) (stop None: to the end).

        Each attention layer reads and extends `past_key_values` at its own (the target's) layer
        index; those layers must hold exactly `state.start` tokens (or the cache is None).
        `tree`: (positions [T] long, attend [T, T] bool) of the T new tokens, for a draft tree
        (`DraftTree.layout`): each attends to every cached token and to the new ones `attend`
        marks, at its own position; None: causal, at positions start, start + 1, ...
        """
        stop = self.num_layers if stop is None else stop
        if not state.next_layer <= stop <= self.num_layers:
            raise ValueError(f"cannot run layers [{state.next_layer}, {stop}) of a {self.num_layers}-layer model")
        steps = [s for s in self.plan if state.next_layer <= s.layer < stop]
        if not steps:
            return replace(state, next_layer=stop)
        hidden = state.hidden
        B, T, _ = hidden.shape
        cached = state.start if past_key_values is not None else 0
        for s in steps:
            if s.attention and past_key_values is not None and past_key_values.get_seq_length(s.layer) != cached:
                raise ValueError(
                    f"layer {s.layer}'s cache holds {past_key_values.get_seq_length(s.layer)} tokens, but the "
                    f"hidden states start at position {state.start}: crop or catch up the cache first"
                )
        cache_position = torch.arange(state.start, state.start + T, device=hidden.device)  # the cache slots
        position_ids = (cache_position if tree is None else tree[0].to(hidden.device))[None].expand(B, -1)
        rotary = {FULL: self.rotary_emb(hidden, position_ids)}
        if self.rotary_emb_local is not None:
            rotary[SLIDING] = self.rotary_emb_local(hidden, position_ids)
        types = {self._attention_types[s.layer] for s in steps}
        if tree is None:
            masks = self._masks(
                B, cache_position, kv_length=cached + T, kv_offset=state.start - cached, dtype=hidden.dtype, types=types
            )
        else:
            masks = dict.fromkeys(types, self._tree_mask(B, cached, tree[1].to(hidden.device), hidden.dtype, types))
        for s in steps:
            layer = self.layers[str(s.layer)]
            kind = self._attention_types[s.layer]
            kwargs = dict(
                attention_mask=masks[kind],
                position_ids=position_ids,
                past_key_values=past_key_values,
                use_cache=past_key_values is not None,
                cache_position=cache_position,
            )
            if self.rotary_emb_local is not None:
                kwargs.update(position_embeddings_global=rotary[FULL], position_embeddings_local=rotary[SLIDING])
            else:
                kwargs["position_embeddings"] = rotary[FULL]
            if s.attention and s.mlp:
                out = layer(hidden, **kwargs)  # the target's own layer forward
                hidden = out[0] if isinstance(out, tuple) else out
            else:
                hidden = self._run_sub_blocks(layer, hidden, s, kwargs)
        return HiddenState(hidden, state.start, stop)

    def head(self, state: HiddenState, logits_to_keep: int | slice = 0) -> torch.Tensor:
        """Final norm and LM head over the last `logits_to_keep` positions (0: all) -> [B, m, V]."""
        return self.logits(self.normed(state, logits_to_keep))

    def normed(self, state: HiddenState, logits_to_keep: int | slice = 0) -> torch.Tensor:
        """The final norm over the last `logits_to_keep` positions (0: all) -> [B, m, H]: the
        features a feature-reading drafter (EAGLE's head) takes."""
        if state.next_layer != self.num_layers:
            raise ValueError(f"the hidden states are at layer {state.next_layer}: run_layers to the end first")
        keep = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        return self.norm(state.hidden[:, keep])

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """The LM head over final-normed hidden states [B, m, H] -> [B, m, V]."""
        logits = self.lm_head(normed)
        cap = getattr(self.config, "final_logit_softcapping", None) if self.family.logit_softcap else None
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    # ------------------------------------------------------------------ internals
    def _attention_type(self, layer: nn.Module) -> str:
        kind = getattr(layer, "attention_type", None)
        if kind is None:
            sliding = self.family.sliding_by_default and getattr(self.config, "sliding_window", None) is not None
            kind = SLIDING if sliding else FULL
        if kind not in (FULL, SLIDING):
            raise ValueError(f"attention type {kind!r} is not supported by the slim verifier")
        return kind

    def _masks(
        self, B: int, cache_position: torch.Tensor, kv_length: int, kv_offset: int, dtype: torch.dtype, types: set[str]
    ) -> dict[str, torch.Tensor | None]:
        """The attention mask of each attention type, as the target's own forward would build it."""
        impl = self.config._attn_implementation
        if impl not in ALL_MASK_ATTENTION_FUNCTIONS:  # e.g. paged backends that need no mask
            return {kind: None for kind in types}
        make = ALL_MASK_ATTENTION_FUNCTIONS[impl]
        masks = {}
        for kind in types:
            kwargs = dict(mask_function=causal_mask_function)
            if kind == SLIDING:
                window = self.config.sliding_window
                kwargs = dict(mask_function=sliding_window_causal_mask_function(window), local_size=window)
            masks[kind] = make(
                batch_size=B,
                cache_position=cache_position,
                kv_length=kv_length,
                kv_offset=kv_offset,
                attention_mask=None,
                allow_is_causal_skip=True,
                dtype=dtype,
                config=self.config,
                **kwargs,
            )
        return masks

    def _tree_mask(self, B: int, cached: int, attend: torch.Tensor, dtype: torch.dtype, types: set[str]):
        """[B, 1, T, cached + T] mask of a tree forward: every cached token, then `attend` ([T, T])."""
        if SLIDING in types:
            raise NotImplementedError("a draft tree over sliding-window layers: the windowed tree mask is not written")
        T = attend.shape[0]
        allowed = torch.cat([attend.new_ones(T, cached), attend], dim=1)[None, None].expand(B, 1, -1, -1)
        impl = self.config._attn_implementation
        if impl == "sdpa":
            return allowed
        if impl == "eager":  # an additive mask
            return torch.zeros(allowed.shape, dtype=dtype, device=attend.device).masked_fill(
                ~allowed, torch.finfo(dtype).min
            )
        raise ValueError(
            f"a draft tree needs an explicit attention mask: load the target with attn_implementation"
            f" 'sdpa' or 'eager', not {impl!r}"
        )

    @staticmethod
    def _run_sub_blocks(layer: Any, hidden: torch.Tensor, step: _Step, kwargs: dict) -> torch.Tensor:
        """A pre-norm layer with one sub-block skipped, from the layer's own submodules (`layer`: a
        transformers decoder layer, whose submodules are known by name, not by type)."""
        if step.attention:
            attn_out = layer.self_attn(hidden_states=layer.input_layernorm(hidden), **kwargs)
            hidden = hidden + (attn_out[0] if isinstance(attn_out, tuple) else attn_out)
        if step.mlp:
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return hidden


def keep_positions(cache: Cache | StaticKV, start: int, positions: torch.Tensor) -> None:
    """Keep the first `start` positions of every layer of `cache`, then those at `positions` ([n]
    long, all >= start), in that order: the accepted path of a draft tree replaces the tree."""
    if isinstance(cache, StaticKV):
        cache.keep(start, positions)
        return
    for layer in cache.layers:
        keys, values = layer.keys, layer.values
        if keys is None or values is None or keys.numel() == 0:  # a layer this view skips
            continue
        index = torch.cat([torch.arange(start, device=keys.device), positions.to(keys.device)])
        layer.keys, layer.values = keys[..., index, :], values[..., index, :]


def decoding_view(target: PreTrainedModel, mask: RoutingMask) -> SlimModel:
    """The slim view of `target` as a tiered verifier runs it: on the target's compiled decode step
    where it has one (timing a view eagerly beside a compiled target prices the slim pass wrong)."""
    view = SlimModel(target, mask)
    compile_view(view, target)
    return view


def compile_view(view: SlimModel, target: PreTrainedModel) -> bool:
    """Run `view` on `target`'s compiled decode step (the view's layers and sub-blocks only), when the
    target has one; returns whether it does."""
    step = decode_step(target)
    if step is None:
        return False
    register_step(view, step.view([(s.layer, s.attention, s.mlp) for s in view.plan]))
    return True
