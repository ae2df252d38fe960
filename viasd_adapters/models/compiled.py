"""A decode step that costs what its GEMMs cost: the decoder layer as one compiled graph.

The eager transformers forward spends most of a small model's CPU step on per-operator overhead
(Python, the dispatcher, ~250 small ops a layer around the GEMMs). `DecodeStep` runs the same
weights through one functional decoder layer compiled by `torch.compile` (Inductor fuses the
norms, rotary embedding, row quantisation, attention and activations into a few C++ kernels):

* the int8 GEMM is one opaque custom operator (`viasd::w8a8_gemm`): fbgemm's packed weights
  are script objects Dynamo cannot trace, so the op takes the `quantize._RowQuantGemm` as an
  opaque reference object and the graph never breaks; it calls that object, so it computes what
  the eager layer computes, with the same kernel for the row count (`int8_gemv`). The one-row
  graph calls the GEMV's own operator on its int8 tensors instead (`viasd::w8a8_gemv`, the same
  kernel), so that it holds no Python object and Inductor writes its wrapper in C++. Whole layers
  over a chain of up to `GEMV_MAX_ROWS` rows (decode steps, verify blocks) run that layer
  exported and compiled ahead of time instead, an AOTInductor package the step calls without
  entering Dynamo (`packaged.PackagedLayer`);
* one graph serves every layer (the layer's weights are inputs, not constants) and every row
  count above one (rows and a tree's gathered length are dynamic), so a model compiles a block
  graph per buffer size and a package; a one-token graph only where the package does not serve
  (a tree's rows, a slim view's half layers). Graphs land in Inductor's on-disk cache
  (`inductor_cache_dir`);
* keys and values live in preallocated buffers (`StaticKV`), written in place at the new rows'
  positions by the attention's opaque operator (`viasd::attend`); rolling back is lowering a length;
* attention is computed row by row with shapes that do not depend on the block: a block's row j
  sees exactly the keys the one-token step at its position sees, with the same arithmetic, so a
  verify block reproduces the steps it replaces (tests/models/test_compiled.py). A row's keys are
  a count, over gathered positions for a draft tree (EAGLE): a tree is an order, not another path.

Supported: Llama, Qwen2, and Mistral without sliding windows, in fp32, bf16 or the project's int8. Anything else raises `UnsupportedModel`, and callers fall
back to eager with a log line.

Terms: n new rows, H hidden size, Hq / Hkv query / key-value heads, D head size, S buffer length.
"""

from __future__ import annotations

import copy
import functools
import logging
import math
import os
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch
import torch.nn.functional as F
from torch._inductor.runtime.cache_dir_utils import default_cache_dir
from torch._library.opaque_object import get_opaque_type_name, register_opaque_type
from torch._opaque_base import OpaqueBase
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from . import native
from .int8_gemv import GEMV_MAX_ROWS, gemv_enabled
from .offline import cache_root
from .packaged import PackagedLayer
from .quantize import Int8Linear, Int8Projection, _RowQuantGemm

logger = logging.getLogger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")
MAX_BLOCK_ROWS = 64  # longer inputs (a prompt) run as blocks of this many rows
KV_GROWTH = 2048  # buffers grow by whole multiples of this many positions (each size compiles once)
RECOMPILE_LIMIT = 64  # graphs of the layer function a process may compile
# Every graph and package of the layer runs Inductor's kernels on one thread: a one-row step leaves
# threads idle, which Inductor fills by splitting a row's reductions (norms, attention) across them,
# a sum order that a block's graph, parallel over its rows, does not share; at the 1.5B's widths that
# moved logits by up to 1.5 and broke greedy SD's equality with AR. The GEMMs keep every thread.
INDUCTOR_OPTIONS = MappingProxyType({"cpp.threads": 1})
ATTENTION_ALIGN = 64  # attended length rounded up to this (whole SIMD vectors, fewer shapes)


def attended_length(keys: int, capacity: int) -> int:
    """The width of a draft tree's gathered positions when its last row has `keys` keys: rounded up
    to ATTENTION_ALIGN, within `capacity` (fewer graph shapes). Each row reads exactly its own keys."""
    return min(-(-keys // ATTENTION_ALIGN) * ATTENTION_ALIGN, capacity)


class UnsupportedModel(ValueError):
    """The model has a layer the compiled step does not implement."""


# ----------------------------------------------------------------------------- the int8 operator
class PackedGemm(OpaqueBase):
    """One `_RowQuantGemm` (its packed int8 weights), as an object the graph passes through."""

    def __init__(self, gemm: _RowQuantGemm | None):
        self.gemm = gemm

    def __reduce__(self):
        # Inductor's cache key pickles graph inputs: the weights are runtime inputs, not part of the
        # graph's identity, so every PackedGemm pickles alike and one cached graph serves them all.
        return (PackedGemm, (None,))


register_opaque_type(PackedGemm, typ="reference")


# Defined with `torch.library.Library` rather than `custom_op`: its Python wrapper costs ~20 µs a
# call against ~8 µs here (measured), and a decode step makes five calls a layer.
_LIBRARY = torch.library.Library("viasd", "DEF")
_LIBRARY.define(f"w8a8_gemm(Tensor rows, {get_opaque_type_name(PackedGemm)} gemm, int out_features) -> Tensor")


def _w8a8_gemm(rows: torch.Tensor, gemm: PackedGemm, out_features: int) -> torch.Tensor:
    """[M, K] fp32 -> [M, N] fp32: `_RowQuantGemm`'s product, its kernel chosen by the row count."""
    return gemm.gemm(rows)


_LIBRARY.impl("w8a8_gemm", _w8a8_gemm, "CPU")


@torch.library.register_fake("viasd::w8a8_gemm", lib=_LIBRARY)
def _(rows, gemm, out_features):
    return rows.new_empty(rows.shape[0], out_features)


w8a8_gemm = torch.ops.viasd.w8a8_gemm


# Attention runs eagerly, as one opaque op (native_ops.cpp; this Python reference where the native
# operators are not built) that first stores the new rows' keys and values in
# the buffers (Inductor's own fused scatter into a graph input corrupted memory with dynamic row
# counts, torch 2.13, measured). Inductor's kernels summed a draft tree's rows (each reading its
# own path, gathered) in another order than a one-token step's, and the tree's tokens parted from
# int8 AR's. Each row is its own attention call with exactly a one-token step's shapes, over
# exactly its own keys: batched over rows, MKL chose other kernels by batch size (natively, 8
# key-value heads, 2048 keys), and over the block's longer length (zeros past the row's keys,
# masked) it split the value sum otherwise past about 200 keys; either way a block's rows parted
# from their steps. Row by row, over the row's own keys, nothing depends on the block. The call is
# torch's fused CPU attention (one op; scores, softmax and values as separate ops cost about twice
# as much at 256 keys, measured). One op for the write and the attention, and key counts given
# rather than summed from a mask, because every op call costs Python: 100 µs less a layer call
# than a write op and a mask-reading attention op (0.5B int8 on a Zen 3, profiler).
def _attend(keys, values, write, k, v, q, counts, order):
    """keys, values [Hkv, S, D]: the buffers, written in place; write [n] long: the positions the
    new rows' k, v [Hkv, n, D] go to; q [n, Hkv, G, D] fp32; counts [n] long: how many keys row j
    reads, positions 0.. with `order` None, else its gathered slots order[j, :count] (see
    `decoder_layer`); order [n, A] long or None -> [n, Hkv, G, D] fp32."""
    keys.index_copy_(1, write, k)
    values.index_copy_(1, write, v)
    rows = []
    for j, count in enumerate(counts.tolist()):
        if order is None:
            K, V = keys[:, :count], values[:, :count]  # [Hkv, count, D]
        else:
            K, V = keys[:, order[j, :count]], values[:, order[j, :count]]
        rows.append(F.scaled_dot_product_attention(q[j, None], K[None].float(), V[None].float()))
    return rows[0] if len(rows) == 1 else torch.cat(rows)


@functools.cache
def _register_native_or_python_ops() -> bool:
    """Define `viasd::attend` (and `viasd::w8a8_gemv`) with their fake implementations; True where
    the native operators serve them."""
    native_ops = native.load() is None
    if not native_ops:
        _LIBRARY.define(
            "attend(Tensor(a!) keys, Tensor(b!) values, Tensor write, Tensor k, Tensor v, Tensor q, Tensor counts,"
            " Tensor? order) -> Tensor"
        )
        _LIBRARY.impl("attend", _attend, "CPU")
    torch.library.register_fake(
        "viasd::attend", lambda keys, values, write, k, v, q, counts, order: torch.empty_like(q), lib=_LIBRARY
    )
    if native_ops:
        for name in ("viasd::w8a8_gemv", "viasd::w4a8_gemv"):  # weight [N, ...] after the rows
            torch.library.register_fake(
                name, lambda rows, weight, *_: rows.new_empty(rows.shape[0], weight.shape[0]), lib=_LIBRARY
            )
    return native_ops


# ----------------------------------------------------------------------------- weights as graph inputs
# A projection is a tuple the graph branches on at trace time (the same structure in every layer):
#   ("dense", weight [N, K], bias [N] | None)
#   ("int8", N, bias [N] | None, ((PackedGemm, channels [k] | None, (GEMV op name, its args) | None), ...))
def _projection(module: torch.nn.Module) -> tuple:
    if isinstance(module, torch.nn.Linear):
        return ("dense", module.weight, module.bias)
    if isinstance(module, Int8Linear):
        channels = module.channels or [None] * len(module._gemms)
        groups = tuple((PackedGemm(g), c, _static_gemv_args(g)) for g, c in zip(module._gemms, channels))
        return ("int8", module.out_features, module.bias, groups)
    raise UnsupportedModel(f"no compiled projection for {type(module).__name__}")


def _static_gemv_args(gemm: _RowQuantGemm) -> tuple | None:
    """(the GEMV operator's name, its arguments after the rows), their sizes kept static like the
    model's other widths (see `DecodeStep._block`): each model's one-row graph is its own, never one
    generic in a width Dynamo saw change."""
    if gemm.gemv is None:
        return None
    for arg in gemm.gemv.args:
        if isinstance(arg, torch.Tensor):
            _static(arg)
    return gemm.gemv.op_name, gemm.gemv.args


def _layer_weights(layer: torch.nn.Module) -> dict:
    attn, mlp = layer.self_attn, layer.mlp
    weights = {
        "ln1": layer.input_layernorm.weight,
        "ln2": layer.post_attention_layernorm.weight,
        "o": _projection(attn.o_proj),
        "down": _projection(mlp.down_proj),
    }
    if isinstance(attn.q_proj, Int8Projection) and attn.q_proj._group is attn.v_proj._group:
        weights["qkv"] = _projection(attn.q_proj._group.linear)
    else:
        weights.update(q=_projection(attn.q_proj), k=_projection(attn.k_proj), v=_projection(attn.v_proj))
    if isinstance(mlp.gate_proj, Int8Projection) and mlp.gate_proj._group is mlp.up_proj._group:
        weights["gate_up"] = _projection(mlp.gate_proj._group.linear)
    else:
        weights.update(gate=_projection(mlp.gate_proj), up=_projection(mlp.up_proj))
    return weights


def project(x: torch.Tensor, proj: tuple, gemv: bool = False) -> torch.Tensor:
    """[M, K] -> [M, N], computed as the eager layer computes it (int8: `Int8Linear.forward`).
    `gemv`: M is at most GEMV_MAX_ROWS and the GEMV is on: call its operator directly."""
    if proj[0] == "dense":
        _, weight, bias = proj
        return F.linear(x, weight, bias)
    _, out_features, bias, groups = proj
    rows = x.float()
    y = None
    for gemm, channels, gemv_args in groups:
        selected = rows if channels is None else rows.index_select(1, channels)
        if gemv and gemv_args is not None:
            op_name, args = gemv_args
            out = getattr(torch.ops.viasd, op_name)(selected, *args)
        else:
            out = w8a8_gemm(selected, gemm, out_features)
        y = out if y is None else y + out
    if bias is not None:
        y = y + bias
    return y.to(x.dtype)


# ----------------------------------------------------------------------------- the layer
@dataclass(frozen=True)
class LayerShape:
    """What every decoder layer of a model shares."""

    q_heads: int  # Hq
    kv_heads: int  # Hkv
    head_dim: int  # D
    eps: float  # RMSNorm epsilon
    act: str  # the MLP's activation (transformers' name)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # transformers' order: normalise in fp32, cast back, then scale
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [n, h, D] with cos / sin [n, 1, D]: transformers' rotate-half rotary embedding."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def decoder_layer(
    h: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    keys: torch.Tensor | None,
    values: torch.Tensor | None,
    write: torch.Tensor,
    counts: torch.Tensor,
    weights: dict,
    shape: LayerShape,
    attention: bool = True,
    mlp: bool = True,
    order: torch.Tensor | None = None,
    gemv: bool = False,
) -> torch.Tensor:
    """One pre-norm decoder layer over n new rows; writes their keys and values in place.

    `attention` / `mlp` False skip that sub-block (a routed slim view; each combination is a graph).
    `gemv`: every int8 product calls the GEMV's operator directly (see `project`).

    Args:
        h: [n, H] hidden states entering the layer.
        cos, sin: [n, D] rotary tables of the rows' positions.
        keys, values: [Hkv, S, D] this layer's buffers.
        write: [n] long, the buffer positions the rows' keys and values go to.
        counts: [n] long, how many keys row j attends to: positions 0..counts[j]-1, or with `order`
            its first counts[j] gathered positions.
        order: [n, A] long or None: the buffer positions row j reads, gathered (a draft tree's rows
            each read their own path; A <= S, a multiple of ATTENTION_ALIGN); None: positions in
            sequence order, shared by every row.
    Returns:
        [n, H] hidden states leaving the layer.
    """
    if attention:
        h = _attention_block(h, cos, sin, keys, values, write, counts, weights, shape, order, gemv)
    if mlp:
        h = _mlp_block(h, weights, shape, gemv)
    return h


def _attention_block(
    h, cos, sin, keys, values, write, counts, weights: dict, shape: LayerShape, order, gemv: bool
) -> torch.Tensor:
    n = h.shape[0]
    Hq, Hkv, D = shape.q_heads, shape.kv_heads, shape.head_dim
    x = _rms_norm(h, weights["ln1"], shape.eps)
    if "qkv" in weights:
        q, k, v = project(x, weights["qkv"], gemv).split([Hq * D, Hkv * D, Hkv * D], dim=-1)
    else:
        q, k, v = (project(x, weights[name], gemv) for name in ("q", "k", "v"))
    cos, sin = cos[:, None, :], sin[:, None, :]
    q = _rotate(q.view(n, Hq, D), cos, sin)  # [n, Hq, D]
    k = _rotate(k.view(n, Hkv, D), cos, sin)  # [n, Hkv, D]
    out = torch.ops.viasd.attend(
        keys,
        values,
        write,
        k.transpose(0, 1).to(keys.dtype),
        v.view(n, Hkv, D).transpose(0, 1).to(values.dtype),
        q.view(n, Hkv, Hq // Hkv, D).float(),
        counts,
        order,
    )  # [n, Hkv, G, D]
    return h + project(out.reshape(n, Hq * D).to(h.dtype), weights["o"], gemv)


def _mlp_block(h: torch.Tensor, weights: dict, shape: LayerShape, gemv: bool) -> torch.Tensor:
    x = _rms_norm(h, weights["ln2"], shape.eps)
    if "gate_up" in weights:
        gate, up = project(x, weights["gate_up"], gemv).chunk(2, dim=-1)
    else:
        gate, up = project(x, weights["gate"], gemv), project(x, weights["up"], gemv)
    act = F.silu(gate) if shape.act == "silu" else F.gelu(gate, approximate="tanh")
    return h + project(act * up, weights["down"], gemv)


# ----------------------------------------------------------------------------- keys and values
def _static(t: torch.Tensor, dims: tuple[int, ...] | None = None) -> None:
    """Keep these sizes of `t` (all: None) out of Dynamo's automatic dynamic shapes."""
    for dim in range(t.dim()) if dims is None else dims:
        torch._dynamo.mark_static(t, dim)


class StaticKV:
    """Preallocated keys and values of some decoder layers; `length` positions are valid."""

    def __init__(self, layers: list[int], kv_heads: int, head_dim: int, dtype: torch.dtype, device):
        self.layers = layers
        self._shape, self.dtype, self.device = (kv_heads, head_dim), dtype, device
        self.keys: dict[int, torch.Tensor] = {}  # layer -> [Hkv, S, D]
        self.values: dict[int, torch.Tensor] = {}
        self.capacity = 0  # S
        self.length = 0
        self.growable = True

    @classmethod
    def over(cls, keys: dict[int, torch.Tensor], values: dict[int, torch.Tensor], length: int) -> StaticKV:
        """Buffers someone else owns (EAGLE's), [Hkv, S, D] per layer, `length` positions held; they never grow."""
        first = next(iter(keys.values()))
        for buffer in (*keys.values(), *values.values()):
            _static(buffer)  # see `reserve`
        kv = cls(sorted(keys), first.shape[0], first.shape[2], first.dtype, first.device)
        kv.keys, kv.values, kv.capacity, kv.length, kv.growable = keys, values, first.shape[1], length, False
        return kv

    def reserve(self, length: int) -> None:
        """Make room for `length` positions (whole KV_GROWTH blocks; held positions are kept)."""
        if length <= self.capacity:
            return
        if not self.growable:
            raise ValueError(f"the KV buffers hold {self.capacity} positions, {length} are needed: raise their length")
        capacity = math.ceil(length / KV_GROWTH) * KV_GROWTH
        Hkv, D = self._shape
        for store in (self.keys, self.values):
            for layer in self.layers:
                grown = torch.zeros(Hkv, capacity, D, dtype=self.dtype, device=self.device)
                if layer in store:
                    grown[:, : self.capacity] = store[layer]
                # Static: one graph per capacity (a symbolic buffer length was where Inductor's
                # fused key / value scatter corrupted memory before the opaque write; not retried).
                _static(grown)
                store[layer] = grown
        self.capacity = capacity

    def crop(self, length: int) -> None:
        """Keep the first `length` positions."""
        assert 0 <= length <= self.length
        self.length = length

    def keep(self, start: int, positions: torch.Tensor) -> None:
        """Keep the first `start` positions, then those at `positions` ([n] long, all >= start), in
        that order: the accepted path of a draft tree replaces the tree."""
        n = positions.numel()
        for store in (self.keys, self.values):
            for buffer in store.values():
                buffer[:, start : start + n] = buffer[:, positions.to(buffer.device)]  # gathers first: no overlap
        self.length = start + n


# ----------------------------------------------------------------------------- the step
class DecodeStep:
    """A model's decoder run by the compiled layer: ids -> final normed hidden states.

    Holds views of the model's weights, never copies.
    """

    def __init__(self, model: PreTrainedModel, plan: list[tuple[int, bool, bool]] | None = None, compile: bool = True):
        """`plan`: (layer, runs attention, runs MLP) for each decoder layer to run, in order (a routed
        slim view's); None: every layer, whole."""
        config = model.config
        if config.model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModel(
                f"the compiled step supports {', '.join(SUPPORTED_MODEL_TYPES)}, not {config.model_type!r}"
            )
        if any(t != "full_attention" for t in getattr(config, "layer_types", None) or []) or (
            config.model_type == "mistral" and getattr(config, "sliding_window", None)
        ):
            raise UnsupportedModel("sliding-window attention is not implemented by the compiled step")
        if getattr(config, "hidden_act", "silu") not in ("silu", "gelu_pytorch_tanh"):
            raise UnsupportedModel(f"activation {config.hidden_act!r} is not implemented by the compiled step")
        body = model.get_decoder()
        self.model, self.body = model, body
        self.plan = [(i, True, True) for i in range(len(body.layers))] if plan is None else list(plan)
        self.layers = [i for i, attention, _ in self.plan if attention]  # the layers that keep keys and values
        D = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self.shape = LayerShape(
            int(config.num_attention_heads),
            int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads),
            D,
            float(config.rms_norm_eps),
            getattr(config, "hidden_act", "silu"),
        )
        self.weights = {i: _layer_weights(body.layers[i]) for i, _, _ in self.plan}
        self.compiled = compile
        # Each model size, row-count class, buffer size and routed plan is a graph of the one compiled
        # layer function: more than Dynamo's default of 8 before it would fall back to eager.
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        self.native = _register_native_or_python_ops()
        self._layer = decoder_layer
        self._one_row = decoder_layer  # a one-row step with the GEMV on
        if compile:
            self._layer = torch.compile(decoder_layer, fullgraph=True, options=dict(INDUCTOR_OPTIONS))
            # With the native operators the one-row graph holds no Python object, so Inductor can
            # write its wrapper in C++: about 0.2 ms less Python a layer call (docs/results/compiled.md).
            self._one_row = torch.compile(
                decoder_layer, fullgraph=True, options={**INDUCTOR_OPTIONS, "cpp_wrapper": self.native}
            )
        # Whole layers over a chain of a few rows (a decode step, a verify block) skip Dynamo (packaged.py).
        self._packaged = None
        if compile and self.native:
            self._packaged = PackagedLayer(decoder_layer, inductor_cache_dir(), GEMV_MAX_ROWS, INDUCTOR_OPTIONS)
        self.dtype = body.embed_tokens.weight.dtype

    def view(self, plan: list[tuple[int, bool, bool]]) -> DecodeStep:
        """The step of a routed view of the same model: the same weights and compiled layer."""
        view = copy.copy(self)
        view.plan = list(plan)
        view.layers = [i for i, attention, _ in view.plan if attention]
        return view

    def buffers(self, keys: dict[int, torch.Tensor], values: dict[int, torch.Tensor], length: int) -> StaticKV:
        """A cache over someone else's buffers (layer -> [Hkv, S, D]) holding `length` positions."""
        if sorted(keys) != sorted(self.layers):
            raise ValueError(f"buffers for layers {sorted(keys)}, but this step runs layers {self.layers}")
        return StaticKV.over(keys, values, length)

    def new_cache(self) -> StaticKV:
        return StaticKV(
            self.layers, self.shape.kv_heads, self.shape.head_dim, self.dtype, self.body.embed_tokens.weight.device
        )

    @torch.no_grad()
    def __call__(
        self,
        input_ids: torch.Tensor,
        cache: StaticKV,
        mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final normed hidden states [n, H] of `input_ids` [n], appended to `cache`.

        Default: a chain after `cache.length` positions. `positions` [n] (rotary positions) and
        `mask` [n, cache.length + n] bool (True: attend) describe anything else, e.g. a draft tree.
        """
        n = input_ids.shape[0]
        start = cache.length
        cache.reserve(start + n)
        device = cache.device
        if positions is None:
            positions = torch.arange(start, start + n, device=device)
        out = []
        for b in range(0, n, MAX_BLOCK_ROWS):  # a prompt goes in blocks: every row is computed alike
            rows = slice(b, min(n, b + MAX_BLOCK_ROWS))
            block_mask = None if mask is None else mask[rows]
            out.append(self._block(input_ids[rows], cache, positions[rows], block_mask))
        hidden = out[0] if len(out) == 1 else torch.cat(out)
        return self.body.norm(hidden)

    def _block(
        self, ids: torch.Tensor, cache: StaticKV, positions: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        n, start = ids.shape[0], cache.length
        write = torch.arange(start, start + n, device=cache.device)
        order = None
        if mask is None:
            counts = write + 1
        else:
            full = torch.zeros(n, attended_length(start + n, cache.capacity), dtype=torch.bool, device=cache.device)
            full[:, : start + n] = mask[:, : start + n]
            counts = full.sum(1)
            # Each row reads its keys in sequence order from slot 0 on (the prefix, its ancestors,
            # itself), where the one-token step of its token finds them: over a tree's scattered
            # slots the attention sums ran in another order and rounded differently.
            order = torch.argsort((~full).to(torch.uint8), dim=1, stable=True)  # [n, A]: attended slots first
        h = self.body.embed_tokens(ids)  # [n, H]
        cos, sin = self.body.rotary_emb(h[None], positions[None])  # [1, n, D] each
        cos, sin = cos[0].to(h.dtype), sin[0].to(h.dtype)
        if self.compiled:  # two graphs: one row, and any block (one row is specialised anyway)
            # The model's own sizes stay static: the layer function's graphs are shared by every
            # model in the process, and once Dynamo had seen two widths it traced one graph generic
            # in the width, which decoded garbage on EAGLE's tree rows (the 1.5B after the 0.5B).
            for t in (h, cos, sin):
                _static(t, dims=(1,))
            if order is not None:
                # maybe_: a length equal to the buffer's (EAGLE's small buffers) may specialise instead
                torch._dynamo.maybe_mark_dynamic(order, 1)
            if n > 1:
                for t in (h, cos, sin, write, counts) + (() if order is None else (order,)):
                    torch._dynamo.maybe_mark_dynamic(t, 0)
        gemv = n == 1 and self.native and gemv_enabled()
        layer = self._one_row if gemv else self._layer
        packaged = self._packaged if self._packaged is not None and self._packaged.serves(n, order) else None
        if not gemv_enabled():  # the package's products are the GEMV's
            packaged = None
        for i, attention, mlp in self.plan:
            keys, values = cache.keys.get(i), cache.values.get(i)
            out = None
            if packaged is not None and attention and mlp:
                out = packaged(h, cos, sin, keys, values, write, counts, self.weights[i], self.shape)
            if out is None:
                out = layer(
                    h, cos, sin, keys, values, write, counts, self.weights[i], self.shape, attention, mlp, order, gemv
                )
            h = out
        cache.length = start + n
        return h


# ----------------------------------------------------------------------------- which models have one
_STEPS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def inductor_cache_dir() -> Path:
    """Where compiled graphs are kept between processes: `$TORCHINDUCTOR_CACHE_DIR` if set, else
    `$VIASD_CACHE/inductor/<ATEN_CPU_CAPABILITY>`. Inductor's cache key misses that variable: a
    process limited to AVX2 was handed the native AVX-512 process's kernels and computed NaNs."""
    current = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if current is None or os.path.abspath(current) == os.path.abspath(
        default_cache_dir()
    ):  # Inductor writes its default there
        capability = os.environ.get("ATEN_CPU_CAPABILITY", "native") or "native"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root() / "inductor" / capability)
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def attach_step(model: PreTrainedModel, compile: bool = True, warm_up: bool = True) -> DecodeStep | None:
    """Give `model` a compiled decode step, which every runner of it then uses; None (and a log
    line) where the model is not supported and stays eager. `warm_up` compiles now, with timing."""
    if compile:
        inductor_cache_dir()
    try:
        step = DecodeStep(model, compile=compile)
    except UnsupportedModel as err:
        logger.warning("%s stays eager: %s", type(model).__name__, err)
        return None
    register_step(model, step)
    if compile and warm_up:
        warm_up_step(step)
    return step


def register_step(model: torch.nn.Module, step: DecodeStep) -> None:
    """Runners of `model` (a model, or a view of one such as a routed slim verifier) run `step`."""
    _STEPS[model] = step


def decode_step(model: torch.nn.Module) -> DecodeStep | None:
    """The step `attach_step` gave `model`, if any."""
    try:
        return _STEPS.get(model)
    except TypeError:  # not weak-referenceable
        return None


def warm_up_step(step: DecodeStep, progress: bool = True) -> float:
    """Compile the block graph and build the few-row package (without one, the one-row graph) now,
    or read them from the on-disk caches; returns the seconds it took."""
    begin = time.perf_counter()
    cache = step.new_cache()
    rows = GEMV_MAX_ROWS + 1  # past the package's rows: the block graph
    ids = torch.zeros(rows, dtype=torch.long, device=cache.device)
    name = getattr(step.model.config, "_name_or_path", "") or type(step.model).__name__
    for n in tqdm(
        [rows, 1], desc=f"compiling the decode step of {Path(name).name}", unit="graph", disable=not progress
    ):
        step(ids[:n], cache)
    seconds = time.perf_counter() - begin
    logger.info(
        "compiled the decode step of %s (%d layers) in %.1f s", type(step.model).__name__, len(step.layers), seconds
    )
    return seconds
