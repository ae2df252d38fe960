"""VIA-SD's Python arguments, resolved: a routing mask and a tier policy from what a user may pass
(an object, a dict, a YAML path or a config's name), and the verifier they make together. `api.build`
and `hosts.eagle.TieredEagle` both read them here, so the arguments mean the same everywhere."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml
from hydra.utils import instantiate
from transformers import PreTrainedModel

from ..configs import ROUTING_FORMS, named_config, named_mask
from ..routing import RoutingMask, SlimModel
from .base import Verifier
from .lossless import LosslessVerifier
from .policy import ConfidencePolicy, TierPolicy
from .tiered import TieredVerifier


def routing_mask(routing: RoutingMask | Mapping | str | Path | None) -> RoutingMask | None:
    """A `RoutingMask` from a mask, its dict, a mask YAML path (what `viasd-search` writes) or the name
    of a mask config (`routing=` names)."""
    if routing is None or isinstance(routing, RoutingMask):
        return routing
    if isinstance(routing, Mapping):
        return RoutingMask.from_dict(routing)
    if isinstance(routing, (str, Path)):
        return named_mask(routing, forms=f"a RoutingMask, {ROUTING_FORMS}")
    raise TypeError(f"routing must be a RoutingMask, a dict, a YAML path or a mask name, got {type(routing).__name__}")


def tier_policy(policy: TierPolicy | Mapping | Sequence | str | Path | None) -> TierPolicy | None:
    """A `TierPolicy` from a policy, `(tau_accept, tau_slim)`, a dict of `ConfidencePolicy` fields or a
    Hydra config, a policy YAML path (what `viasd-calibrate` writes) or a policy config's name."""
    if policy is None or isinstance(policy, TierPolicy):
        return policy
    if isinstance(policy, (str, Path)):
        file = named_config(
            "policy",
            policy,
            "tier policy",
            "a TierPolicy, (tau_accept, tau_slim), a policy YAML file (viasd-calibrate writes one)",
        )
        policy = yaml.safe_load(file.read_text())
        if isinstance(policy, dict):
            policy.pop("defaults", None)  # Hydra's schema line (schema.py), not a setting
    if isinstance(policy, Mapping):
        if "_target_" in policy:
            built = instantiate(dict(policy))
            if not isinstance(built, TierPolicy):
                raise TypeError(f"the policy config builds a {type(built).__name__}, not a TierPolicy")
            return built
        return ConfidencePolicy(**policy)  # unknown keys: TypeError naming them; ranges: ValueError
    if isinstance(policy, Sequence) and len(policy) == 2:
        tau_accept, tau_slim = (float(t) for t in policy)
        return ConfidencePolicy(tau_accept=tau_accept, tau_slim=tau_slim)
    raise TypeError(
        f"policy must be a TierPolicy, (tau_accept, tau_slim), a dict, a YAML path or a policy name, got {policy!r}"
    )


def verifier_for(
    target: PreTrainedModel,
    mask: RoutingMask | None,
    policy: TierPolicy | None,
    max_unverified: int = 16,
    rejudge: bool = True,
    share_prefix: bool = False,
) -> Verifier:
    """The verifier of VIA-SD's Python arguments (`build`'s, `TieredEagle`'s): the one place they
    become one. `LosslessVerifier` without a policy (tiers off), else a `TieredVerifier` whose slim
    verifier u is the target routed by `mask` (a view of its weights; conf/verifier/tiered.yaml is
    the same construction for the commands)."""
    if policy is None:
        return LosslessVerifier(target)
    if mask is None:
        raise ValueError(
            "a tier policy needs the slim verifier's routing mask: pass routing= (a mask, its YAML or a"
            " name; RoutingMask.none() makes the slim verifier the target itself)"
        )
    return TieredVerifier(
        target,
        slim=functools.partial(SlimModel, mask=mask),
        policy=policy,
        max_unverified=max_unverified,
        rejudge=rejudge,
        share_prefix=share_prefix,
    )
