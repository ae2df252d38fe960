"""int8 models through an on-disk cache: the first load of a model folder in int8 calibrates and
quantises it and keeps the result (outlier channels and per-channel int8 weights) in
`$VIASD_CACHE/int8/`; later loads read it back, skipping the calibration forward and the
quantisation and never reading the float linear weights. The cached weights are the ones
quantisation computes, so a cached load gives bitwise the same model (tests/models/test_int8_cache.py).

A cache file records what it was made from (the folder's weight and config files, sizes and
modification times; the quantisation's settings; torch's version) and is remade when any of it
changes. An unreadable or stale file is remade with a warning, never trusted. Processes that
load one model at once quantise it once: the others wait for the file.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

import torch
from transformers import PreTrainedModel

from . import tensor_cache
from .offline import cache_root, one_at_a_time
from .quantize import CALIBRATION_TEXT, OUTLIER_SHARE, Int8Weights, calibrate_outliers, quantize_linears

logger = logging.getLogger(__name__)

FORMAT = 1  # raise when the cached tensors' meaning changes
_OUTLIERS = "outliers."  # prefix of the outlier channel tensors, the rest are `Int8Weights` keys


def cache_path(source: Path) -> Path:
    """The cache file of the model folder `source` (two folders of one name do not collide)."""
    digest = hashlib.sha256(str(source.resolve()).encode()).hexdigest()[:10]
    return cache_root() / "int8" / f"{source.name}-{digest}.safetensors"


def cache_key(source: Path) -> dict:
    """What a cache file must have been made from to be used for `source`."""
    files = sorted(p for p in source.iterdir() if p.suffix in (".safetensors", ".bin") or p.name == "config.json")
    return {
        "format": FORMAT,
        "torch": torch.__version__,
        "outlier_share": OUTLIER_SHARE,
        "calibration_sha256": hashlib.sha256(CALIBRATION_TEXT.encode()).hexdigest(),
        "files": {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in files},
    }


def quantize_int8(model: PreTrainedModel, tokenizer, source: Path | None) -> None:
    """`model` quantised to int8 in place (`quantize.quantize_linears` with calibrated outlier
    channels), read from or written to the cache of the folder `source` (None: no cache)."""
    if source is None:
        _quantize(model, tokenizer, None, None, None, "the model")
        return
    path, key = cache_path(source), cache_key(source)
    stored = _read(path, key)
    if stored is not None:
        _quantize(model, tokenizer, stored, path, key, source)
        return
    with one_at_a_time(f"int8-{path.stem}", f"quantising {source.name}"):
        # another process may have written it while this one waited
        _quantize(model, tokenizer, _read(path, key, quiet=True), path, key, source)


def _read(path: Path, key: dict, quiet: bool = False) -> dict[str, torch.Tensor] | None:
    redo = "quantising anew (about half a minute for a 1.5B model)"
    return tensor_cache.read(path, key, "int8 weights", redo, quiet=quiet)


def _quantize(model, tokenizer, stored: dict | None, path: Path | None, key: dict | None, source: Path | str) -> None:
    start = time.perf_counter()
    if stored is None:
        outliers = calibrate_outliers(model, tokenizer)
    else:
        outliers = {name.removeprefix(_OUTLIERS): t for name, t in stored.items() if name.startswith(_OUTLIERS)}
    weights = Int8Weights(stored, keep=stored is None and path is not None)
    quantize_linears(model, "int8", outliers=outliers, weights=weights)
    seconds = time.perf_counter() - start
    if stored is None:
        logger.info("quantised %s to int8 in %.1f s", source, seconds)
        if path is not None:
            state = {**weights.state(), **{_OUTLIERS + name: t for name, t in outliers.items()}}
            tensor_cache.write(path, key, state, "int8 weights")
    elif weights.quantized:
        logger.warning(
            "int8 cache %s lacked %d of the weights (quantised from the checkpoint instead); removed it,"
            " the next load writes it anew",
            path,
            len(weights.quantized),
        )
        path.unlink(missing_ok=True)
    else:
        logger.info("int8 weights of %s read from %s in %.1f s", source, path, seconds)
