"""`viasd-profile`: measure (once) and cache this device's latency profile, pick the fastest
lossless configuration for the model pair from it, and optionally decode a prompt with that
configuration beside greedy AR (what `make demo` runs)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from ..api import build
from ..costs import (
    Choice,
    DraftVariant,
    LatencyProfile,
    ProfileGrid,
    choose_configuration,
    default_profile_path,
    eagle_candidate,
    load_profile,
    measure_draft_head,
    measure_for_choice,
    usable_threads,
)
from ..decode import GenerationResult
from ..decode.schedule import AdaptiveDraftLength
from ..draft import ModelDrafter
from ..draft.model import FOUR_BIT
from ..models import load_model, native
from ..models.precision import INT8, Precision
from ..models.spec import LoadedModel
from ..pipeline import encode_prompt
from . import entry_point

logger = logging.getLogger(__name__)


@dataclass
class Decoded:
    """One prompt decoded by one configuration."""

    label: str
    result: GenerationResult
    text: str


@dataclass
class ProfileOutcome:
    path: Path  # where the profile is cached
    profile: LatencyProfile
    measured: bool  # whether this run measured anything
    choice: Choice
    decoded: list[Decoded]  # [greedy AR, chosen configuration] when a prompt was given


def load_in(spec: DictConfig, precision: str, device: str) -> LoadedModel:
    """The model of a `model_pair` role's config in the precision the profile labels `precision`."""
    return load_model(instantiate(spec, **Precision.from_label(precision).settings(), device=device))


def pair_loader(model_pair: DictConfig):
    """load(name, precision, device) -> model, for the two models of a `model_pair` config."""
    specs = {model_pair[role].name: model_pair[role] for role in ("draft", "target")}
    return lambda name, precision, device: load_in(specs[name], precision, device).model


def _cached_profile(path: Path, device: str) -> LatencyProfile | None:
    """The profile at `path`, or None (logged) when it is of an older format or unreadable: it is
    then measured anew and replaced."""
    try:
        return load_profile(path, device)
    except ValueError as err:
        logger.warning("%s; measuring it again", err)
        return None


def ensure_profile(cfg: DictConfig, grid: ProfileGrid, path: Path, load=None) -> tuple[LatencyProfile, list[str], bool]:
    """The cached profile at `path` after measuring what the pair's choice needs of `grid` and it
    lacks (`costs.measure_for_choice`), the target precisions left to choose among, and whether
    anything was measured."""
    cached = None if cfg.remeasure or not path.exists() else _cached_profile(path, cfg.runtime.device)
    pair = cfg.model_pair
    profile, dtypes = measure_for_choice(
        cached, grid, pair.draft.name, pair.target.name, cfg.acceptance, cfg.context, cfg.runtime.device, load,
        cfg.progress,
    )  # fmt: skip
    measured = profile is not cached
    if measured:
        profile.save(path)
        logger.info("latency profile cached in %s", path)
    return profile, dtypes, measured


def decode_both(cfg: DictConfig, profile: LatencyProfile, choice: Choice) -> list[Decoded]:
    """Greedy AR of the chosen target, the chosen configuration and, where another precision's AR
    is faster, greedy AR in that one, on `cfg.prompt`, each warmed up once first."""
    device = cfg.runtime.device
    pair = cfg.model_pair
    target = load_in(pair.target, choice.dtype, device)
    decoders = {f"greedy AR ({choice.dtype})": (build(target).decoder, target)}
    if choice.framework == "sd":
        variant = DraftVariant.parse(choice.draft_dtype)
        draft = load_in(pair.draft, variant.dtype, device)
        schedule = AdaptiveDraftLength(
            lambda threads: profile.draft_costs(
                pair.draft.name, pair.target.name, choice.dtype, choice.draft_dtype, threads, cfg.context, cfg.k_max + 1
            ),
            k_max=cfg.k_max,
            prior_acceptance=choice.acceptance,
        )
        label = f"SD (target {choice.dtype}, draft {choice.draft_dtype}, adaptive K from {choice.num_draft_tokens})"
        drafter = ModelDrafter(draft.model, quantize=variant.quantization, vocabulary=variant.vocabulary)  # as priced
        decoders[label] = (build(target, drafter, policy=None, draft_length=schedule).decoder, target)
    if choice.framework == "eagle":
        from ..hosts.eagle import EagleDecoder

        decoder = EagleDecoder(
            target=target.model,
            head=choice.head,
            tree=[list(c) for c in choice.tree],
            vocabulary=pair.get("draft_vocabulary"),
            tokenizer=target.tokenizer,
        )
        decoders[f"EAGLE (target {choice.dtype}, {len(choice.tree)} drafts in the profile's tree)"] = (decoder, target)
    if choice.fastest_ar_dtype and choice.fastest_ar_dtype != choice.dtype:
        fastest = load_in(pair.target, choice.fastest_ar_dtype, device)
        label = f"greedy AR ({choice.fastest_ar_dtype}, the fastest AR by the profile)"
        decoders[label] = (build(fastest).decoder, fastest)
    ids = encode_prompt(target, cfg.prompt, cfg.chat_template)
    sampling = instantiate(cfg.sampling)
    out = []
    for label, (decoder, model) in decoders.items():
        decoder.generate(ids, 4, sampling, model.stop_token_ids)  # warm-up: kernels and allocator
        result = decoder.generate(ids, cfg.max_new_tokens, sampling, model.stop_token_ids)
        out.append(Decoded(label, result, model.tokenizer.decode(result.tokens, skip_special_tokens=True)))
    return out


def runnable_grid(grid: ProfileGrid, device: str) -> ProfileGrid:
    """`grid` less what cannot run here: int8 off a CPU (its kernels are CPU ones), and 4-bit draft
    steps without the project's native operators (their kernel is one), with a log line."""
    if torch.device(device).type != "cpu":
        grid.dtypes = [d for d in grid.dtypes if Precision.from_label(d).weights != INT8]
        grid.variants = [v for v in grid.variants if DraftVariant.parse(v).dtype in grid.dtypes]
    four_bit = [v for v in grid.variants if DraftVariant.parse(v).quantization == FOUR_BIT]
    reason = native.load() if four_bit else None
    if reason is not None:
        logger.warning("the 4-bit drafters are not profiled: %s", reason)
        grid.variants = [v for v in grid.variants if v not in four_bit]
    return grid


def run(cfg: DictConfig) -> ProfileOutcome:
    device = cfg.runtime.device
    grid = runnable_grid(instantiate(cfg.grid, _convert_="all"), device)
    path = Path(cfg.profile_path) if cfg.profile_path else default_profile_path(device)
    profile, dtypes, measured = ensure_profile(cfg, grid, path, pair_loader(cfg.model_pair))
    eagle = eagle_candidate(cfg.model_pair.target.name, cfg.eagle_head)
    if eagle is not None:
        before = len(profile.entries)
        profile = measure_draft_head(
            profile, cfg.model_pair.target.name, eagle.head, dtypes, grid, cfg.context,
            cfg.model_pair.get("draft_vocabulary"), device,
            lambda _, precision, device: load_in(cfg.model_pair.target, precision, device),
            cfg.progress,
        )  # fmt: skip
        if len(profile.entries) != before:
            profile.save(path)
            measured = True
    threads = [cfg.runtime.threads] if cfg.runtime.threads else usable_threads(grid.threads, device)
    choice = choose_configuration(
        profile,
        cfg.model_pair.draft.name,
        cfg.model_pair.target.name,
        cfg.acceptance,
        threads,
        dtypes=dtypes,
        draft_dtypes=grid.dtypes + grid.variants,
        k_max=cfg.k_max,
        context=cfg.context,
        min_speedup=cfg.min_speedup,
        eagle=eagle,
        variant_acceptance=cfg.variant_acceptance,
    )
    decoded = []
    if cfg.prompt:
        saved = torch.get_num_threads()
        torch.set_num_threads(choice.threads)
        try:
            decoded = decode_both(cfg, profile, choice)
        finally:
            torch.set_num_threads(saved)
    return ProfileOutcome(path, profile, measured, choice, decoded)


def report(outcome: ProfileOutcome) -> str:
    p = outcome.profile
    load = f"; 1-min load {min(p.loadavg_1m):.1f}-{max(p.loadavg_1m):.1f} while measured" if p.loadavg_1m else ""
    lines = [f"latency profile: {outcome.path} ({p.hardware}; torch {p.torch_version}{load})"]
    lines.append(f"fastest lossless configuration: {outcome.choice.describe()}")
    if outcome.decoded:
        chosen = outcome.decoded[1] if len(outcome.decoded) > 1 else outcome.decoded[0]
        lines += ["", chosen.text, ""]
        base = outcome.decoded[0].result
        fastest_ar = max(d.result.stats.tokens_per_second for d in outcome.decoded if d.label.startswith("greedy AR"))
        for d in outcome.decoded:
            s = d.result.stats
            same = "same tokens as greedy AR"
            if d.result.tokens != base.tokens:
                first = next(
                    (i for i, (a, b) in enumerate(zip(d.result.tokens, base.tokens)) if a != b),
                    min(len(d.result.tokens), len(base.tokens)),
                )
                same = f"the same first {first} tokens as greedy AR, then they part"
                if d.label.startswith("greedy AR"):
                    same += " (another precision of the target)"
                elif outcome.choice.dtype == "bfloat16":
                    same += (
                        " (bfloat16: a multi-token verify rounds differently from a one-token step"
                        " where two tokens nearly tie; with an fp32 or int8 target the tokens are identical)"
                    )
            lines.append(
                f"{d.label}: {s.tokens_per_second:.2f} tok/s, {s.tokens_per_second / base.stats.tokens_per_second:.2f}x"
                f" greedy AR of the same target, {s.tokens_per_second / fastest_ar:.2f}x the fastest AR"
                f" ({s.new_tokens} tokens, mean accepted length {s.mean_accepted_length:.2f}; {same})"
            )
    return "\n".join(lines)


@entry_point("profile")
def main(cfg: DictConfig) -> None:
    print(report(run(cfg)))


if __name__ == "__main__":
    main()
