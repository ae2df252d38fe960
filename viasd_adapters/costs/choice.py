"""The automatic choice: the target dtype, draft dtype (or quantised variant), draft length K
and thread count with the most expected tokens per second on this device, from its latency
profile and an assumed per-token acceptance (Leviathan's S(a, K), `decode.schedule`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from ..decode.schedule import best_draft_length, expected_speedup
from ..decode.stats import RankAcceptance
from .profile import DraftVariant, LatencyProfile, draft_head_key
from .tree import profiled_shape

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EagleCandidate:
    """An EAGLE head the choice may pick: its tree level's profile name (`measure.draft_head_key`),
    the head (folder or shipped name) and its measured acceptance by depth and rank (its recipe's)."""

    key: str
    head: str
    acceptance: RankAcceptance


def eagle_candidate(target: str, head: str | None) -> EagleCandidate | None:
    """The EAGLE head `head` (a folder or a shipped head's name) over `target`, with the acceptance
    by depth and rank its training measured; None, the reason logged, when there is none to weigh."""
    if not head:
        return None
    try:
        from ..hosts.eagle import head_acceptance, resolve_head  # EAGLE is an optional extra
    except ImportError as err:
        logger.info("EAGLE not considered: %s", err)
        return None
    try:
        folder = resolve_head(head)
    except ValueError:
        logger.info("EAGLE not considered: no head %r (name a head folder to weigh one)", head)
        return None
    measured = head_acceptance(folder)
    if measured is None:
        logger.warning(
            "EAGLE not considered: the head in %s has no measured acceptance (recipe.json's rank_acceptance,"
            " which viasd-train-eagle writes)",
            folder,
        )
        return None
    return EagleCandidate(draft_head_key(target, str(folder)), str(folder), measured)


@dataclass(frozen=True)
class Choice:
    """The configuration with the highest expected speed, and what it was compared with."""

    framework: str  # "sd", "eagle" or "ar" (AR when nothing beats it)
    dtype: str  # the target's dtype
    draft_dtype: str | None  # the drafter's dtype or quantised variant; None for AR
    num_draft_tokens: int  # K (0 for AR)
    expected_speedup: float  # over the fastest AR (any dtype) at the same threads
    expected_tokens_per_second: float  # from the profile's costs and the assumed acceptance
    ar_tokens_per_second: float  # the fastest AR (any dtype) at the same threads
    threads: int  # torch threads the configuration runs with
    acceptance: float  # the per-token acceptance a assumed
    fastest_ar_dtype: str = ""  # the target dtype of that fastest AR
    tree: tuple[tuple[int, ...], ...] = ()  # EAGLE: the tree's rank paths (shaped by `costs.tree`)
    head: str = ""  # EAGLE: the head

    def describe(self) -> str:
        threads = f"{self.threads} thread{'s' if self.threads > 1 else ''}"
        if self.framework == "eagle":
            depth = max(len(c) for c in self.tree)
            kind = "chain" if len(self.tree) == depth else "tree"
            return (
                f"EAGLE ({self.head}), target {self.dtype}, a {kind} of {len(self.tree)} drafts, depth {depth},"
                f" {threads}: expected {self.expected_speedup:.2f}x the fastest AR"
            )
        if self.framework == "ar":
            return f"greedy AR in {self.dtype} ({self.threads} thread{'s' if self.threads > 1 else ''}): no draft length is predicted to beat it (by the margin asked) at a = {self.acceptance:.2f}"
        variant = DraftVariant.parse(self.draft_dtype or "")
        draft = replace(variant, vocabulary=None).label
        if variant.vocabulary:
            draft += f" over the draft vocabulary {variant.vocabulary}"
        return (
            f"SD, target {self.dtype}, draft {draft}, K = {self.num_draft_tokens} at first"
            f" (adapted to the observed acceptance), {self.threads} thread{'s' if self.threads > 1 else ''}: expected"
            f" {self.expected_speedup:.2f}x the fastest AR at a = {self.acceptance:.2f}"
        )


def _options_at(
    profile: LatencyProfile,
    draft: str,
    target: str,
    acceptance: float,
    threads: int,
    dtypes: list[str],
    draft_dtypes: list[str],
    k_max: int,
    context: int,
    eagle: EagleCandidate | None = None,
    variant_acceptance: Mapping[str, float] | None = None,
) -> list[Choice]:
    """Every (target dtype, AR, SD with each draft dtype at its best K, EAGLE with its best tree)
    the profile prices at `threads`."""
    targets = [d for d in dtypes if profile.has(target, d, threads)]
    drafts = [d for d in draft_dtypes if profile.has(draft, d, threads)]
    if not targets:
        return []
    # Speedups are over the fastest AR at these threads, whatever its dtype: a configuration
    # that only beats AR in a slow dtype is no gain.
    ar_speeds = {d: 1000.0 / profile.ms(target, d, threads, 1, context) for d in targets}
    fastest_dtype = max(ar_speeds, key=ar_speeds.get)
    fastest_ar = ar_speeds[fastest_dtype]
    options = []
    for dtype, ar in ar_speeds.items():
        options.append(
            Choice("ar", dtype, None, 0, ar / fastest_ar, ar, fastest_ar, threads, acceptance, fastest_dtype)
        )
        for draft_dtype in drafts:
            a = DraftVariant.parse(draft_dtype).acceptance(acceptance, variant_acceptance)
            costs = profile.draft_costs(draft, target, dtype, draft_dtype, threads, context, k_max + 1)
            k = best_draft_length(a, costs, k_max)
            speed = expected_speedup(a, k, costs) * ar
            options.append(
                Choice(
                    "sd",
                    dtype,
                    draft_dtype,
                    k,
                    speed / fastest_ar,
                    speed,
                    fastest_ar,
                    threads,
                    a,
                    fastest_dtype,
                )
            )
        if eagle is not None and profile.has(eagle.key, dtype, threads):
            options.append(_eagle_option(profile, target, dtype, threads, context, eagle, fastest_ar, fastest_dtype))
    return options


def _eagle_option(
    profile: LatencyProfile,
    target: str,
    dtype: str,
    threads: int,
    context: int,
    eagle: EagleCandidate,
    fastest_ar: float,
    fastest_dtype: str,
) -> Choice:
    """EAGLE on `target` in `dtype` with the tree the profile's costs make best (`profiled_shape`)."""
    shape = profiled_shape(profile, eagle.acceptance, target, eagle.key, dtype, threads, context)
    speed = 1000.0 * shape.tokens_per_round / shape.ms_per_round
    return Choice(
        "eagle",
        dtype,
        None,
        len(shape.choices),
        speed / fastest_ar,
        speed,
        fastest_ar,
        threads,
        eagle.acceptance.rate(1, 0),
        fastest_dtype,
        tree=tuple(shape.choices),
        head=eagle.head,
    )


def choose_configuration(
    profile: LatencyProfile,
    draft: str,
    target: str,
    acceptance: float,
    threads: int | Iterable[int],
    dtypes: Iterable[str] = ("bfloat16", "float32"),
    draft_dtypes: Iterable[str] | None = None,
    k_max: int = 8,
    context: int = 256,
    min_speedup: float = 1.0,
    eagle: EagleCandidate | None = None,
    variant_acceptance: Mapping[str, float] | None = None,
) -> Choice:
    """The (threads, target dtype, draft dtype, K) with the most expected tokens per second.

    Expected tokens/s = S(a, K) / (target step in ms) * 1000; AR (K = 0) competes too, so a
    pair whose drafting cannot pay on this device decodes greedily. Given several thread
    counts, the fastest wins (on a busy host one thread can beat two). Dtypes and thread counts
    the profile lacks are skipped (an error when none is left). `draft_dtypes` may name
    quantised variants ("bfloat16+int8-weight"); default: `dtypes`. A speculative option must
    be expected to run at least `min_speedup` times the fastest AR to be chosen: the model prices
    a round's forwards only, not what else a round costs. `eagle`: an EAGLE head competes too,
    with the tree its measured acceptance and the profile's costs make best (`costs.tree`).
    `variant_acceptance`: the acceptance of drafter variants that propose otherwise than the
    plain draft, by what they change (`DraftVariant.acceptance`): a reduced vocabulary never
    proposes the ids left out, 4-bit steps round coarser; the others are priced at `acceptance`.
    """
    dtypes = list(dtypes)
    draft_dtypes = list(draft_dtypes or dtypes)
    best: Choice | None = None
    for t in [threads] if isinstance(threads, int) else list(threads):
        options = _options_at(
            profile, draft, target, acceptance, t, dtypes, draft_dtypes, k_max, context, eagle, variant_acceptance
        )
        for option in options:
            if option.framework != "ar" and option.expected_speedup < min_speedup:
                continue
            # strictly faster only: on a tie the first option considered (AR before SD) stays
            if best is None or option.expected_tokens_per_second > best.expected_tokens_per_second:
                best = option
    if best is None:
        raise ValueError(
            f"the profile lacks {target} at thread count(s) {threads} in the dtypes {dtypes}:"
            " run viasd-profile for this pair and thread count"
        )
    return best


def winnable_dtypes(
    profile: LatencyProfile, target: str, dtypes: Iterable[str], acceptance: float, threads: int, context: int = 256
) -> list[str]:
    """The target precisions, of those whose one-token step `profile` has, that some configuration
    could make fastest at per-token acceptance `acceptance`.

    A round commits at most 1 / (1 - a) tokens on average however long its draft, and costs at
    least one one-token step (a free draft, a verify no dearer than a step). So a precision whose
    step is more than 1 / (1 - a) times the fastest step can never beat that precision's AR: its
    multi-token forwards need not be measured. A precision without a step in `profile` is kept.
    """
    steps = {d: profile.ms(target, d, threads, 1, context) for d in dtypes if profile.has(target, d, threads)}
    if not steps:
        return list(dtypes)
    ceiling = min(steps.values()) / (1.0 - acceptance)
    return [d for d in dtypes if d not in steps or steps[d] <= ceiling]
