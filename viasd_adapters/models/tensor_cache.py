"""Files of tensors derived from a model (its int8 weights, a draft's 4-bit weights), kept in
`$VIASD_CACHE` so that later loads skip the work. Each file records in its metadata what it was
made from (a `key`); a file whose key differs, or that cannot be read, is never trusted, and a
file is written whole or not at all."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

logger = logging.getLogger(__name__)


def read(path: Path, key: dict, what: str, redo: str, quiet: bool = False) -> dict[str, torch.Tensor] | None:
    """The tensors in `path`, or None (the reason logged unless `quiet`) when there are none to
    trust. `what` names the contents in messages ("int8 weights"), `redo` what a miss costs."""
    if not path.exists():
        return None
    try:
        with safe_open(str(path), "pt") as f:
            recorded = json.loads((f.metadata() or {}).get("key", "null"))
        if recorded != key:
            if not quiet:
                logger.warning(
                    "cached %s %s were made from other files or settings; %s and replacing them", what, path, redo
                )
            return None
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError) as err:
        if not quiet:
            logger.warning("cached %s %s are unreadable (%s); %s and replacing them", what, path, err, redo)
        return None


def write(path: Path, key: dict, state: dict[str, torch.Tensor], what: str) -> None:
    """Writes `state` to `path` with `key`; where it cannot, warns and goes on (later loads redo
    the work)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        save_file({k: t.contiguous() for k, t in state.items()}, str(tmp), metadata={"key": json.dumps(key)})
        os.replace(tmp, path)  # a crash leaves no half file behind
        logger.info("%s cached in %s (%.2f GB) for later loads", what, path, path.stat().st_size / 1e9)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        logger.warning("could not write the cache of %s %s (%s); later loads redo the work", what, path, err)
