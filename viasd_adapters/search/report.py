"""The search report: found mask vs random masks of the same budget and greedy removal, the
per-layer sensitivity table, and the best cost per trial (plot)."""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass
from pathlib import Path

from ..bench.plots import pyplot
from ..routing import RoutingMask, format_layers
from .dimr import PHASES, SearchResult
from .greedy import GreedyStep, Sensitivity
from .objective import MaskMetrics


@dataclass
class Baselines:
    """What the found mask is compared with (each may be missing)."""

    sensitivity: Sensitivity | None = None
    greedy: list[GreedyStep] | None = None  # the greedy path, at least as long as the budget when present

    def greedy_at(self, num_layers_skipped: int) -> GreedyStep | None:
        if self.greedy and len(self.greedy) >= num_layers_skipped:
            return self.greedy[num_layers_skipped - 1]
        return None


def random_summary(metrics: list[MaskMetrics]) -> dict:
    kls, top1s = [m.kl for m in metrics], [m.top1 for m in metrics]
    return {
        "count": len(metrics),
        "kl": {"median": statistics.median(kls), "best": min(kls), "worst": max(kls)},
        "top1": {"median": statistics.median(top1s), "best": max(top1s), "worst": min(top1s)},
    }


def plot_best_cost(result: SearchResult, path: Path, title: str, greedy: MaskMetrics | None = None) -> Path:
    plt = pyplot()

    cost = result.config.cost
    fig, ax = plt.subplots(figsize=(7, 4))
    colours = {"seed": "tab:green", "random": "tab:gray", "tpe": "tab:blue"}
    for phase in PHASES:
        trials = result.of_phase(phase)
        if trials:
            ax.scatter(
                [t.number for t in trials],
                [t.loss for t in trials],
                s=12,
                alpha=0.6,
                color=colours[phase],
                label=f"{phase} trial",
            )
    ax.plot(range(len(result.trials)), result.best_so_far(), color="tab:red", label="best so far")
    random = result.of_phase("random")
    if random:
        ax.axhline(statistics.median(t.loss for t in random), color="tab:gray", ls=":", label="median random mask")
    if greedy is not None:
        ax.axhline(greedy.cost(cost), color="tab:orange", ls="--", label="greedy removal")
    ax.set_yscale("log")
    ax.set_xlabel("trial")
    ax.set_ylabel({"kl": "KL(q || u), nats", "disagreement": "1 - top-1 agreement"}.get(cost, cost))
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(m: MaskMetrics | None) -> str:
    return f"{m.kl:.4f} | {m.top1:.3f}" if m is not None else "- | -"


def write_report(
    out_dir: Path, mask: RoutingMask, result: SearchResult, baselines: Baselines, provenance: dict
) -> Path:
    """report.md, best_cost.png and trials.jsonl in `out_dir`; returns the report's path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    best = result.best
    greedy = baselines.greedy_at(len(mask.skip_layers)) if mask.is_layer_mask else None
    title = f"DIMR on {provenance.get('model')}: {provenance['budget_text']}"
    plot_best_cost(result, out_dir / "best_cost.png", title, greedy.metrics if greedy else None)
    _write_trials(result, out_dir / "trials.jsonl")

    lines = [f"# {title}", ""]
    lines += _provenance_table(provenance)
    lines += _comparison(mask, result, greedy, provenance)
    lines += [
        "",
        f"Best found at trial {best.number} ({best.phase} phase) of {len(result.trials)}.",
        "",
        "## Best cost per trial",
        "",
        "![best cost per trial](best_cost.png)",
        "",
    ]
    if baselines.sensitivity is not None:
        lines += _sensitivity_table(mask, baselines)
    if baselines.greedy:
        lines += _greedy_path(baselines.greedy)
    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def _write_trials(result: SearchResult, path: Path) -> None:
    with open(path, "w") as f:
        for t in result.trials:
            f.write(
                json.dumps(
                    {
                        "number": t.number,
                        "phase": t.phase,
                        "skips": [list(s) for s in t.mask.skips],
                        "loss": t.loss,
                        **t.metrics.to_dict(),
                    }
                )
                + "\n"
            )


def _provenance_table(provenance: dict) -> list[str]:
    lines = ["| | |", "|---|---|"]
    for key in (
        "model",
        "precision",
        "dtype",  # masks searched before precision had two settings
        "budget_text",
        "cost",
        "calibration_text",
        "candidates_text",
        "trials_text",
        "evaluations",
        "search_seconds",
        "wall_seconds",
        "date",
        "command",
    ):
        if provenance.get(key) is not None:
            lines.append(f"| {key.replace('_text', '')} | {provenance[key]} |")
    return lines


def _comparison(mask: RoutingMask, result: SearchResult, greedy: GreedyStep | None, provenance: dict) -> list[str]:
    """The found mask against greedy removal, the random trials and the seeds."""
    best = result.best
    lines = [
        "",
        "## Found mask vs baselines (calibration text)",
        "",
        "| mask | skipped | KL(q‖u) | top-1 agreement |",
        "|---|---|---|---|",
        f"| **found (DIMR)** | {mask.describe()} | {_fmt(best.metrics)} |",
    ]
    if greedy is not None:
        seeded = "greedy" in (provenance.get("seeds") or [])
        name = "greedy removal (a seed: the search cannot do worse here)" if seeded else "greedy removal"
        lines.append(f"| {name} | {greedy.mask.describe()} | {_fmt(greedy.metrics)} |")
    random = [t.metrics for t in result.of_phase("random")]
    if random:
        s = random_summary(random)
        among = "same budget" + (", among the candidates" if provenance.get("candidates") else "")
        lines.append(
            f"| random masks, median of {s['count']} | {among} | {s['kl']['median']:.4f} | {s['top1']['median']:.3f} |"
        )
        lines.append(
            f"| random masks, best of {s['count']} | {among} | {s['kl']['best']:.4f} | {s['top1']['best']:.3f} |"
        )
        beaten = sum(m.cost(result.config.cost) > best.loss for m in random)
        lines += [
            "",
            f"The found mask beats {beaten} of {len(random)} random search trials. Random masks over all "
            "layers, on held-out text: `viasd-eval-mask`.",
        ]
    seeds = result.of_phase("seed")
    if best.metrics.block_cost is not None:
        lines += _expected_cost_table(best, seeds, random)
    if seeds:
        lines += [
            "",
            "Seed masks (evaluated first): "
            + "; ".join(f"{t.mask.describe()} ({result.config.cost} {t.loss:.4f})" for t in seeds),
        ]
    return lines


def _sensitivity_table(mask: RoutingMask, baselines: Baselines) -> list[str]:
    """One row per layer: each block skipped alone, whether the found mask skips it, and the
    greedy step that removed it."""
    sens = baselines.sensitivity
    order = {}
    if baselines.greedy:
        order = {_last_added(baselines.greedy, j): j + 1 for j in range(len(baselines.greedy))}
    head = "| layer | skip layer: KL | top-1 |"
    rule = "|---|---|---|"
    if sens.attention is not None:
        head += " skip attention: KL | top-1 | skip MLP: KL | top-1 |"
        rule += "---|---|---|---|"
    head += " in found mask | greedy step |"
    rule += "---|---|"
    lines = [
        "## Per-layer sensitivity",
        "",
        "Each row skips one block alone (calibration text); lower KL = safer to skip.",
        "",
        head,
        rule,
    ]
    for i, m in enumerate(sens.layer):
        row = f"| {i} | {_fmt(m)} |"
        if sens.attention is not None:
            row += f" {_fmt(sens.attention[i])} | {_fmt(sens.mlp[i])} |"
        found = (
            "layer"
            if i in mask.skip_layers
            else ("attention" if i in mask.skip_attention else ("mlp" if i in mask.skip_mlp else ""))
        )
        row += f" {found} | {order.get(i, '')} |"
        lines.append(row)
    lines.append("")
    return lines


def _greedy_path(path: list[GreedyStep]) -> list[str]:
    lines = ["## Greedy removal path", "", "| step | layers removed | KL(q‖u) | top-1 |", "|---|---|---|---|"]
    for j, step in enumerate(path):
        lines.append(f"| {j + 1} | {format_layers(step.mask.skip_layers)} | {_fmt(step.metrics)} |")
    lines.append("")
    return lines


def _expected_cost_table(best, seeds, random: list[MaskMetrics]) -> list[str]:
    """What the masks cost VIA-SD per verify block, in full forwards (search.config.cost=expected)."""

    def row(name, mask, m):
        return f"| {name} | {mask} | {m.settled:.3f} | {m.wrong:.3f} | {m.block_cost:.3f} | {m.expected:.3f} |"

    lines = [
        "",
        "Expected verify cost per block, in full forwards (plain SD pays 1.000; `settled`: share of blocks"
        " the slim tier settles when the target's own tokens stand in for the draft):",
        "",
        "| mask | skipped | settled | wrong | block cost | expected |",
        "|---|---|---|---|---|---|",
        row("**found (DIMR)**", best.mask.describe(), best.metrics),
    ]
    lines += [row("seed", t.mask.describe(), t.metrics) for t in seeds]
    if random:
        cheapest = min(random, key=lambda m: m.expected)
        lines.append(row(f"random masks, best of {len(random)}", "same budget", cheapest))
    return lines


def _last_added(path: list[GreedyStep], j: int) -> int:
    before = set(path[j - 1].mask.skip_layers) if j else set()
    (added,) = set(path[j].mask.skip_layers) - before
    return added
