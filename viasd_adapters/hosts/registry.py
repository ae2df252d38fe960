"""The host registry: one typed entry per host loop, read by every entry point.

A host is a decoding loop VIA-SD's verifiers plug into (SD, PEARL, EAGLE, ...). Its entry says
how to build its decoder, which verifiers it runs and what it can do. `api.build` and
`api.describe`, the Hydra commands (`pipeline.build_decoder`), and the checks that run before any
model loads (`compat`, `checks`) all read it, so adding a host is its module plus one entry in
`HOSTS` below (docs/extending.md). A registry is immutable: `HOSTS.with_host(entry)` returns a
new one, which `build(..., hosts=)`, `check_config(..., hosts=)` and `build_decoder(..., hosts=)` take.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from hydra.utils import get_class, instantiate

PARTS = ("target", "drafter", "verifier")  # what a decoder may be built with, from the model pair


@dataclass(frozen=True)
class HostSpec:
    """One host loop: how its decoder is built, the verifiers it runs, what it can do."""

    key: str  # its registry name: build(framework=KEY), and the `name` of its framework configs
    name: str  # the loop as `api.describe` names it, e.g. "PEARL"
    # The decoder factory: its class, or the class's import path (imported on first use, so that a
    # host needing an optional package, such as eagle-llm, costs nothing until it runs).
    decoder: str | type
    parts: tuple[str, ...]  # keyword arguments its decoder gets from the pair: of PARTS
    verifiers: tuple[str, ...] | None = None  # verifier kinds it runs (`compat.verifier_kind`); None: any
    fixed: Mapping[str, Any] = field(
        default_factory=dict
    )  # verifier settings it cannot honour, with the one value it takes
    runs: str = ""  # the verifiers it runs, as a refusal says them (with `verifiers`)
    streams: bool = True  # its decoder feeds a transformers streamer every commit
    trees: bool = False  # it hands draft trees to `Verifier.verify_tree` (its verifier must implement it)
    sampling: bool = True  # it decodes sampled (temperature > 0) as well as greedy
    int8: bool = True  # it runs a target loaded in int8 (runtime.weights=int8)
    # describe's name for one built decoder, from its parts (SD: by its drafter); None: `name`
    label: Callable[[Any], str] | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.parts) - set(PARTS))
        if unknown:
            raise ValueError(f"host {self.key!r}: parts {unknown} are not among {PARTS}")
        if "drafter" in self.parts and "verifier" not in self.parts:
            raise ValueError(f"host {self.key!r}: a host that drafts needs a verifier part to judge the drafts")

    @property
    def decoder_path(self) -> str:
        """The decoder class's import path, as a framework config's `decoder._target_` writes it."""
        if isinstance(self.decoder, str):
            return self.decoder
        return f"{self.decoder.__module__}.{self.decoder.__qualname__}"

    def decoder_class(self) -> type:
        """The decoder class (importing its module if the entry names it by path)."""
        return self.decoder if isinstance(self.decoder, type) else get_class(self.decoder)

    def runs_decoder(self, cls: type) -> bool:
        """Whether `cls` is (a subclass of) this host's decoder; never imports an unloaded host's module."""
        if isinstance(self.decoder, type):
            return issubclass(cls, self.decoder)
        module, _, name = self.decoder.rpartition(".")
        known = getattr(sys.modules.get(module), name, None)  # a decoder's module is loaded once its class is
        return known is not None and issubclass(cls, known)

    def build(self, target, drafter=None, verifier=None, decoder=None, **options):
        """The decoder, given the parts `parts` lists (the others are not passed).

        Args:
            target, drafter, verifier: the pair's target model and the built drafter and verifier.
            decoder: a framework config's decoder node (Hydra builds its nested nodes); None: the
                decoder class called with `options` (the Python API's, objects no config can hold).
        """
        given = {"target": target, "drafter": drafter, "verifier": verifier}
        parts = {name: given[name] for name in self.parts}
        assert all(part is not None for part in parts.values()), f"{self.key} is built with {sorted(parts)}"
        if decoder is not None:
            return instantiate(decoder, **parts)
        return self.decoder_class()(**parts, **options)

    def check_capabilities(
        self, *, sampled: bool = False, int8: bool = False, streamed: bool = False, said: str | None = None
    ) -> None:
        """Raise ValueError, naming the fix, when a run asks for what this host cannot do.

        Args:
            sampled: the run samples (temperature > 0).
            int8: the target is loaded in int8.
            streamed: a streamer is to get every commit.
            said: how the caller named the host (e.g. "framework=x (X)"); None: `name`.
        """
        said = said or self.name
        if sampled and not self.sampling:
            raise ValueError(f"{said} decodes greedily only: set the temperature to 0 (do_sample=False)")
        if int8 and not self.int8:
            raise ValueError(
                f"{said} does not run an int8 target: load the target as bfloat16 or float32 (runtime.weights=bfloat16)"
            )
        if streamed and not self.streams:
            raise ValueError(f"{said} does not stream its commits: drop the streamer (progress=false)")


class HostRegistry(Mapping[str, HostSpec]):
    """Hosts by key, immutable; `for_decoder` finds a decoder class's host."""

    def __init__(self, hosts: Iterable[HostSpec]):
        entries: dict[str, HostSpec] = {}
        for host in hosts:
            if host.key in entries:
                raise ValueError(f"two hosts are registered as {host.key!r}: give the new one another key")
            entries[host.key] = host
        self._hosts = MappingProxyType(entries)  # read-only: registries are values, never edited in place

    def __getitem__(self, key: str) -> HostSpec:
        return self._hosts[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._hosts)

    def __len__(self) -> int:
        return len(self._hosts)

    def __repr__(self) -> str:
        return f"HostRegistry({', '.join(self._hosts)})"

    def with_host(self, host: HostSpec) -> HostRegistry:
        """This registry and `host` (a new registry; this one is unchanged)."""
        return HostRegistry([*self._hosts.values(), host])

    def host(self, key: str) -> HostSpec:
        """The host registered as `key` (ValueError listing the keys)."""
        if key not in self._hosts:
            raise ValueError(
                f"framework {key!r} is not one of {tuple(self._hosts)}: register a HostSpec for it (docs/extending.md)"
            )
        return self._hosts[key]

    def for_decoder(self, cls: type) -> HostSpec:
        """The host whose decoder `cls` is (ValueError for a decoder no entry names)."""
        for host in self._hosts.values():
            if host.runs_decoder(cls):
                return host
        raise ValueError(
            f"{cls.__module__}.{cls.__qualname__} is no host decoder of the registry"
            f" ({', '.join(h.decoder_path for h in self._hosts.values())}): add a HostSpec for it to"
            " viasd_adapters.hosts.registry.HOSTS, or pass hosts=HOSTS.with_host(...)"
        )

    def any_verifier(self) -> tuple[str, ...]:
        """Keys of the hosts that run every verifier (what a refusal suggests instead)."""
        return tuple(key for key, host in self._hosts.items() if "verifier" in host.parts and host.verifiers is None)


def _sd_label(decoder) -> str:
    """SD by its drafter: prompt lookup and Cascade SD are names of their own."""
    from ..draft import CascadeDrafter, PromptLookupDrafter

    return {PromptLookupDrafter: "prompt-lookup SD", CascadeDrafter: "Cascade SD"}.get(type(decoder.drafter), "SD")


def _auto_label(decoder) -> str:
    """auto by the loop it chose: "auto: SD", "auto: EAGLE"."""
    chosen = HOSTS.for_decoder(type(decoder.decoder))
    return f"auto: {chosen.label(decoder.decoder) if chosen.label is not None else chosen.name}"


HOSTS = HostRegistry(
    [
        # AR verifies nothing: the `verifier` group's default (full) is left unused, anything else refused
        HostSpec("ar", "AR", "viasd_adapters.decode.AutoregressiveDecoder", ("target",), verifiers=("full",)),
        HostSpec("sd", "SD", "viasd_adapters.decode.SpeculativeDecoder", ("drafter", "verifier"), label=_sd_label),
        HostSpec("pearl", "PEARL", "viasd_adapters.hosts.pearl.PearlDecoder", ("drafter", "verifier")),
        # EAGLE drafts with its own head; its tree goes to the verifier (`verify_tree`), whose slim pass is
        # a routed view of the target. eagle-llm's own forward is the full model's judge, so no layers
        # are shared with it (share_prefix), and its head hands out no draft distributions a gate could read.
        HostSpec(
            "eagle",
            "EAGLE",
            "viasd_adapters.hosts.eagle.EagleDecoder",
            ("target", "verifier"),
            verifiers=("full", "tiered"),
            fixed={"share_prefix": False, "gate": None},
            trees=True,
            runs="verifier=full (stock EAGLE) or verifier=tiered (VIA-SD on a routed view of the target's own layers)",
        ),
        # What the latency profile predicts fastest, chosen when built: SD or EAGLE (`ProfiledDecoder.decoder`);
        # any verifier, as SD (EAGLE is considered with the lossless one only)
        HostSpec(
            "auto",
            "auto",
            "viasd_adapters.costs.ProfiledDecoder",
            ("target", "drafter", "verifier"),
            label=_auto_label,
        ),
        # A speed anchor, not a host: llama.cpp decodes the target's GGUF itself (the target's own dtype is unused)
        HostSpec(
            "llama-cpp", "llama.cpp", "viasd_adapters.bench.llama_cpp.LlamaCppDecoder", ("target",), verifiers=("full",)
        ),
    ]
)
