"""The EAGLE host: eagle-llm 1.2.1 (EAGLE-1) made to run here, with shims and subclasses, no copies of its code.

It knows nothing of VIA-SD; `viasd_adapters.hosts.eagle` is the adapter that tiers its verify step.

See README.md in this folder for what is patched and why.
"""

from __future__ import annotations

import importlib.metadata
import logging

SUPPORTED_VERSION = "1.2.1"

try:
    _version = importlib.metadata.version("eagle-llm")
except importlib.metadata.PackageNotFoundError as err:  # pragma: no cover - environment problem
    raise ImportError(
        "eagle-llm is not installed: `pip install --no-deps eagle-llm==1.2.1` (its declared pins are"
        " unusable; the project's `eagle` extra installs what it really needs)"
    ) from err
if _version != SUPPORTED_VERSION:
    logging.getLogger(__name__).warning(
        "eagle-llm %s is installed; viasd_adapters.third_party.eagle was written against %s",
        _version,
        SUPPORTED_VERSION,
    )

from .head import (  # noqa: E402
    COMPACT_WEIGHTS,
    FULL_WEIGHTS,
    build_head,
    export_head,
    extend_head,
    head_config,
    head_length,
    is_head_folder,
    load_head_state,
    read_config,
    rewind_head,
    save_head,
    tree_growth,
)
from .kv import BufferCache, KVBuffers, head_dim  # noqa: E402
from .loading import BACKENDS, ea_model_from_target, load_ea_model  # noqa: E402
from .transformers_base import TransformersEagleBase  # noqa: E402
from .tree import TransformersLayers, tree_mask_4d  # noqa: E402

__all__ = [
    "BACKENDS",
    "COMPACT_WEIGHTS",
    "FULL_WEIGHTS",
    "BufferCache",
    "KVBuffers",
    "TransformersEagleBase",
    "TransformersLayers",
    "build_head",
    "ea_model_from_target",
    "export_head",
    "extend_head",
    "head_config",
    "head_dim",
    "head_length",
    "is_head_folder",
    "load_ea_model",
    "load_head_state",
    "read_config",
    "rewind_head",
    "save_head",
    "tree_mask_4d",
    "tree_growth",
]
