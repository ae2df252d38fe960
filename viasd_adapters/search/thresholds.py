"""Tier-threshold calibration: the cheapest policy thresholds that keep a quality target.

Quality is token agreement with the target's own greedy output, as the host loop computes it
with the tiers off (lossless), on calibration prompts; cost is forward passes per generated
token, counts rather than times, so the choice does not depend on how busy the machine was:
full-model forwards, plus slim forwards priced at the mask's measured slim / full ratio when
several masks compete (`verify_cost`). Measured tokens/s are reported beside it.
"""

from __future__ import annotations

import datetime
import logging
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from ..bench.metrics import token_agreement
from ..decode import GenerationResult
from ..pipeline import ModelPair, build_decoder
from ..sampling import SamplingConfig

logger = logging.getLogger(__name__)


@dataclass
class ThresholdResult:
    """How one (tau_accept, tau_slim) setting did on the calibration prompts."""

    tau_accept: float
    tau_slim: float
    agreement: float  # mean token match rate with the target's greedy output
    exact_rate: float  # share of prompts whose output equals it exactly
    full_calls_per_token: float  # target forwards per generated token (the cost that is chosen on)
    slim_calls_per_token: float
    tokens_per_second: float  # median over prompts (measured, for information)
    mask: str | None = None  # the routing option evaluated (None: the configured mask)
    slim_cost: float | None = None  # one slim forward / one full forward, measured for the mask


def verify_cost(result: ThresholdResult) -> float:
    """Verify cost per generated token, in full forwards: full forwards plus slim forwards at the
    mask's measured cost ratio (full forwards alone when no ratio was measured: one mask)."""
    return result.full_calls_per_token + (result.slim_cost or 0.0) * result.slim_calls_per_token


def evaluate_thresholds(
    pair: ModelPair,
    framework: DictConfig,
    verifier: DictConfig,
    prompts: list[torch.Tensor],
    grid: list[tuple[float, float]],
    max_new_tokens: int,
    references: list[GenerationResult],
    progress: bool = True,
) -> list[ThresholdResult]:
    """Decode every prompt with every (tau_accept, tau_slim) of `grid` (greedy), scoring agreement
    with the same host loop with the tiers off (lossless: the target's greedy output, which in
    fp32 is AR's; in bf16 lossless SD itself drifts from AR at near-ties, and comparing with AR
    would charge that drift to the thresholds): `references`, from `reference_outputs`."""
    greedy = SamplingConfig()
    stop = pair.target.stop_token_ids
    references = [r.tokens for r in references]
    results = []
    for tau_accept, tau_slim in tqdm(grid, desc="thresholds", disable=not progress):
        node = OmegaConf.merge(verifier, {"policy": {"tau_accept": tau_accept, "tau_slim": tau_slim}})
        decoder = build_decoder(framework, node, pair)
        agreements, exact, speeds, full, slim, tokens = [], 0, [], 0, 0, 0
        for ids, reference in zip(prompts, references):
            out = decoder.generate(ids, max_new_tokens, greedy, stop)
            rate, same = token_agreement(out.tokens, reference)
            agreements.append(rate)
            exact += same
            speeds.append(out.stats.tokens_per_second)
            calls = out.stats.model_calls
            full += calls["target"].calls
            slim += calls["slim"].calls if "slim" in calls else 0
            tokens += out.stats.new_tokens
        results.append(
            ThresholdResult(
                tau_accept,
                tau_slim,
                statistics.fmean(agreements),
                exact / len(prompts),
                full / tokens,
                slim / tokens,
                statistics.median(speeds),
            )
        )
        logger.info("%s", results[-1])
    return results


def reference_outputs(
    pair: ModelPair,
    framework: DictConfig,
    verifier: DictConfig,
    prompts: list[torch.Tensor],
    max_new_tokens: int,
    progress: bool = True,
) -> list[GenerationResult]:
    """The host loop's greedy generations with the tiers off (the same for every mask)."""
    decoder = build_decoder(framework, OmegaConf.merge(verifier, {"policy": None}), pair)
    return [
        decoder.generate(ids, max_new_tokens, SamplingConfig(), pair.target.stop_token_ids)
        for ids in tqdm(prompts, desc="reference (tiers off)", disable=not progress)
    ]


def host_cost(references: list[GenerationResult]) -> float:
    """Full forwards per generated token of the tiers-off host: what a slim tier must undercut."""
    return sum(r.stats.model_calls["target"].calls for r in references) / max(
        1, sum(r.stats.new_tokens for r in references)
    )


def choose(results: list[ThresholdResult], target_agreement: float) -> tuple[ThresholdResult, bool]:
    """The lowest `verify_cost` among settings meeting the target (ties: the safer, higher
    thresholds); the most faithful setting, flagged, when none meets it."""
    meeting = [r for r in results if r.agreement >= target_agreement]
    if not meeting:
        return max(results, key=lambda r: r.agreement), False
    return min(meeting, key=lambda r: (verify_cost(r), -r.tau_accept, -r.tau_slim)), True


def write_policy(path: Path, best: ThresholdResult, met: bool, target_agreement: float, facts: dict) -> Path:
    """A policy config (a `policy/` group file) holding the chosen thresholds and how they were chosen."""
    provenance = {
        "quality_target": f"token agreement with the lossless (tiers-off) greedy output >= {target_agreement}",
        "met": met,
        **{k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(best).items()},
        **facts,
        "date": datetime.date.today().isoformat(),
    }
    header = "".join(f"# {line}\n" for line in yaml.safe_dump(provenance, sort_keys=False).splitlines())
    body = {
        "defaults": ["schema", "_self_"],  # the policy group's typed schema (viasd_adapters/schema.py)
        "_target_": "viasd_adapters.verify.ConfidencePolicy",
        "tau_accept": best.tau_accept,
        "tau_draft": 0.0,
        "tau_slim": best.tau_slim,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# Written by viasd-calibrate.\n" + header + yaml.safe_dump(body, sort_keys=False))
    return path
