"""The typed schema under the shared config groups, registered in Hydra's ConfigStore.

The YAML files of conf/runtime/, conf/policy/ and conf/framework/, and conf/verifier/tiered.yaml,
list their schema first in their defaults, so Hydra merges them over these dataclasses: a
misspelt key, a missing one or a value of the wrong type (`runtime.threads=two`) fails while the
config is composed, naming the key, before anything loads. The values and their documentation stay in the YAML files; a schema holds types.
Ranges (a threshold in [0, 1], a known precision) are checked by the classes the configs build
and by `checks.check_runtime`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class RuntimeConfig:
    """Where and how the models run: the `runtime` group every command selects."""

    device: str = MISSING  # a torch device string: cpu, cuda:1, mps, ...
    weights: str = MISSING  # the target's weights: float32, bfloat16, float16, int8 (models.precision)
    activations: str | None = MISSING  # what its linear layers multiply in; null: as the weights (int8: W8A8)
    draft_weights: str = MISSING  # the draft's, the same names
    draft_activations: str | None = MISSING
    threads: int | None = MISSING  # torch intra-op threads; null: torch's default
    compile: Any = MISSING  # the compiled decode step: auto, true or false (OmegaConf has no bool-or-str type)


@dataclass
class ConfidencePolicyConfig:
    """The tier thresholds (`verify.ConfidencePolicy`): the `policy` group."""

    _target_: str = "viasd_adapters.verify.ConfidencePolicy"
    tau_accept: float = MISSING
    tau_draft: float = MISSING
    tau_slim: float = MISSING


@dataclass
class HostConfig:
    """A host loop as the commands build it (`pipeline.build_decoder`): the `framework` group."""

    name: str = MISSING  # its host registry key (hosts/registry.py): ar, sd, lookup, pearl, eagle, ...
    drafter: Any = MISSING  # the drafter node (`_target_` and its settings), or null for hosts without one
    decoder: Any = MISSING  # the decoder node: the host's loop and its settings


@dataclass
class TieredVerifierConfig:
    """VIA-SD's three tiers (`verify.TieredVerifier`): conf/verifier/tiered.yaml and what extends it."""

    _target_: str = "viasd_adapters.verify.TieredVerifier"
    slim: Any = MISSING  # the slim verifier: a routed view of the target (a node), or pair.draft
    policy: Any = MISSING  # the tier thresholds (a policy node), or null: tiers off
    max_unverified: int = MISSING
    rejudge: bool = MISSING
    share_prefix: bool = MISSING
    gate: Any = MISSING  # a block gate node, or null


def register(store: ConfigStore | None = None) -> None:
    """Put the schemas in Hydra's store as `<group>/schema`, the tiered verifier's as
    `verifier/tiered_schema` (idempotent: a later store replaces)."""
    store = store or ConfigStore.instance()
    store.store(group="runtime", name="schema", node=RuntimeConfig)
    store.store(group="policy", name="schema", node=ConfidencePolicyConfig)
    store.store(group="framework", name="schema", node=HostConfig)
    store.store(group="verifier", name="tiered_schema", node=TieredVerifierConfig)
