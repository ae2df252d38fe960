"""Decoding parts built from this machine's latency profile: `framework=auto` (the drafter
variant the profile chooses, and a draft length that may fall to 0) and `method=sd-adaptive`
(a draft length on the profiled costs of a fixed pair)."""

from __future__ import annotations

import logging

import torch

from ..decode.schedule import ASSUMED_ACCEPTANCE, AdaptiveDraftLength, DraftCosts
from ..draft import ModelDrafter
from .choice import choose_configuration
from .profile import load_profile, split_variant

logger = logging.getLogger(__name__)

DRAFTER_QUANTIZATIONS = ("int8-weight",)  # the drafter variants `auto` weighs beside the plain draft


def adaptive_draft_length(
    draft: str,
    target: str,
    dtype: str,
    draft_dtype: str,
    context: int = 256,
    profile_path: str | None = None,
    device: str = "cpu",
    fallback_costs: dict | None = None,
    **kwargs,
) -> AdaptiveDraftLength:
    """`AdaptiveDraftLength` on the costs of (draft, target) in these dtypes from this machine's
    cached latency profile (`viasd-profile` measures it), at the thread count each generation
    runs with; `kwargs` go to its constructor. When the cached profile is missing or lacks these
    models: `fallback_costs` (`DraftCosts` fields) with a warning, or, when none are given, an
    error at once, before any decoding. A profile named by `profile_path` must have them."""
    k_max = kwargs.get("k_max", 8)
    try:
        profile = load_profile(profile_path, device)
        costs = lambda threads: profile.draft_costs(draft, target, dtype, draft_dtype, threads, context, k_max + 1)
        costs(torch.get_num_threads())  # a missing entry fails here, before any decoding
    except (FileNotFoundError, KeyError) as error:
        if fallback_costs is None or profile_path is not None:
            raise
        logger.warning("%s; until then drafting assumes the costs %s", error, fallback_costs)
        return AdaptiveDraftLength(DraftCosts(**fallback_costs), **kwargs)
    return AdaptiveDraftLength(costs, **kwargs)


def chosen_draft_variant(
    draft: str,
    target: str,
    dtype: str,
    draft_dtype: str,
    device: str = "cpu",
    profile_path: str | None = None,
    acceptance: float = ASSUMED_ACCEPTANCE,
    k_max: int = 8,
    context: int = 256,
) -> str:
    """The drafter the latency profile chooses for this target precision at this thread count:
    `draft_dtype` or one of its quantised variants. Where no drafting pays (the choice is AR), the
    cheapest draft, which `profiled_draft_length` then leaves idle (K = 0) until acceptance rises."""
    try:
        profile = load_profile(profile_path, device)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"method=auto runs what this machine's latency profile chooses: {error}") from error
    threads = torch.get_num_threads()
    variants = [
        v
        for v in (draft_dtype, *(f"{draft_dtype}+{q}" for q in DRAFTER_QUANTIZATIONS))
        if profile.has(draft, v, threads)
    ]
    if not variants:
        raise KeyError(
            f"the latency profile has no entry for the draft {draft} in {draft_dtype} at {threads}"
            " thread(s): run viasd-profile for this pair"
        )
    choice = choose_configuration(
        profile, draft, target, acceptance, threads, dtypes=[dtype], draft_dtypes=variants, k_max=k_max, context=context
    )
    if choice.framework == "sd":
        return choice.draft_dtype
    return min(variants, key=lambda v: profile.ms(draft, v, threads, 1, context))


class ProfiledDrafter(ModelDrafter):
    """A `ModelDrafter` of `model` running the variant `chosen_draft_variant` picks."""

    def __init__(
        self,
        model,
        draft: str,
        target: str,
        dtype: str,
        draft_dtype: str,
        device: str = "cpu",
        profile_path: str | None = None,
        acceptance: float = ASSUMED_ACCEPTANCE,
        **drafter_settings,
    ):
        """`acceptance`: the pair's per-token acceptance, at which the variant is chosen."""
        variant = chosen_draft_variant(draft, target, dtype, draft_dtype, device, profile_path, acceptance)
        super().__init__(model, quantize=split_variant(variant)[1], **drafter_settings)


def profiled_draft_length(
    draft: str,
    target: str,
    dtype: str,
    draft_dtype: str,
    device: str = "cpu",
    profile_path: str | None = None,
    k_min: int = 0,
    **schedule_settings,
) -> AdaptiveDraftLength:
    """`AdaptiveDraftLength` on the chosen drafter's costs; K may be 0 (a greedy AR step) where
    no block pays at the acceptance observed."""
    acceptance = schedule_settings.get("prior_acceptance", ASSUMED_ACCEPTANCE)
    variant = chosen_draft_variant(draft, target, dtype, draft_dtype, device, profile_path, acceptance)
    return adaptive_draft_length(
        draft, target, dtype, variant, profile_path=profile_path, device=device, k_min=k_min, **schedule_settings
    )
