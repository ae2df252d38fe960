"""`viasd-search`: find a routing mask for a model pair's target (DIMR) and write it with a report.

    viasd-search model_pair=qwen2.5-coder-0.5b-1.5b search=layers search.budget.amount=4 \
        mask_name=my-qwen-4l

The mask goes to the run directory (`out_dir/mask.yaml`, beside the report) and, as
`routing/<mask_name>.yaml`, to the user config directory every command searches
(`viasd_adapters.configs.user_config_dir`), so `routing=<mask_name>` selects it; the command
prints that override. It never writes into the installed package.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import logging
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from ..checks import check_config
from ..configs import named_mask, result_option
from ..costs import CostModel, load_profile
from ..models import load_model
from ..models.precision import precision_label
from ..routing import RoutingMask
from ..search import (
    Baselines,
    Budget,
    CalibratedTarget,
    CalibrationConfig,
    ExpectedCost,
    MaskMetrics,
    MaskSpace,
    SearchConfig,
    SearchResult,
    attention_share,
    greedy_removal,
    prepare_target,
    run_search,
    sensitivity,
    write_report,
)
from . import check_prompt_sources, entry_point, set_threads

logger = logging.getLogger(__name__)


@dataclass
class SearchOutput:
    mask: RoutingMask  # the found mask, with provenance
    result: SearchResult
    baselines: Baselines
    mask_path: Path  # mask.yaml in the output folder
    report_path: Path
    installed: Path  # <routing_dir>/<mask_name>.yaml, by default in the user config directory
    override: str  # what selects it on a command line: routing=<mask_name>


def run(cfg: DictConfig) -> SearchOutput:
    begin = time.perf_counter()
    name = mask_name(cfg)  # a bad name fails before the model loads
    check_prompt_sources(cfg.calibration, "calibration")
    check_config(cfg)
    set_threads(cfg.runtime.threads)
    search_cfg = SearchConfig(**OmegaConf.to_container(cfg.search.config, resolve=True))
    profile = _expected_profile(cfg, search_cfg.cost)
    known = _known_seeds(list(cfg.search.seeds))  # a missing mask fails before the model loads
    loaded = load_model(instantiate(cfg.model_pair.target, _convert_="all"))
    expected = None
    if profile is not None:
        fields = {k: v for k, v in OmegaConf.to_container(cfg.search.expected, resolve=True).items() if k != "profile"}
        expected = ExpectedCost(profile, attention_share(loaded.model), **fields)
    calibrated = prepare_target(
        loaded,
        CalibrationConfig(**OmegaConf.to_container(cfg.calibration, resolve=True)),
        cfg.cache_dir,
        cfg.progress,
        expected,
    )
    budget = Budget(**OmegaConf.to_container(cfg.search.budget, resolve=True))

    # Baselines first: they seed and narrow the search and go in the report.
    baselines, candidates, space = _baselines_and_space(cfg, calibrated, budget, search_cfg.cost)
    seeds = _seed_masks(list(cfg.search.seeds), known, space, baselines, search_cfg.cost)
    baseline_seconds = time.perf_counter() - begin

    out_dir = Path(cfg.out_dir)
    result = run_search(
        calibrated.objective, space, search_cfg, out_dir / "trials.pkl", [m for _, m in seeds], progress=cfg.progress
    )
    best = result.best
    provenance = _provenance(cfg, calibrated, space, result, expected, candidates, seeds, begin, baseline_seconds)
    provenance |= _baselines_provenance(baselines, result)
    L, model = calibrated.num_layers, calibrated.model_name
    mask = RoutingMask(
        *best.mask.skips,
        num_layers=L,
        model=model,
        provenance={k: v for k, v in provenance.items() if not k.endswith("_text") and v is not None},
    )
    header = (
        f"Routing mask for {model}: {mask.describe()} ({budget.describe()} of {L} layers), found by "
        f"viasd-search.\nOn its calibration text: KL(q||u) {best.metrics.kl:.4f}, top-1 agreement "
        f"{best.metrics.top1:.3f}."
    )
    mask_path = mask.to_yaml(out_dir / "mask.yaml", header)
    report_path = write_report(out_dir, mask, result, baselines, provenance)
    routing_dir = Path(cfg.routing_dir or Path(cfg.user_config_dir) / "routing").expanduser()
    installed = mask.to_yaml(routing_dir / f"{name}.yaml", header)
    if cfg.docs_dir:  # e.g. how the repository ships a mask's report beside the mask
        docs = Path(cfg.docs_dir).expanduser()
        docs.mkdir(parents=True, exist_ok=True)
        for file in ("report.md", "best_cost.png", "trials.jsonl"):
            shutil.copy(out_dir / file, docs / file)
    logger.info("found %s: kl %.4f top1 %.3f -> %s", mask.describe(), best.metrics.kl, best.metrics.top1, mask_path)
    return SearchOutput(mask, result, baselines, mask_path, report_path, installed, f"routing={name}")


def _expected_profile(cfg: DictConfig, cost: str) -> CostModel | None:
    """The device's cost model the "expected" cost prices masks with (None under other costs)."""
    if cost != "expected":
        return None
    expected_cfg = cfg.search.get("expected")
    if not (expected_cfg and expected_cfg.get("profile")):
        raise ValueError(
            "search.config.cost=expected needs search.expected.profile=PATH (a latency profile of"
            " this device with the target and slim views: viasd-costmodel mode=profile)"
        )
    target = cfg.model_pair.target
    precision = precision_label(target.weights, target.get("activations"))
    return CostModel.fit(load_profile(expected_cfg.profile), target.name, dtype=precision)


def _baselines_and_space(
    cfg: DictConfig, calibrated: CalibratedTarget, budget: Budget, cost: str
) -> tuple[Baselines, list[tuple[str, int]] | None, MaskSpace]:
    """The configured baselines, the candidate blocks (narrowed by sensitivity when asked) and the
    space of masks the search draws from."""
    L, objective = calibrated.num_layers, calibrated.objective
    baselines = Baselines()
    if cfg.search.baselines.sensitivity:
        baselines.sensitivity = sensitivity(objective, L, sub_blocks=budget.unit == "blocks", progress=cfg.progress)
    candidates = _candidates(cfg.search.get("candidates"), baselines, budget.unit, cost)
    space = MaskSpace(L, budget, attention_share(calibrated.loaded.model), calibrated.model_name, candidates)
    greedy_steps = int(cfg.search.baselines.greedy or 0)
    if greedy_steps:
        pool = None if candidates is None else sorted({i for _, i in candidates})
        baselines.greedy = greedy_removal(objective, L, greedy_steps, cost, calibrated.model_name, cfg.progress, pool)
    return baselines, candidates, space


def _provenance(
    cfg: DictConfig,
    calibrated: CalibratedTarget,
    space: MaskSpace,
    result: SearchResult,
    expected: ExpectedCost | None,
    candidates: list[tuple[str, int]] | None,
    seeds: list[tuple[str, RoutingMask]],
    begin: float,
    baseline_seconds: float,
) -> dict:
    """How the mask was found, for the mask file and the report (keys ending in "_text": the report's only)."""
    best, budget, calibration = result.best, space.budget, calibrated.calibration
    evaluation_seconds = sum(t.metrics.seconds for t in _unique(result.trials))
    return {
        "method": "DIMR: random search, then hyperopt TPE",
        "model": calibrated.model_name,
        "precision": calibrated.loaded.spec.precision.label,
        "budget": {"unit": budget.unit, "amount": budget.amount},
        "budget_text": budget.describe(),
        "cost": result.config.cost,
        "expected_cost": None if expected is None else _expected_provenance(expected, best.metrics),
        "kl": round(best.metrics.kl, 5),
        "top1": round(best.metrics.top1, 4),
        "skipped_cost_layers": round(space.cost_of(best.mask), 3),
        "candidates": None if candidates is None else [f"{kind}{i}" for kind, i in candidates],
        "candidates_text": None if candidates is None else _candidates_text(candidates, cfg.search.get("candidates")),
        "calibration": calibration.description | {"scored_positions": calibration.num_scored},
        "calibration_text": f"{calibration.description['split']} split, "
        f"{len(calibration.texts)} texts, {calibration.num_scored} scored positions",
        "trials": {p: len(result.of_phase(p)) for p in ("seed", "random", "tpe")},
        # greedy among them: the found mask cannot be worse than greedy removal on this text
        "seeds": [kind for kind, _ in seeds],
        "trials_text": ", ".join(f"{len(result.of_phase(p))} {p}" for p in ("seed", "random", "tpe")),
        "evaluations": len(_unique(result.trials)),
        # What the trials' masks cost to evaluate (cache hits counted at their original cost),
        # and the wall time of this run (baselines and search; a resumed run counts only itself).
        "search_seconds": round(evaluation_seconds, 1),
        "wall_seconds": round(time.perf_counter() - begin, 1),
        "baseline_seconds": round(baseline_seconds, 1),
        "search_config": OmegaConf.to_container(cfg.search.config, resolve=True),
        "date": datetime.date.today().isoformat(),
        "versions": {p: importlib.metadata.version(p) for p in ("torch", "transformers", "hyperopt")},
        "threads": torch.get_num_threads(),
        "command": " ".join(["viasd-search", *sys.argv[1:]])
        if sys.argv and Path(sys.argv[0]).name in ("viasd-search", "search.py")
        else None,  # console script or -m
    }


def _expected_provenance(expected: ExpectedCost, metrics: MaskMetrics) -> dict:
    return {
        "settled": round(metrics.settled, 4),
        "wrong": round(metrics.wrong, 4),
        "block_cost": round(metrics.block_cost, 4),
        "expected": round(metrics.expected, 4),
        "profile": expected.profile.device,
        "tau_accept": expected.tau_accept,
        "tau_slim": expected.tau_slim,
        "block": expected.block,
        "max_wrong": expected.max_wrong,
        "penalty": expected.penalty,
        "share_prefix": expected.share_prefix,
    }


def _candidates_text(candidates: list[tuple[str, int]], given) -> str:
    return f"{len(candidates)} {'least sensitive' if isinstance(given, int) else 'given'}: " + ", ".join(
        f"{kind[0]}{i}" for kind, i in sorted(candidates, key=lambda b: b[1])
    )


def _baselines_provenance(baselines: Baselines, result: SearchResult) -> dict:
    """Greedy removal's mask of the same size and the median random mask, beside the found one."""
    best, out = result.best, {}
    greedy = baselines.greedy_at(len(best.mask.skip_layers)) if best.mask.is_layer_mask else None
    if greedy is not None:
        out["greedy"] = {
            "skip_layers": list(greedy.mask.skip_layers),
            "kl": round(greedy.metrics.kl, 5),
            "top1": round(greedy.metrics.top1, 4),
        }
    random = result.of_phase("random")
    if random:
        from ..search.report import random_summary

        s = random_summary([t.metrics for t in random])
        out["random_median"] = {
            "count": s["count"],
            "kl": round(s["kl"]["median"], 5),
            "top1": round(s["top1"]["median"], 4),
        }
    return out


def mask_name(cfg: DictConfig) -> str:
    """The routing option the mask is written as: `mask_name`, else <target>-<search.name>."""
    name = str(cfg.mask_name or f"{Path(str(cfg.model_pair.target.name)).name}-{cfg.search.name}")
    return result_option("mask_name", name, "routing", bool(cfg.routing_dir))


def _block(label: str) -> tuple[str, int]:
    """ "layer12" / "attention3" / "mlp7" -> (kind, index), as search.candidates lists them."""
    import re

    match = re.fullmatch(r"(layer|attention|mlp)(\d+)", label)
    if not match:
        raise ValueError(f"candidate block {label!r} is not layer<i>, attention<i> or mlp<i>")
    return match.group(1), int(match.group(2))


def _unique(trials):
    seen, out = set(), []
    for t in trials:
        if t.mask.skips not in seen:
            seen.add(t.mask.skips)
            out.append(t)
    return out


def ranking_cost(cost: str) -> str:
    """What single blocks are ranked by (candidates, the "sensitivity" seed). A mask's expected
    cost is not a sum over its blocks: one late layer alone looks cheapest only because its
    escalations would be short, so under "expected" blocks are ranked by the harm they do (KL)."""
    return "kl" if cost == "expected" else cost


def _candidates(given, baselines: Baselines, unit: str, cost: str) -> list[tuple[str, int]] | None:
    """The blocks the search may skip: `given` explicitly (e.g. [layer6, attention7]), the `given`
    least sensitive ones, or None (every block)."""
    if given is not None and not isinstance(given, int):
        return [_block(str(b)) for b in given]
    if not given:
        return None
    if baselines.sensitivity is None:
        raise ValueError("search.candidates needs search.baselines.sensitivity=true")
    return baselines.sensitivity.least_sensitive(unit, int(given), ranking_cost(cost))


def _known_seeds(kinds: list[str]) -> dict[str, RoutingMask]:
    """The masks of "routing:<name>" seeds: a routing option (the package's or the user config
    directory's, e.g. one a KL search installed) or a YAML path."""
    known = {}
    for kind in kinds:
        if kind.startswith("routing:"):
            known[kind] = named_mask(kind.split(":", 1)[1], f"routing mask for seed {kind!r}")
        elif kind not in ("sensitivity", "greedy"):
            raise ValueError(f"unknown seed {kind!r}: use 'sensitivity', 'greedy' or 'routing:<name>'")
    return known


def _seed_masks(
    kinds: list[str], known: dict[str, RoutingMask], space: MaskSpace, baselines: Baselines, cost: str
) -> list[tuple[str, RoutingMask]]:
    """(kind, mask) of the known masks the search evaluates first: "sensitivity" (the least sensitive
    blocks), "greedy" (greedy removal's mask of the budget, when greedy removal ran that far) and
    "routing:<name>" (`known`: e.g. the mask a KL search found, to compare under another cost)."""
    seeds = []
    for kind in kinds:
        if kind == "sensitivity":
            if baselines.sensitivity is None:
                raise ValueError('seed "sensitivity" needs search.baselines.sensitivity=true')
            scores = {}
            for label, (block, i) in zip(space.labels(), space.blocks):
                table = {
                    "layer": baselines.sensitivity.layer,
                    "attention": baselines.sensitivity.attention,
                    "mlp": baselines.sensitivity.mlp,
                }[block]
                scores[label] = -table[i].cost(ranking_cost(cost))  # the least sensitive blocks score highest
            seeds.append((kind, space.decode(scores)))
        elif kind == "greedy":
            step = baselines.greedy_at(int(space.budget.amount)) if space.budget.unit == "layers" else None
            if step is None:
                logger.info('seed "greedy" skipped: it needs a layer budget and search.baselines.greedy >= the budget')
                continue
            seeds.append((kind, step.mask))
        else:
            mask = known[kind]
            if space.decode(space.encode(mask)).skips != mask.skips:
                raise ValueError(f"seed {kind!r} ({mask.describe()}) does not fit the search's budget and candidates")
            seeds.append((kind, mask))
    return seeds


@entry_point("search")
def main(cfg: DictConfig) -> None:
    logging.getLogger("hyperopt").setLevel(logging.WARNING)  # one INFO line per TPE proposal otherwise
    out = run(cfg)
    print(f"{out.mask.describe()}  kl={out.result.best.metrics.kl:.4f}  top1={out.result.best.metrics.top1:.3f}")
    print(f"mask: {out.mask_path}\nreport: {out.report_path}\ninstalled: {out.installed}")
    print(f"use it: {out.override}  (e.g. viasd-generate verifier=tiered {out.override})")


if __name__ == "__main__":
    main()
