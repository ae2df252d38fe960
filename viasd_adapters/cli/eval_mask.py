"""`viasd-eval-mask`: how good is a routing mask on held-out text, and what does it save?

    viasd-eval-mask model_pair=qwen2.5-coder-0.5b-1.5b routing=qwen2.5-coder-1.5b-4l
    viasd-eval-mask model_pair=qwen2.5-coder-0.5b-1.5b routing_file=outputs/search/.../mask.yaml

Reports KL(q || u) and top-1 agreement of the mask on held-out text (prompts the search never
saw) against the median of `num_random` random masks of the same budget and against greedy
layer removal (fitted on the calibration text, like the search), and the measured slim/full
cost ratio of one decode step and one `verify_tokens`-token verify (medians, interleaved).
"""

from __future__ import annotations

import datetime
import json
import logging
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from ..checks import check_config
from ..costs import CostRatio, measure_cost_ratio
from ..models import load_model
from ..routing import RoutingMask, format_layers
from ..search import (
    Budget,
    CalibrationConfig,
    MaskMetrics,
    MaskSpace,
    attention_share,
    greedy_removal,
    prepare_target,
    sensitivity,
)
from . import apply_routing_file, check_prompt_sources, entry_point, set_threads

logger = logging.getLogger(__name__)


@dataclass
class EvalOutput:
    mask: RoutingMask
    found: MaskMetrics  # on held-out text
    random: list[tuple[RoutingMask, MaskMetrics]]  # random masks of the same budget, on held-out text
    greedy: tuple[RoutingMask, MaskMetrics] | None  # greedy removal of the same number of layers
    timing: list[CostRatio] = field(default_factory=list)
    path: Path | None = None  # the JSON summary

    @property
    def random_median(self) -> dict:
        return {
            "kl": statistics.median(m.kl for _, m in self.random),
            "top1": statistics.median(m.top1 for _, m in self.random),
        }


def run(cfg: DictConfig) -> EvalOutput:
    apply_routing_file(cfg)
    check_prompt_sources(cfg.calibration, "calibration")
    if cfg.greedy:
        check_prompt_sources(cfg.greedy_calibration, "greedy_calibration")
    check_config(cfg)
    set_threads(cfg.runtime.threads)
    loaded = load_model(instantiate(cfg.model_pair.target, _convert_="all"))
    mask: RoutingMask = instantiate(cfg.routing, _convert_="all")
    if mask.is_identity:
        raise ValueError("routing mask skips nothing: pick a searched mask, e.g. routing=qwen2.5-coder-1.5b-4l")
    heldout = prepare_target(
        loaded, CalibrationConfig(**OmegaConf.to_container(cfg.calibration, resolve=True)), cfg.cache_dir, cfg.progress
    )
    L = heldout.num_layers
    mask = mask.bind(L, heldout.model_name)
    found = heldout.objective(mask)

    share = attention_share(loaded.model)
    if mask.is_layer_mask:
        budget = Budget("layers", len(mask.skip_layers))
    else:
        budget = Budget("blocks", round(mask.skipped_cost(share), 6))
    space = MaskSpace(L, budget, share, heldout.model_name)
    random = [(m, heldout.objective(m)) for m in space.random_masks(cfg.num_random, cfg.random_seed, [mask])]

    greedy = None
    k = round(mask.skipped_cost(share))
    if cfg.greedy and 1 <= k < L:
        # Fitted on the calibration split, as the search was; scored on the held-out split.
        fit = prepare_target(
            loaded,
            CalibrationConfig(**OmegaConf.to_container(cfg.greedy_calibration, resolve=True)),
            cfg.cache_dir,
            cfg.progress,
        )
        pool = None
        if cfg.get("greedy_candidates"):  # as `viasd-search search.candidates=N`: the N least sensitive layers
            table = sensitivity(fit.objective, L, progress=cfg.progress)
            pool = sorted(i for _, i in table.least_sensitive("layers", int(cfg.greedy_candidates), cfg.greedy_cost))
        step = greedy_removal(fit.objective, L, k, cfg.greedy_cost, heldout.model_name, cfg.progress, pool)[-1]
        greedy = (step.mask, heldout.objective(step.mask))

    timing = []
    if cfg.timing.repetitions:
        ids = torch.tensor(heldout.calibration.texts[0].ids, device=loaded.model.device)
        context = ids.repeat((cfg.timing.context_tokens + len(ids) - 1) // len(ids))[: cfg.timing.context_tokens]
        for tokens in (1, cfg.timing.verify_tokens):
            timing.append(
                measure_cost_ratio(loaded.model, mask, context[None], tokens, cfg.timing.repetitions, cfg.timing.warmup)
            )

    out = EvalOutput(mask, found, random, greedy, timing)
    out.path = _write(cfg, out, heldout)
    return out


def _row(name: str, mask: RoutingMask | str, m: MaskMetrics | dict) -> str:
    kl, top1 = (m["kl"], m["top1"]) if isinstance(m, dict) else (m.kl, m.top1)
    what = mask if isinstance(mask, str) else mask.describe()
    return f"| {name} | {what} | {kl:.4f} | {top1:.3f} |"


def _write(cfg: DictConfig, out: EvalOutput, heldout) -> Path:
    out_dir = Path(cfg.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = [("skip", out.mask.skip_layers), ("attn", out.mask.skip_attention), ("mlp", out.mask.skip_mlp)]
    slug = "-".join(f"{name}-{format_layers(ids).replace(',', '_')}" for name, ids in parts if ids)
    summary = {
        "model": heldout.model_name,
        "precision": heldout.loaded.spec.precision.label,
        "mask": out.mask.to_dict() | {"provenance": None},
        "heldout": heldout.calibration.description | {"scored_positions": heldout.calibration.num_scored},
        "found": out.found.to_dict(),
        "random_median": out.random_median | {"count": len(out.random)},
        "random": [{"skips": [list(s) for s in m.skips], **x.to_dict()} for m, x in out.random],
        "greedy": None
        if out.greedy is None
        else {"skip_layers": list(out.greedy[0].skip_layers), **out.greedy[1].to_dict()},
        "cost_ratio": [t.to_dict() for t in out.timing],
        "threads": torch.get_num_threads(),
        "date": datetime.date.today().isoformat(),
    }
    path = out_dir / f"eval-{slug}.json"
    path.write_text(json.dumps(summary, indent=1))
    lines = [
        f"# {heldout.model_name}: {out.mask.describe()} on held-out text",
        "",
        f"{heldout.calibration.num_scored} scored positions, prompts "
        f"{', '.join(heldout.calibration.description['prompts'])}",
        "",
        "| mask | skipped | KL(q‖u) | top-1 agreement |",
        "|---|---|---|---|",
        _row("**found**", out.mask, out.found),
        _row(f"random, median of {len(out.random)}", "same budget", out.random_median),
    ]
    if out.greedy is not None:
        lines.append(_row("greedy removal", *out.greedy))
        if "greedy" in (out.mask.provenance or {}).get("seeds", []):
            lines += [
                "",
                "Greedy removal's mask was a seed of this mask's search, so the two are not independent: "
                "read no margin over greedy removal into this table.",
            ]
    if out.timing:
        lines += ["", "| forward | context | full ms | slim ms | slim/full (median ratio) |", "|---|---|---|---|---|"]
        for t in out.timing:
            what = "decode step (1 token)" if t.new_tokens == 1 else f"verify ({t.new_tokens} tokens)"
            lines.append(f"| {what} | {t.context} | {t.full_ms:.1f} | {t.slim_ms:.1f} | {t.ratio:.3f} |")
    (out_dir / f"eval-{slug}.md").write_text("\n".join(lines) + "\n")
    if cfg.get("docs_dir"):  # e.g. next to the mask's search report
        docs = Path(cfg.docs_dir).expanduser()
        docs.mkdir(parents=True, exist_ok=True)
        (docs / "heldout.md").write_text("\n".join(lines) + "\n")
    return path


@entry_point("eval_mask")
def main(cfg: DictConfig) -> None:
    out = run(cfg)
    print(out.path.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
