"""The benchmark's two pictures (matplotlib, Agg backend, no display needed)."""

from __future__ import annotations

from pathlib import Path

from .report import group, mean, median, pooled_tier_shares, tier_names, values_of

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
TIER_COLORS = {"accept": "#4c9f70", "slim": "#e0a030", "full": "#4a6fa5"}


def pyplot():
    """matplotlib.pyplot on the Agg backend, imported only when a picture is drawn: the `bench`
    extra is needed for plots, not to load the commands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (title, rs, key) in zip(axes[0], panels):
        for k, method in enumerate(methods):
            mine = [r for r in rs if r["method"] == method]
            x, y = median(values_of(mine, "speedup_vs_baseline")), mean(values_of(mine, key))
            if x is None or y is None:
                continue
            marker = MARKERS[k % len(MARKERS)]
            ax.scatter([x], [y], s=60, color=f"C{k}", marker=marker, label=method, zorder=3, alpha=0.85)
            if len(methods) <= 3:  # with more, labels collide: the legend names them
                ax.annotate(method, (x, y), textcoords="offset points", xytext=(6, 4), fontsize=9)
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(f"speedup vs {baseline} (median, measured)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("quality (mean)")
    axes[0][-1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.suptitle(_subtitle(records), fontsize=9, color="dimgrey")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def tier_shares(records: list[dict], path: Path) -> Path:
    """One panel per category: each drafting method's pooled tier shares as a stacked bar."""
    tiers = tier_names(records)
    colors = {t: TIER_COLORS.get(t, f"C{4 + k}") for k, t in enumerate(tiers)}
    categories = list(dict.fromkeys(r["category"] for r in records))
    methods = [m for m in _methods(records) if any(r["tier_counts"] for r in records if r["method"] == m)]
    plt = pyplot()
    if not methods:
        fig, ax = plt.subplots(figsize=(6.5, 3.0))
        ax.text(0.5, 0.5, "no method drafted: no tier decisions", ha="center", va="center")
        ax.set_axis_off()
    else:
        width = min(18.0, max(6.5, 1.5 + 0.55 * len(methods) * len(categories)))
        fig, axes = plt.subplots(1, len(categories), figsize=(width, 4.2), sharey=True, squeeze=False)
        by_group = group(records, ("category", "method"))
        for ax, category in zip(axes[0], categories):
            bottom = [0.0] * len(methods)
            for t in tiers:
                shares = [pooled_tier_shares(by_group.get((category, m), [])).get(t, 0.0) for m in methods]
                ax.bar(range(len(methods)), shares, 0.8, bottom=bottom, color=colors[t], edgecolor="white", label=t)
                bottom = [b + v for b, v in zip(bottom, shares)]
            ax.set_xticks(range(len(methods)), methods, rotation=60, ha="right", fontsize=8)
            ax.set_title(category, fontsize=10)
            ax.set_ylim(0, 1.0)
        axes[0][0].set_ylabel("share of decided draft tokens")
        axes[0][-1].legend(title="tier", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.suptitle(f"tier shares per task (pooled); {_subtitle(records)}", fontsize=9, color="dimgrey")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
