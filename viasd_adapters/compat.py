"""Which host loop runs which verifier, and what its decoder is built with: the one table.

Both entry points consult it before any model loads (`checks.check_components` for the Hydra
commands, `api.build` for Python), and `pipeline.assemble` wires every decoder by it. A host is
known by its decoder class; a verifier by its kind, as the `verifier` config group names the
shipped ones: full, tiered, tiered-intermediate, faster-cascade (any other `Verifier` class is
its own kind, its qualified class name).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .routing import SlimModel
from .verify import LosslessVerifier, SpeculativeCascadeVerifier, TieredVerifier, Verifier


@dataclass(frozen=True)
class Host:
    """One host loop: the parts its decoder is built with and the verifiers it runs."""

    name: str  # the loop as `api.describe` names it
    decoder: str  # its decoder class, as a framework config's `framework.decoder._target_` writes it
    parts: tuple[str, ...]  # keyword arguments the decoder gets from the pair: "target", "drafter", "verifier"
    verifiers: tuple[str, ...] | None = None  # verifier kinds it runs; None: any verifier
    fixed: Mapping[str, Any] = field(default_factory=dict)  # verifier settings it cannot honour, with the one value it takes
    runs: str = ""  # the verifiers it runs, as a refusal says them


HOSTS: dict[str, Host] = {
    # AR verifies nothing: the `verifier` group's default (full) is left unused, anything else refused
    "ar": Host("AR", "viasd_adapters.decode.AutoregressiveDecoder", ("target",), verifiers=("full",)),
    "sd": Host("SD", "viasd_adapters.decode.SpeculativeDecoder", ("drafter", "verifier")),
    "pearl": Host("PEARL", "viasd_adapters.hosts.pearl.PearlDecoder", ("drafter", "verifier")),
    # EAGLE drafts with its own head; its tree goes to the verifier (`verify_tree`), whose slim pass is
    # a routed view of the target. eagle-llm's own forward is the full model's judge, so no layers
    # are shared with it (share_prefix), and its head hands out no draft distributions a gate could read.
    "eagle": Host(
        "EAGLE", "viasd_adapters.hosts.eagle.EagleDecoder", ("target", "verifier"), verifiers=("full", "tiered"),
        fixed={"share_prefix": False, "gate": None},
        runs="verifier=full (stock EAGLE) or verifier=tiered (VIA-SD on a routed view of the target's own layers)"),
    # A speed anchor, not a host: llama.cpp decodes the target's GGUF itself
    "llama-cpp": Host("llama.cpp", "viasd_adapters.bench.llama_cpp.LlamaCppDecoder", ("target",), verifiers=("full",)),
}


def host_for(cls: type) -> str:
    """The key of the host whose decoder `cls` is (ValueError for a decoder the table lacks)."""
    for key, host in HOSTS.items():
        module, _, name = host.decoder.rpartition(".")
        # a host's module is imported whenever its decoder class is (hosts.eagle needs eagle-llm)
        known = getattr(sys.modules.get(module), name, None)
        if known is not None and issubclass(cls, known):
            return key
    raise ValueError(
        f"{cls.__module__}.{cls.__qualname__} is no host decoder of viasd_adapters.compat.HOSTS"
        f" ({', '.join(h.decoder for h in HOSTS.values())}): add a row for it there"
    )


def verifier_kind(cls: type, routed: bool = True) -> str:
    """The kind of a verifier class; `routed`: a tiered verifier's slim is a routed view of the target."""
    if issubclass(cls, TieredVerifier):
        return "tiered" if routed else "tiered-intermediate"
    if issubclass(cls, SpeculativeCascadeVerifier):
        return "faster-cascade"
    if cls is LosslessVerifier:
        return "full"
    return f"{cls.__module__}.{cls.__qualname__}"


def built_kind(verifier: Verifier) -> tuple[str, dict[str, Any]]:
    """(kind, settings) of a built verifier, for `check` after the models loaded."""
    if not isinstance(verifier, TieredVerifier):
        return verifier_kind(type(verifier)), {}
    slim = verifier.slim.model if verifier.slim is not None else None  # None: tiers off
    routed = slim is None or (isinstance(slim, SlimModel)
                              and slim.lm_head is verifier.target.model.get_output_embeddings())
    return verifier_kind(TieredVerifier, routed), {"share_prefix": verifier.shared is not None, "gate": verifier.gate}


def check(host: str, kind: str, settings: Mapping[str, Any] | None = None, framework: str | None = None) -> None:
    """Raise ValueError, naming the fix, unless `host` runs a verifier of `kind` with `settings`.

    Args:
        host: a key of `HOSTS`.
        kind: the verifier's kind (`verifier_kind`).
        settings: the verifier's settings (its config node, or `build`'s arguments).
        framework: how the Hydra commands named the framework, e.g. "framework=eagle" (fixes
            are spelled as overrides); None: the Python API (fixes are `build`'s arguments).
    """
    row = HOSTS[host]
    said = f"{framework} ({row.name})" if framework else row.name
    if "verifier" not in row.parts:
        if kind in row.verifiers:
            return  # the unused default
        if framework is None:
            raise ValueError(f"{said} (no draft) takes no verifier, so VIA-SD's tiers would be ignored: pass a"
                             " draft (a draft model, 'lookup' or an EagleHead), or drop routing= and policy=")
        raise ValueError(f"{said} takes no verifier, so verifier={kind} would be ignored: write framework=sd"
                         f" verifier={kind} for VIA-SD on draft-model SD (or framework=lookup / pearl),"
                         " or drop the verifier override")
    if row.verifiers is not None and kind not in row.verifiers:
        raise ValueError(f"{said} runs {row.runs}, not verifier={kind}: pick one of those, or framework=sd,"
                         f" lookup or pearl for verifier={kind}")
    for key, only in row.fixed.items():
        if (settings or {}).get(key, only) != only:
            fix = f"set verifier.{key}={_override(only)}" if framework else f"pass {key}={only!r}"
            raise ValueError(f"{said} does not honour the verifier's {key}: {fix}")


def _override(value: Any) -> str:
    return {True: "true", False: "false", None: "null"}.get(value, str(value))
