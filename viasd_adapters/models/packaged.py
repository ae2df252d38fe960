"""The decoder layer over a few rows as an AOTInductor package: decode steps and verify blocks
with no Dynamo in them.

A `torch.compile` graph is entered through Dynamo: a cache lookup, guards over every input (a
layer's weights are inputs) and the compiled region's entry, once per layer call. On a Zen 3 that
cost 0.3-0.5 ms a layer call, 12-25 % of a one-token step (docs/results/compiled.md).
`torch.export` traces the same function (`compiled.decoder_layer`, every product on the GEMV
operator, which `_RowQuantGemm` also picks for these row counts) once, with the row count and the
key-value buffers' length symbolic; AOTInductor compiles it into a shared library that the step
calls directly, with the layer's weights as a flat list of tensors. The kernels are Inductor's for
the same graph, so its outputs are bitwise those of the compiled graphs
(tests/models/test_packaged.py). One package per model serves 1 to `GEMV_MAX_ROWS` rows (a step,
a verify block) and every buffer size.

Packages live in Inductor's cache folder (`compiled.inductor_cache_dir()`), keyed by the exported
program's text (graph, shapes, constants, source lines), torch's version and the native operators'
library: the next process finds its model's package (export 0.4 s, load 10 ms) instead of tracing
again.

Only whole layers over a chain take the package (`PackagedLayer.serves`); a routed slim view's
half layers, a draft tree's rows and longer blocks run the `torch.compile` graphs. Where export or
compilation fails, one warning, and every call runs those graphs.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
import torch.utils._pytree as pytree
from torch._opaque_base import OpaqueBase

from . import native

logger = logging.getLogger(__name__)

_TENSOR = object()  # where a tensor goes among a layer's constants (None is a constant: no bias)


def _split(weights: dict) -> tuple[pytree.TreeSpec, list, list[torch.Tensor]]:
    """A layer's weights as (structure, constants with _TENSOR where a tensor goes, tensors)."""
    leaves, spec = pytree.tree_flatten(weights)
    constants = [_TENSOR if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]
    return spec, constants, [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]


def _graph_constants(constants: list) -> list:
    # fbgemm's packed GEMM objects ride along in the weights but the one-row graph never calls them
    # (it calls the GEMV operator): a layer's own objects do not make it another graph.
    return [None if isinstance(c, OpaqueBase) else c for c in constants]


def packageable(weights: dict) -> str | None:
    """Why a layer with these weights cannot be packaged, or None."""
    for name, projection in weights.items():
        if isinstance(projection, tuple) and projection[0] == "int8":
            if any(gemv_args is None for _, _, gemv_args in projection[3]):
                return f"its {name} projection has no GEMV operator"
    return None


class _RowsLayer(torch.nn.Module):
    """A decoder layer function on a few rows, every product on the GEMV operator, with the weights
    as positional tensors (what export traces)."""

    def __init__(self, layer: Callable, spec: pytree.TreeSpec, constants: list, shape):
        super().__init__()
        self.layer, self.spec, self.constants, self.shape = layer, spec, constants, shape

    def forward(self, h, cos, sin, keys, values, write, counts, *tensors):
        supply = iter(tensors)
        leaves = [next(supply) if c is _TENSOR else c for c in self.constants]
        weights = pytree.tree_unflatten(leaves, self.spec)
        return self.layer(h, cos, sin, keys, values, write, counts, weights, self.shape, gemv=True)


class PackagedLayer:
    """A whole decoder layer (`layer`, i.e. `compiled.decoder_layer`) over a chain of 1..`max_rows`
    rows, every product on the GEMV operator, as one package (the row count is symbolic). It is
    built, or read from the cache, at the first call."""

    def __init__(self, layer: Callable, cache_dir: Path, max_rows: int, inductor_options: Mapping):
        """`inductor_options`: the compiled graphs' own, so that the package's kernels are theirs."""
        self.layer, self.cache_dir, self.max_rows = layer, cache_dir, max_rows
        self.inductor_options = inductor_options
        self._runner = None  # the loaded package's runner: run(list of tensors) -> [h]
        self._structure: tuple | None = None  # (spec, graph constants) the package was traced with
        self._flat: dict[int, tuple[dict, list[torch.Tensor] | None]] = {}  # id(weights) -> (weights, tensors)
        self.failed: str | None = None  # why there is no package

    def serves(self, rows: int, order: torch.Tensor | None) -> bool:
        """Whether calls of `rows` rows (with this attention `order`) may come here."""
        return rows <= self.max_rows and order is None and self.failed is None

    def __call__(self, h, cos, sin, keys, values, write, counts, weights, shape) -> torch.Tensor | None:
        """`compiled.decoder_layer`'s outputs for a whole layer (its arguments, less the flags), or
        None where the package cannot serve these weights: the caller runs its graph instead."""
        if self._runner is None:
            self._build(h, cos, sin, keys, values, write, counts, weights, shape)
            if self.failed is not None:
                return None
        tensors = self._tensors(weights)
        if tensors is None:  # a layer built otherwise than the one the package was traced with
            return None
        return self._runner.run([h, cos, sin, keys, values, write, counts, *tensors])[0]

    def _tensors(self, weights: dict) -> list[torch.Tensor] | None:
        entry = self._flat.get(id(weights))
        if entry is None or entry[0] is not weights:
            spec, constants, tensors = _split(weights)
            fits = (spec, _graph_constants(constants)) == self._structure and packageable(weights) is None
            entry = self._flat[id(weights)] = (weights, tensors if fits else None)
        return entry[1]

    def _build(self, h, cos, sin, keys, values, write, counts, weights, shape) -> None:
        begin = time.perf_counter()
        try:
            reason = packageable(weights) or native.load()
            if reason:
                raise ValueError(reason)
            spec, constants, tensors = _split(weights)
            module = _RowsLayer(self.layer, spec, constants, shape)
            if h.shape[0] == 1:  # export would take the row count for the constant 1; only shapes matter
                h, cos, sin, write, counts = (t.repeat(2, *[1] * (t.dim() - 1)) for t in (h, cos, sin, write, counts))
            n = {0: torch.export.Dim("rows", min=1, max=self.max_rows)}
            buffer = {1: torch.export.Dim("buffer", min=2)}
            dynamic = (n, n, n, buffer, buffer, n, n, tuple(None for _ in tensors))
            program = torch.export.export(
                module, (h, cos, sin, keys, values, write, counts, *tensors), dynamic_shapes=dynamic, strict=False
            )
            path = self.cache_dir / "aoti" / f"decoder-layer-{_key(program, self.inductor_options)}.pt2"
            package = _read(path) if path.exists() else None
            built = package is None
            if built:
                path.parent.mkdir(parents=True, exist_ok=True)
                partial = path.with_suffix(f".{os.getpid()}.partial.pt2")
                # a copy: Inductor adds its own entries to the dict, which would change the next key
                torch._inductor.aoti_compile_and_package(
                    program, package_path=str(partial), inductor_configs=dict(self.inductor_options)
                )
                os.replace(partial, path)  # whole or not at all: another process may build it too
                package = torch._inductor.aoti_load_package(str(path))
        except Exception as err:  # export and Inductor raise many types; any of them means no package
            self.failed = f"{type(err).__name__}: {str(err).strip()[:300]}"
            logger.warning("the decoder layer runs its torch.compile graphs, not a package: %s", self.failed)
            return
        # The package's own __call__ flattens its arguments with pytree, about 0.2 ms a layer call
        # (measured); its runner takes the flat list the step already has.
        self._runner = package.loader
        self._structure = (spec, _graph_constants(constants))
        logger.info(
            "%s the decoder layer's package (1-%d rows) in %.1f s: %s",
            "built" if built else "loaded",
            self.max_rows,
            time.perf_counter() - begin,
            path,
        )


def _read(path: Path):
    """The package at `path`, or None (logged) where it cannot be read: it is then built again."""
    try:
        return torch._inductor.aoti_load_package(str(path))
    except Exception as err:  # a truncated or foreign file: any error means "build it again"
        logger.warning("the cached package %s could not be read (%s); building it again", path, str(err).strip()[:200])
        return None


def _key(program: torch.export.ExportedProgram, inductor_options: Mapping) -> str:
    identity = [str(program), torch.__version__, repr(sorted(inductor_options.items())), str(native.library_path())]
    return hashlib.sha256("\n".join(identity).encode()).hexdigest()[:16]
