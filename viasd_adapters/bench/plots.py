"""The benchmark's two pictures (matplotlib, Agg backend, no display needed)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

from .report import group, mean, median, pooled_tier_shares, tier_names, values_of  # noqa: E402

TIER_COLORS = {"accept": "#4c9f70", "slim": "#e0a030", "full": "#4a6fa5"}


def _methods(records: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["method"] for r in records))


def _subtitle(records: list[dict]) -> str:
    """Model pair, precision and machine load: what a reader needs to judge the speeds."""
    first = records[0]
    loads = values_of(records, "loadavg_1m_start") + values_of(records, "loadavg_1m_end")
    parts = [first.get("model_pair"), first.get("dtype"), first.get("device")]
    text = ", ".join(str(p) for p in parts if p)
    if loads:
        text += f"; 1-min load {min(loads):.1f}-{max(loads):.1f} on {first.get('cpu_count')} cores"
    return text


def speedup_vs_quality(records: list[dict], path: Path) -> Path:
    """One panel per quality measure: agreement with the baseline on all prompts, then each
    category's task metric; x is the median speedup against the baseline, y the mean quality."""
    baseline = records[0]["baseline"]
    panels = [(f"token match vs {baseline} (all prompts)", records, "token_match_vs_baseline")]
    for (category,), rs in group(records, ("category",)).items():
        metric = next((r["quality_metric"] for r in rs if r["quality_metric"]), None)
        if metric:
            panels.append((f"{metric} ({category})", rs, "quality"))
    methods = _methods(records)
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (title, rs, key) in zip(axes[0], panels):
        for k, method in enumerate(methods):
            mine = [r for r in rs if r["method"] == method]
            x, y = median(values_of(mine, "speedup_vs_baseline")), mean(values_of(mine, key))
            if x is None or y is None:
                continue
            ax.scatter([x], [y], s=60, color=f"C{k}", label=method, zorder=3)
            ax.annotate(method, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=9)
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(f"speedup vs {baseline} (median, measured)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("quality (mean)")
    axes[0][-1].legend(fontsize=8, loc="best")
    fig.suptitle(_subtitle(records), fontsize=9, color="dimgrey")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def tier_shares(records: list[dict], path: Path) -> Path:
    """Stacked bars: for each category, each drafting method's pooled tier shares."""
    tiers = tier_names(records)
    categories = list(dict.fromkeys(r["category"] for r in records))
    methods = [m for m in _methods(records) if any(r["tier_counts"] for r in records if r["method"] == m)]
    fig, ax = plt.subplots(figsize=(max(6.5, 1.3 * len(categories) * max(1, len(methods))), 3.8))
    if not methods:
        ax.text(0.5, 0.5, "no method drafted: no tier decisions", ha="center", va="center")
        ax.set_axis_off()
    else:
        width = 0.8 / len(methods)
        by_group = group(records, ("category", "method"))
        for j, method in enumerate(methods):
            xs = [i + (j - (len(methods) - 1) / 2) * width for i in range(len(categories))]
            bottom = [0.0] * len(categories)
            for t in tiers:
                shares = [pooled_tier_shares(by_group.get((c, method), [])).get(t, 0.0) for c in categories]
                ax.bar(
                    xs, shares, width * 0.95, bottom=bottom, color=TIER_COLORS.get(t),
                    edgecolor="white", label=t if j == 0 else None,
                )
                bottom = [b + s for b, s in zip(bottom, shares)]
            for x in xs:
                ax.text(x, 1.01, method, ha="center", va="bottom", fontsize=8, rotation=90)
        ax.set_xticks(range(len(categories)), categories, fontsize=9)
        ax.set_ylim(0, 1.25)
        ax.set_ylabel("share of decided draft tokens")
        ax.set_title(f"tier shares per task (pooled)\n{_subtitle(records)}", fontsize=9)
        ax.legend(title="tier", fontsize=8, loc="upper right", ncol=len(tiers))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
