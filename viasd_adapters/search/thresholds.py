"""Tier-threshold calibration: the cheapest policy thresholds that keep a quality target.

Quality is judged against the target's own greedy output, as the host loop computes it with the
tiers off (lossless), on calibration prompts: token agreement with it, or (`TaskQuality`) each
task metric non-inferior to its score within a margin. Cost is forward passes per generated
token, counts rather than times, so the choice does not depend on how busy the machine was:
full-model forwards, plus slim forwards priced at the mask's measured slim / full ratio when
several masks compete (`verify_cost`). Measured tokens/s are reported beside it.
"""

from __future__ import annotations

import datetime
import logging
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from ..bench.metrics import QUALITY_METRICS, token_agreement
from ..bench.quality import drop_bound
from ..bench.tasks import Prompt
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
    # TaskQuality: "<category>/<metric>" -> one-sided 95% bound of the drop against the tiers-off output
    drop_bounds: dict[str, float] = field(default_factory=dict)


@dataclass
class TaskQuality:
    """Quality as task metrics: a setting keeps it when, in every scored category, the one-sided
    95% bound of its paired drop against the tiers-off outputs is within the metric's margin."""

    prompts: list[Prompt]  # the calibration split, in the order the prompts are decoded
    metrics: dict[str, str]  # category -> metric name (`QUALITY_METRICS`); others are not scored
    margins: dict[str, float]  # metric -> largest acceptable drop
    decode: Callable[[list[int]], str]  # output tokens -> text

    def __post_init__(self) -> None:
        used = {self.metrics[p.category] for p in self.prompts if p.category in self.metrics}
        if not used:
            raise ValueError("quality=task: no calibration prompt has a task metric; pick categories that do")
        if missing := sorted(used - set(self.margins)):
            raise ValueError(f"quality=task: no margin for {missing}: set margins.<metric>=<largest acceptable drop>")

    def scores(self, outputs: list[list[int]]) -> dict[str, list[float]]:
        """ "<category>/<metric>" -> each scored prompt's value, in prompt order."""
        out: dict[str, list[float]] = {}
        for prompt, tokens in zip(self.prompts, outputs, strict=True):
            if (metric := self.metrics.get(prompt.category)) is not None:
                value = QUALITY_METRICS[metric](prompt, self.decode(tokens)).value
                out.setdefault(f"{prompt.category}/{metric}", []).append(value)
        return out

    def drop_bounds(self, outputs: list[list[int]], reference: list[list[int]]) -> dict[str, float]:
        ref = self.scores(reference)
        return {key: drop_bound(values, ref[key]) for key, values in self.scores(outputs).items()}

    def excess(self, bounds: dict[str, float]) -> float:
        """The largest amount by which a bound exceeds its margin (<= 0: non-inferior everywhere)."""
        return max(bound - self.margins[key.rsplit("/", 1)[1]] for key, bound in bounds.items())


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
    quality: TaskQuality | None = None,
) -> list[ThresholdResult]:
    """Decode every prompt with every (tau_accept, tau_slim) of `grid` (greedy), scoring agreement
    with the same host loop with the tiers off (lossless: the target's greedy output, which in
    fp32 is AR's; in bf16 lossless SD itself drifts from AR at near-ties, and comparing with AR
    would charge that drift to the thresholds): `references`, from `reference_outputs`. With
    `quality` (whose prompts `prompts` encode), each task metric's drop bound too."""
    greedy = SamplingConfig()
    stop = pair.target.stop_token_ids
    references = [r.tokens for r in references]
    results = []
    for tau_accept, tau_slim in tqdm(grid, desc="thresholds", disable=not progress):
        node = OmegaConf.merge(verifier, {"policy": {"tau_accept": tau_accept, "tau_slim": tau_slim}})
        decoder = build_decoder(framework, node, pair)
        agreements, exact, speeds, full, slim, tokens, outputs = [], 0, [], 0, 0, 0, []
        for ids, reference in zip(prompts, references):
            out = decoder.generate(ids, max_new_tokens, greedy, stop)
            outputs.append(out.tokens)
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
                drop_bounds=quality.drop_bounds(outputs, references) if quality else {},
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


def choose(
    results: list[ThresholdResult], target_agreement: float, quality: TaskQuality | None = None
) -> tuple[ThresholdResult, bool]:
    """The lowest `verify_cost` among settings meeting the target (ties: the safer, higher
    thresholds); the most faithful setting, flagged, when none meets it. The target is
    `target_agreement`, or with `quality` every task metric within its margin."""
    if quality is None:
        meeting = [r for r in results if r.agreement >= target_agreement]
        faithful = max(results, key=lambda r: r.agreement)
    else:
        meeting = [r for r in results if quality.excess(r.drop_bounds) <= 0]
        faithful = min(results, key=lambda r: quality.excess(r.drop_bounds))
    if not meeting:
        return faithful, False
    return min(meeting, key=lambda r: (verify_cost(r), -r.tau_accept, -r.tau_slim)), True


def write_policy(path: Path, best: ThresholdResult, met: bool, quality_target: str, facts: dict) -> Path:
    """A policy config (a `policy/` group file) holding the chosen thresholds and how they were chosen."""
    provenance = {
        "quality_target": quality_target,
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
