"""One entry point for every model the project decodes with: `load_model(spec)`."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from .compiled import attach_step
from .int8_cache import quantize_int8
from .offline import (
    CACHED_TOKENIZER_KWARGS,
    OFFLINE_MODELS,
    check_tokenizer,
    ensure_cached,
    tokenizer_meta_from_provenance,
)
from .precision import INT8
from .quantize import quantize_linears
from .row_attention import ROW_INVARIANT_ATTENTION
from .spec import LoadedModel, ModelSpec
from .tiny import build_tiny_model

logger = logging.getLogger(__name__)

TINY_RANDOM = "tiny-random"


def load_model(spec: ModelSpec) -> LoadedModel:
    """Load `spec.name`: "tiny-random", an offline zoo name, a local folder, or a hub id.

    The model comes back in eval mode, in `spec.precision`, on `spec.device`, with SDPA attention;
    for int8 weights, its linear layers and LM head quantised (`models.quantize`); with
    `spec.compiles`, a compiled decode step attached (`models.compiled`), compiled here.
    """
    loaded = _load(spec)
    num_parameters = loaded.model.num_parameters()  # before quantising: int8 weights are not parameters
    if spec.precision.quantization == INT8:
        quantize_int8(loaded.model, loaded.tokenizer, _source_folder(loaded.model))
        # Quantised layers amplify SDPA's block-vs-step rounding: rows computed as steps are.
        loaded.model.config._attn_implementation = ROW_INVARIANT_ATTENTION
    elif spec.precision.quantization:
        quantize_linears(loaded.model, spec.precision.quantization)
    if spec.compiles(num_parameters):
        attach_step(loaded.model)
    return loaded


def _source_folder(model: PreTrainedModel) -> Path | None:
    """The folder `model` was read from, as `_load` resolved it (an offline zoo model's cache or a
    local folder); None for a hub id or a tiny model, whose int8 weights are not cached."""
    folder = Path(model.name_or_path) if model.name_or_path else None
    return folder if folder is not None and folder.is_dir() else None


def _load(spec: ModelSpec) -> LoadedModel:
    if spec.tiny is not None and spec.name != TINY_RANDOM:
        raise ValueError(f"spec.tiny is only used with name {TINY_RANDOM!r}, not {spec.name!r}")
    if spec.name == TINY_RANDOM:
        return build_tiny_model(spec)
    if spec.name in OFFLINE_MODELS:
        folder = ensure_cached(spec.name)
        loaded = _from_pretrained(str(folder), spec, CACHED_TOKENIZER_KWARGS)
        # Cheap (a few dozen encodes): catches a tokenizer that a transformers upgrade reads
        # differently from the one that wrote the folder.
        check_tokenizer(loaded.tokenizer, tokenizer_meta_from_provenance(folder))
        return loaded
    local = Path(spec.name).expanduser()
    if local.is_dir():
        return _from_pretrained(str(local), spec)
    try:
        return _from_pretrained(spec.name, spec)
    except (OSError, ValueError) as err:  # no network, no such repo, or an invalid id
        raise ValueError(
            f"unknown model {spec.name!r}: not an offline zoo name (known: "
            f"{', '.join([TINY_RANDOM, *OFFLINE_MODELS])}), not a local folder, and not "
            f"loadable from the hub: {err}"
        ) from err


def stop_token_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
    """The generation config's eos ids (an int or a list) plus the tokenizer's eos, in order."""
    eos = model.generation_config.eos_token_id
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(dict.fromkeys(ids))  # dedupe, keep order


def _from_pretrained(path: str, spec: ModelSpec, tokenizer_kwargs: dict | None = None) -> LoadedModel:
    start = time.perf_counter()
    # The tokenizer first: it fails fast for a bad hub id.
    tokenizer = AutoTokenizer.from_pretrained(path, **(tokenizer_kwargs or {}))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=spec.torch_dtype, attn_implementation="sdpa")
    # Loaded in the checkpoint's own dtype (fp32 from the offline cache), the weights stay
    # memory-mapped copy-on-write: shared page cache, so memory pressure can evict them.
    model = model.to(spec.device).eval()
    logger.info(
        "loaded %s (%s, %s, %.1fM parameters) in %.1f s",
        path,
        spec.precision,
        spec.device,
        model.num_parameters() / 1e6,
        time.perf_counter() - start,
    )
    return LoadedModel(model, tokenizer, spec, stop_token_ids=stop_token_ids(model, tokenizer))
