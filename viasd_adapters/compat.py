"""Which host loop runs which verifier: the checks on the host registry's entries.

Both entry points consult it before any model loads (`checks.check_components` for the Hydra
commands, `api.build` for Python). The hosts themselves are the registry's
(`viasd_adapters.hosts.registry.HOSTS`, re-exported here). A host is known by its decoder class;
a verifier by its kind, as the `verifier` config group names the shipped ones: full, tiered,
tiered-intermediate, faster-cascade (any other `Verifier` class is its own kind, its qualified
class name).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .hosts.registry import HOSTS, HostRegistry, HostSpec
from .routing import SlimModel
from .verify import LosslessVerifier, SpeculativeCascadeVerifier, TieredVerifier, Verifier


def host_for(cls: type, hosts: HostRegistry = HOSTS) -> str:
    """The key of the host whose decoder `cls` is (ValueError for a decoder the registry lacks)."""
    return hosts.for_decoder(cls).key


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
    routed = slim is None or (
        isinstance(slim, SlimModel) and slim.lm_head is verifier.target.model.get_output_embeddings()
    )
    return verifier_kind(TieredVerifier, routed), {"share_prefix": verifier.shared is not None, "gate": verifier.gate}


def check(
    host: str | HostSpec,
    kind: str,
    settings: Mapping[str, Any] | None = None,
    framework: str | None = None,
    verifier: type | None = None,
    hosts: HostRegistry = HOSTS,
) -> None:
    """Raise ValueError, naming the fix, unless `host` runs a verifier of `kind` with `settings`.

    Args:
        host: a registry entry, or its key in `hosts`.
        kind: the verifier's kind (`verifier_kind`).
        settings: the verifier's settings (its config node, or `build`'s arguments).
        framework: how the Hydra commands named the framework, e.g. "framework=eagle" (fixes
            are spelled as overrides); None: the Python API (fixes are `build`'s arguments).
        verifier: the verifier's class, when known: a tree host needs one that implements
            `verify_tree`.
        hosts: the registry `host` is a key of.
    """
    row = hosts.host(host) if isinstance(host, str) else host
    said = f"{framework} ({row.name})" if framework else row.name
    if "verifier" not in row.parts:
        if kind in (row.verifiers or ()):
            return  # the unused default
        if framework is None:
            raise ValueError(
                f"{said} (no draft) takes no verifier, so VIA-SD's tiers would be ignored: pass a"
                " draft (a draft model, 'lookup' or an EagleHead), or drop routing= and policy="
            )
        raise ValueError(
            f"{said} takes no verifier, so verifier={kind} would be ignored: write framework=sd"
            f" verifier={kind} for VIA-SD on draft-model SD (or framework=lookup / pearl),"
            " or drop the verifier override"
        )
    if row.verifiers is not None and kind not in row.verifiers:
        others = " or ".join(f"framework={key}" for key in hosts.any_verifier())
        raise ValueError(
            f"{said} runs {row.runs}, not verifier={kind}: pick one of those, or {others} for verifier={kind}"
        )
    if row.trees and verifier is not None and not implements_trees(verifier):
        raise ValueError(
            f"{said} drafts trees, and {verifier.__qualname__} does not implement verify_tree:"
            " pick a verifier that does (full or tiered)"
        )
    for key, only in row.fixed.items():
        if (settings or {}).get(key, only) != only:
            fix = f"set verifier.{key}={_override(only)}" if framework else f"pass {key}={only!r}"
            raise ValueError(f"{said} does not honour the verifier's {key}: {fix}")


def implements_trees(cls: type) -> bool:
    """Whether a verifier class overrides `Verifier.verify_tree` (a tree host's judge needs it)."""
    return getattr(cls, "verify_tree", None) is not getattr(Verifier, "verify_tree", None)


def _override(value: Any) -> str:
    return {True: "true", False: "false", None: "null"}.get(value, str(value))
