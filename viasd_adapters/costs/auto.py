"""Decoding parts built from this machine's latency profile: `framework=auto` (SD with the drafter
variant the profile chooses and a draft length that may fall to 0, or EAGLE with the profile's
tree where the pair's target has a head) and `method=sd-adaptive` (a draft length on the profiled
costs of a fixed pair)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

import torch

from ..decode import Decoder, SpeculativeDecoder
from ..decode.schedule import ASSUMED_ACCEPTANCE, AdaptiveDraftLength, DraftCosts
from ..draft import ModelDrafter
from ..draft.model import FOUR_BIT
from ..verify import LosslessVerifier
from .choice import choose_configuration, eagle_candidate
from .profile import DraftVariant, load_profile

logger = logging.getLogger(__name__)

# the drafter variants `auto` weighs beside the plain draft: of a float draft its int8-weight copy,
# of a W8A8 one its 4-bit steps (`ModelDrafter(quantize=...)`); the profile has only those it timed
DRAFTER_QUANTIZATIONS = ("int8-weight", FOUR_BIT)


def adaptive_draft_length(
    draft: str,
    target: str,
    precision: str,
    draft_precision: str,
    context: int = 256,
    profile_path: str | None = None,
    device: str = "cpu",
    fallback_costs: dict | None = None,
    **kwargs,
) -> AdaptiveDraftLength:
    """`AdaptiveDraftLength` on the costs of (draft, target) in these precisions from this machine's
    cached latency profile (`viasd-profile` measures it), at the thread count each generation
    runs with; `kwargs` go to its constructor. When the cached profile is missing or lacks these
    models: `fallback_costs` (`DraftCosts` fields) with a warning, or, when none are given, an
    error at once, before any decoding. A profile named by `profile_path` must have them."""
    k_max = kwargs.get("k_max", 8)
    try:
        profile = load_profile(profile_path, device)
        costs = lambda threads: profile.draft_costs(
            draft, target, precision, draft_precision, threads, context, k_max + 1
        )
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
    precision: str,
    draft_precision: str,
    device: str = "cpu",
    profile_path: str | None = None,
    acceptance: float = ASSUMED_ACCEPTANCE,
    k_max: int = 8,
    context: int = 256,
    vocabulary: str | None = None,
    variant_acceptance: Mapping[str, float] | None = None,
) -> str:
    """The drafter the latency profile chooses for this target precision at this thread count:
    `draft_precision`, one of its quantised variants, or either over the draft `vocabulary`, each
    priced at its own acceptance (`DraftVariant.acceptance`: `variant_acceptance`, else
    `acceptance`), as the profile names them (`DraftVariant`). Where
    no drafting pays (the choice is AR), the cheapest draft, which `profiled_draft_length` then
    leaves idle (K = 0) until acceptance rises."""
    try:
        profile = load_profile(profile_path, device)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"method=auto runs what this machine's latency profile chooses: {error}") from error
    threads = torch.get_num_threads()
    candidates = [DraftVariant(draft_precision), *(DraftVariant(draft_precision, q) for q in DRAFTER_QUANTIZATIONS)]
    if vocabulary:
        candidates += [replace(v, vocabulary=vocabulary) for v in candidates]
    variants = [v.label for v in candidates if profile.has(draft, v.label, threads)]
    if not variants:
        raise KeyError(
            f"the latency profile has no entry for the draft {draft} in {draft_precision} at {threads}"
            " thread(s): run viasd-profile for this pair"
        )
    if vocabulary and not any(DraftVariant.parse(v).vocabulary for v in variants):
        logger.info("auto: the draft over the vocabulary %s is not in the profile (viasd-profile times it)", vocabulary)
    choice = choose_configuration(
        profile,
        draft,
        target,
        acceptance,
        threads,
        dtypes=[precision],
        draft_dtypes=variants,
        k_max=k_max,
        context=context,
        variant_acceptance=variant_acceptance,
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
        precision: str,
        draft_precision: str,
        device: str = "cpu",
        profile_path: str | None = None,
        acceptance: float = ASSUMED_ACCEPTANCE,
        vocabulary: str | None = None,
        variant_acceptance: Mapping[str, float] | None = None,
        **drafter_settings,
    ):
        """`acceptance`: the plain draft's per-token acceptance; `variant_acceptance`: its variants'
        (`DraftVariant.acceptance`), at which each is priced; `vocabulary`: a draft vocabulary it
        may score instead of the full one."""
        self.variant = chosen_draft_variant(
            draft, target, precision, draft_precision, device, profile_path, acceptance,
            vocabulary=vocabulary, variant_acceptance=variant_acceptance,
        )  # fmt: skip
        self.variant_acceptance = variant_acceptance
        chosen = DraftVariant.parse(self.variant)
        super().__init__(model, quantize=chosen.quantization, vocabulary=chosen.vocabulary, **drafter_settings)
        self.runner.variant = self.variant  # the stats name what ran as the profile does


def profiled_draft_length(
    draft: str,
    target: str,
    precision: str,
    draft_precision: str,
    device: str = "cpu",
    profile_path: str | None = None,
    k_min: int = 0,
    vocabulary: str | None = None,
    variant_acceptance: Mapping[str, float] | None = None,
    **schedule_settings,
) -> AdaptiveDraftLength:
    """`AdaptiveDraftLength` on the costs of the drafter `ProfiledDrafter` chooses with the same
    settings, starting from that drafter's acceptance; K may be 0 (a greedy AR step) where no block
    pays at the acceptance observed."""
    acceptance = schedule_settings.pop("prior_acceptance", ASSUMED_ACCEPTANCE)
    variant = chosen_draft_variant(
        draft, target, precision, draft_precision, device, profile_path, acceptance,
        vocabulary=vocabulary, variant_acceptance=variant_acceptance,
    )  # fmt: skip
    prior = DraftVariant.parse(variant).acceptance(acceptance, variant_acceptance)
    return adaptive_draft_length(
        draft, target, precision, variant, profile_path=profile_path, device=device, k_min=k_min,
        prior_acceptance=prior, **schedule_settings,
    )  # fmt: skip


class ProfiledDecoder(Decoder):
    """`framework=auto`'s loop: what this machine's latency profile predicts fastest for the run's
    target precision and thread count, chosen once when built. SD with the profiled drafter and
    draft length (K may fall to 0: greedy AR steps), or EAGLE with the profile's tree where the
    pair's target has a head with a measured acceptance whose tree level the profile has timed
    (`viasd-profile` does) and the profile predicts it faster. Lossless either way.

    `decoder` is the loop chosen; `drafter` and `verifier` are SD's parts (EAGLE drafts with its head).
    With a verifier other than the lossless one (VIA-SD's tiers), the loop is SD.
    """

    def __init__(
        self,
        target,
        drafter: ProfiledDrafter,
        verifier,
        draft_length: AdaptiveDraftLength,
        draft: str,
        target_name: str,
        precision: str,
        device: str = "cpu",
        profile_path: str | None = None,
        acceptance: float = ASSUMED_ACCEPTANCE,
        eagle_head: str | None = None,
        vocabulary: str | None = None,
        tokenizer_path: str | None = None,
        context: int = 256,
    ):
        self.drafter, self.verifier = drafter, verifier
        self.decoder: Decoder = SpeculativeDecoder(drafter, verifier, draft_length=draft_length)
        # EAGLE stands in for SD only as a lossless loop (VIA-SD's tiers on it are framework=eagle's)
        candidate = eagle_candidate(target_name, eagle_head) if type(verifier) is LosslessVerifier else None
        profile, threads = load_profile(profile_path, device), torch.get_num_threads()
        if candidate is None or not profile.has(candidate.key, precision, threads):
            if candidate is not None:
                logger.info("EAGLE not considered: the profile has not timed its head (run viasd-profile)")
            return
        choice = choose_configuration(
            profile,
            draft,
            target_name,
            acceptance,
            threads,
            [precision],
            [drafter.variant],
            context=context,
            eagle=candidate,
            variant_acceptance=drafter.variant_acceptance,
        )
        if choice.framework == "eagle":
            from ..hosts.eagle import EagleDecoder

            logger.info("auto: %s", choice.describe())
            self.decoder = EagleDecoder(
                target=target,
                head=candidate.head,
                tree=[list(c) for c in choice.tree],
                vocabulary=vocabulary,
                verifier=verifier,
                tokenizer_path=tokenizer_path,
            )

    def generate(self, input_ids, max_new_tokens, sampling=None, stop_token_ids=(), streamer=None):
        return self.decoder.generate(input_ids, max_new_tokens, sampling, stop_token_ids, streamer)

    def cores(self, threads: int) -> int:
        return self.decoder.cores(threads)
