"""`viasd-calibrate`: choose tier thresholds (and, given `masks`, the routing mask) for a quality
target and write them as a policy.

    viasd-calibrate model_pair=qwen2.5-coder-0.5b-1.5b output_name=my-qwen
    viasd-calibrate 'masks=[qwen2.5-coder-1.5b-4l,qwen2.5-coder-1.5b-8l]'   # the operating point over masks
    viasd-calibrate quality=task +task@evaluation=humaneval   # by task metric, kept apart from HumanEval

The policy goes to the run directory and, as `policy/<output_name>.yaml`, to the user config
directory every command searches (`viasd_adapters.configs.user_config_dir`), so `policy=<name>`
selects it; the command prints that override. It never writes into the installed package.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from ..bench import splits
from ..bench.metrics import check_execution_enabled
from ..bench.tasks import Prompt
from ..checks import check_config
from ..configs import load_routing, result_option
from ..costs import measure_cost_ratio
from ..models.precision import runtime_precision
from ..pipeline import encode_prompt, load_pair, uses_draft_model
from ..search.calibration import PromptSource, select_prompts
from ..search.thresholds import (
    TaskQuality,
    ThresholdResult,
    choose,
    evaluate_thresholds,
    host_cost,
    reference_outputs,
    verify_cost,
    write_policy,
)
from . import apply_routing_file, check_prompt_sources, entry_point, set_threads

logger = logging.getLogger(__name__)


@dataclass
class CalibrationOutcome:
    best: ThresholdResult  # the chosen setting
    results: list[ThresholdResult]  # every setting of the grid, in order
    path: Path  # the policy in the run directory
    installed: Path  # <policy_dir>/<name>.yaml, by default in the user config directory
    override: str  # what selects it on a command line: policy=<name> (and routing=<mask> when chosen)


def policy_name(cfg: DictConfig) -> str:
    """The policy option the result is written as: `output_name`, else <model_pair>-calibrated."""
    name = str(cfg.output_name or f"{cfg.model_pair.name}-calibrated")
    return result_option("output_name", name, "policy", bool(cfg.policy_dir))


def _checked(cfg: DictConfig) -> tuple[str, dict]:
    """The policy's name and the masks to price, with every plain setting checked before the
    models load."""
    check_config(cfg, identity_slim_ok=True)  # u = q (routing=none) is a legitimate calibration check
    name = policy_name(cfg)
    check_prompt_sources(cfg.prompts, "prompts")
    apply_routing_file(cfg)
    masks = load_routing(list(cfg.masks)) if cfg.masks else {}  # a missing mask fails before any model loads
    if masks and cfg.get("routing_file"):
        raise ValueError("masks=[...] and routing_file= both choose the slim verifier's mask: set one")
    if cfg.quality not in ("agreement", "task"):
        raise ValueError(f"quality={cfg.quality}: choose quality=agreement or quality=task")
    if cfg.quality == "agreement" and cfg.get("evaluation") is not None:
        raise ValueError("evaluation= is checked against quality=task's prompts only: set quality=task, or drop it")
    return name, masks


def run(cfg: DictConfig) -> CalibrationOutcome:
    name, masks = _checked(cfg)
    task_prompts = _task_prompts(cfg) if cfg.quality == "task" else None
    set_threads(cfg.runtime.threads)
    pair = load_pair(cfg.model_pair, uses_draft_model(cfg.framework.drafter, cfg.verifier))
    quality, max_new_tokens = None, int(cfg.max_new_tokens)
    if task_prompts is not None:
        texts = [p.text for p in task_prompts]
        quality = TaskQuality(
            task_prompts,
            dict(cfg.task.metrics),
            dict(cfg.margins),
            lambda tokens: pair.target.tokenizer.decode(tokens, skip_special_tokens=True),
        )
        max_new_tokens = int(cfg.task.max_new_tokens or max_new_tokens)  # task metrics need complete answers
    else:
        texts = [
            text
            for source in cfg.prompts.sources
            for _, text in select_prompts(PromptSource(**source), cfg.prompts.split, cfg.prompts.per_category)
        ]
    prompts = [encode_prompt(pair.target, text, cfg.chat_template) for text in texts]
    grid = [(float(a), float(s)) for a, s in cfg.grid]
    # The tiers-off outputs are the same for every mask: decoded once. With masks, every mask x
    # threshold pair is priced by that mask's measured slim / full cost.
    references = reference_outputs(pair, cfg.framework, cfg.verifier, prompts, max_new_tokens, cfg.progress)
    results = []
    for mask_name, node in (masks or {None: None}).items():
        verifier, ratio = cfg.verifier, None
        if node is not None:
            verifier = OmegaConf.create(OmegaConf.to_container(cfg.verifier, resolve=True))
            verifier.slim.mask = node
            ratio = measure_cost_ratio(
                pair.target.model,
                instantiate(node, _convert_="all"),
                prompts[0],
                int(cfg.cost_block_tokens),
                repetitions=7,
            ).ratio
        for r in evaluate_thresholds(
            pair, cfg.framework, verifier, prompts, grid, max_new_tokens, references, cfg.progress, quality
        ):
            results.append(replace(r, mask=mask_name, slim_cost=ratio))
    best, met = choose(results, cfg.target_agreement, quality)
    if cfg.masks and met and verify_cost(best) >= host_cost(references):
        logger.warning(
            "the slim tier does not pay on these prompts: the cheapest setting costs %.3f forwards per"
            " token, the host with the tiers off %.3f; decode with verifier=full",
            verify_cost(best),
            host_cost(references),
        )
    target = (
        f"every task metric's paired drop (one-sided 95% bound) against the lossless (tiers-off) greedy"
        f" output within its margin {dict(cfg.margins)}"
        if quality
        else f"token agreement with the lossless (tiers-off) greedy output >= {cfg.target_agreement}"
    )
    if not met:
        logger.warning("no setting reached the quality target (%s); writing the most faithful one", target)
    facts = {
        "model_pair": cfg.model_pair.name,
        "routing": best.mask
        or (cfg.routing.get("provenance", {}).get("method", "?") + f" skip {list(cfg.routing.skip_layers)}"),
        "framework": cfg.framework.name,
        "precision": runtime_precision(cfg.runtime).label,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
        "grid": [list(g) for g in grid],
    }
    path = write_policy(Path(cfg.out_dir) / "policy.yaml", best, met, target, facts)
    policy_dir = Path(cfg.policy_dir or Path(cfg.user_config_dir) / "policy").expanduser()
    installed = write_policy(policy_dir / f"{name}.yaml", best, met, target, facts)
    override = (f"routing={best.mask} " if best.mask else "") + f"policy={name}"
    return CalibrationOutcome(best, results, path, installed, override)


def _task_prompts(cfg: DictConfig) -> list[Prompt]:
    """quality=task's calibration split: `task`'s prompts, read and checked against the
    `evaluation` task's (none may be in both) before any model loads."""
    task = instantiate(cfg.task, _convert_="all")
    prompts = task.prompts()
    if "pass@1" in task.metrics.values():
        check_execution_enabled()
    if cfg.get("evaluation") is not None:
        evaluation = instantiate(cfg.evaluation, _convert_="all")
        splits.check_disjoint(prompts, evaluation.prompts(), lambda p: p.text, "task", "evaluation")
    return prompts


@entry_point("calibrate")
def main(cfg: DictConfig) -> None:
    out = run(cfg)
    print("mask tau_accept tau_slim agreement exact full/token slim/token cost/token tok/s")
    for r in out.results:
        mark = " <- chosen" if r is out.best else ""
        print(
            f"{r.mask or '(routing)'} {r.tau_accept:10.2f} {r.tau_slim:8.2f} {r.agreement:9.3f} {r.exact_rate:5.2f}"
            f" {r.full_calls_per_token:10.3f} {r.slim_calls_per_token:10.3f} {verify_cost(r):10.3f}"
            f" {r.tokens_per_second:5.2f}{mark}"
        )
    print(f"wrote {out.path}\ninstalled: {out.installed}")
    print(
        f"use it: {out.override}  (e.g. viasd-generate model_pair={cfg.model_pair.name} verifier=tiered {out.override})"
    )


if __name__ == "__main__":
    main()
