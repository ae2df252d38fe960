"""The speed-quality frontier: VIA-SD's operating points beside the cascades', from one run.

A sweep (`SweepConfig`) expands into `Point`s, each one benchmark method with its place on a
curve: VIA-SD at every (routing mask, thresholds) pair, random skipping at each mask's budget,
Faster Cascades at every alpha, and the fixed methods (AR, SD, Cascade SD, an independent
intermediate model). `viasd-frontier` runs all points through the benchmark harness, task by
task, interleaved per prompt; this module turns the records into one `PointSummary` per point,
decides which points keep quality (`matches_quality`), and compares VIA-SD with the cascades at
matched quality (`matched_comparison`).

Quality is counted in "points" so that one tolerance fits every metric: BLEU is already 0-100;
ROUGE-L, accuracy and pass@1 (0-1) are scaled by 100.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .plots import pyplot

# Quality metric -> factor that turns it into points (0-100).
POINTS = {"bleu": 1.0, "rouge_l": 100.0, "math_accuracy": 100.0, "pass@1": 100.0}
VIA_SD = "VIA-SD"
FASTER_CASCADES = "Faster Cascades"
CASCADE_SD = "Cascade SD"


@dataclass
class SweepConfig:
    """Which points the frontier runs (method names are files in conf/method/)."""

    references: list[str] = field(
        default_factory=lambda: ["ar", "sd-adaptive-int8"]
    )  # run as they are; the first is the baseline, the second the host
    # VIA-SD and Faster Cascades take their verifier from these methods and their framework (the
    # drafter and decode loop) from the host, so each is measured on the host it claims to beat.
    via_sd: str = "tiered-fast"  # the VIA-SD method every mask and threshold pair is applied to
    masks: list[str] = field(default_factory=list)  # routing configs (conf/routing/<name>.yaml)
    thresholds: list[list[float]] = field(default_factory=list)  # (tau_accept, tau_slim) pairs
    random_thresholds: list[float] | None = None  # random skipping at a mask's budget, at these thresholds
    random_masks: list[str] | None = None  # the masks whose budget random skipping gets; None: every mask
    random_seed: int = 0  # seed of the random masks
    faster_cascade: str = "faster-cascade-fast"  # the method each alpha is applied to
    alphas: list[float] = field(default_factory=list)  # Faster Cascades' deferral parameter
    cascade: str | None = "cascade"  # Cascade SD (lossless; one point)
    intermediate: str | None = "lookup-intermediate"  # the independent middle model (one point)
    extra: list[str] = field(default_factory=list)  # any further methods, one point each
    gated: list[str] = field(default_factory=list)  # VIA-SD points also run with a calibrated block gate

    def __post_init__(self) -> None:
        self.thresholds = [list(t) for t in self.thresholds]
        for pair in self.thresholds + ([list(self.random_thresholds)] if self.random_thresholds else []):
            if len(pair) != 2 or not all(0.0 <= float(t) <= 1.0 for t in pair):
                raise ValueError(f"thresholds are [tau_accept, tau_slim] pairs in [0, 1], got {pair}")
        if self.random_masks is not None and not set(self.random_masks) <= set(self.masks):
            raise ValueError(f"random_masks {self.random_masks} must be among the sweep's masks {self.masks}")
        if self.thresholds and not self.masks:
            raise ValueError("VIA-SD thresholds need at least one routing mask: set sweep.masks")
        if any(a < 0 for a in self.alphas):
            raise ValueError(f"Faster Cascades' alpha must be >= 0, got {self.alphas}")
        if not self.references:
            raise ValueError("the sweep needs a reference method (e.g. ar) to measure speed and agreement against")


@dataclass
class Point:
    """One operating point: a benchmark method and where it sits on its family's curve."""

    name: str  # the method's key in records
    family: str  # the curve it belongs to, e.g. "VIA-SD 8l"
    kind: str  # "via-sd", "random", "faster-cascade", or the method's own name
    param: str | None  # what varies along the curve, as text ("0.5/0.3", "alpha 0.2")
    framework: DictConfig
    verifier: DictConfig
    mask: str | None = None  # routing config name (VIA-SD and random points)
    slim_layers: float | str | None = None  # layers the slim verifier runs; "draft" for a separate model
    full_layers: float | None = None  # layers a target forward runs (L - p when escalations share a prefix); None: all


def _plain(node: DictConfig) -> DictConfig:
    return OmegaConf.create(OmegaConf.to_container(node, resolve=True))


def _method(methods: DictConfig, name: str) -> DictConfig:
    if name not in methods:
        raise ValueError(
            f"method {name!r} is not composed: add it to the frontier config's method list "
            f"(composed: {sorted(methods)})"
        )
    return _plain(methods[name])


def _on_host(sweep: SweepConfig, methods: DictConfig, name: str) -> DictConfig:
    """Method `name`'s verifier on the host's framework (the second reference; its own without one)."""
    method = _method(methods, name)
    if len(sweep.references) > 1:
        method.framework = _method(methods, sweep.references[1]).framework
    return method


def mask_labels(names: list[str]) -> dict[str, str]:
    """Short labels: what follows the '-'-separated prefix all masks share, never less than the
    last part, e.g. ["qwen2.5-coder-1.5b-4l", "qwen2.5-coder-1.5b-13l-cost"] -> "4l", "13l-cost";
    one mask alone keeps its last part ("qwen2.5-coder-1.5b-8l" -> "8l")."""
    parts = [n.split("-") for n in names]
    shared = 0
    while all(len(p) > shared + 1 for p in parts) and len({p[shared] for p in parts}) == 1:
        shared += 1
    return {n: "-".join(p[shared:]) for n, p in zip(names, parts)}


def layers_run(routing: DictConfig, attention_share: float) -> float:
    """Decoder layers a mask's slim verifier runs, sub-blocks counted by their share of a layer."""
    L = int(routing.num_layers)
    skipped = len(routing.skip_layers) + attention_share * len(routing.get("skip_attention", []))
    skipped += (1 - attention_share) * len(routing.get("skip_mlp", []))
    return L - skipped


def build_points(
    sweep: SweepConfig, methods: DictConfig, routing: dict[str, DictConfig], attention_share: float = 0.5
) -> list[Point]:
    """Expand the sweep into points, in run order. `routing`: mask name -> its routing config."""
    points = [
        _point(ref, ref.upper() if ref in ("ar", "sd") else ref, ref, None, _method(methods, ref))
        for ref in sweep.references
    ]
    missing = [m for m in sweep.masks if m not in routing]
    if missing:
        raise ValueError(f"routing masks {missing} are not loaded (files in conf/routing/)")
    labels = mask_labels(sweep.masks)
    for mask in sweep.masks:
        points += _mask_points(sweep, methods, mask, _plain(routing[mask]), labels[mask], attention_share)
    points += _cascade_points(sweep, methods)
    _check_point_names(sweep, points)
    return points


def _point(name, family, kind, param, base, verifier_overrides=None, mask=None, slim_layers=None) -> Point:
    """`base` (a composed method) with `verifier_overrides` merged into its verifier."""
    verifier = OmegaConf.merge(base.verifier, verifier_overrides or {})
    full = None
    if mask is not None and verifier.get("share_prefix"):
        from hydra.utils import instantiate

        bound = instantiate(verifier.slim.mask, _convert_="all")  # random masks are drawn here, as at run time
        p = min(bound.touched_layers) if bound.touched_layers else 0
        full = float(bound.num_layers - p) if p else None
    return Point(name, family, kind, param, base.framework, verifier, mask, slim_layers, full)


def _confidence_policy(tau_accept, tau_slim) -> dict:
    return {
        "_target_": "viasd_adapters.verify.ConfidencePolicy",
        "tau_accept": float(tau_accept),
        "tau_draft": 0.0,
        "tau_slim": float(tau_slim),
    }


def _mask_points(
    sweep: SweepConfig, methods: DictConfig, mask: str, node: DictConfig, label: str, attention_share: float
) -> list[Point]:
    """VIA-SD on one routing mask at every threshold pair, then random skipping at its budget."""
    layers = layers_run(node, attention_share)
    base = _on_host(sweep, methods, sweep.via_sd)
    points = []
    for tau_accept, tau_slim in sweep.thresholds:
        # Replace (not merge) the mask and policy: the base's may carry fields these lack.
        overrides = OmegaConf.create({"slim": {"mask": node}, "policy": _confidence_policy(tau_accept, tau_slim)})
        points.append(
            _point(
                f"via-sd[{label}]@{tau_accept:g}/{tau_slim:g}",
                f"{VIA_SD} {label}",
                "via-sd",
                f"{tau_accept:g}/{tau_slim:g}",
                base,
                overrides,
                mask,
                layers,
            )
        )
    if sweep.random_thresholds and (sweep.random_masks is None or mask in sweep.random_masks):
        tau_accept, tau_slim = sweep.random_thresholds
        random_mask = OmegaConf.merge(
            node, {"_target_": "viasd_adapters.routing.RoutingMask.random_like", "seed": sweep.random_seed}
        )
        points.append(
            _point(
                f"random[{label}]@{tau_accept:g}/{tau_slim:g}",
                "random skipping",
                "random",
                label,
                base,
                {"slim": {"mask": random_mask}, "policy": _confidence_policy(tau_accept, tau_slim)},
                mask,
                layers,
            )
        )
    return points


def _cascade_points(sweep: SweepConfig, methods: DictConfig) -> list[Point]:
    """Faster Cascades at every alpha, Cascade SD, the independent middle model and the extra methods."""
    points = [
        _point(
            f"faster-cascade@{alpha:g}",
            FASTER_CASCADES,
            "faster-cascade",
            f"alpha {alpha:g}",
            _on_host(sweep, methods, sweep.faster_cascade),
            {"alpha": float(alpha)},
        )
        for alpha in sweep.alphas
    ]
    if sweep.cascade:
        points.append(_point(sweep.cascade, CASCADE_SD, "cascade", None, _method(methods, sweep.cascade)))
    if sweep.intermediate:
        points.append(
            _point(
                sweep.intermediate,
                "independent 0.5B middle model",
                "intermediate",
                None,
                _method(methods, sweep.intermediate),
                slim_layers="draft",
            )
        )
    points += [_point(name, name, name, None, _method(methods, name)) for name in sweep.extra]
    return points


def _check_point_names(sweep: SweepConfig, points: list[Point]) -> None:
    names = [p.name for p in points]
    unknown = [g for g in sweep.gated if g not in names or not g.startswith("via-sd")]
    if unknown:
        raise ValueError(f"sweep.gated names {unknown}, which are not VIA-SD points of this sweep ({names})")
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ValueError(f"the sweep lists points {dupes} twice: drop the duplicate thresholds, alphas or methods")


def gated_point(point: Point, min_confidence: float) -> Point:
    """`point` with a `DraftConfidenceGate` of the given (calibrated) threshold in its verifier."""
    gate = {"_target_": "viasd_adapters.verify.gate.DraftConfidenceGate", "min_confidence": float(min_confidence)}
    verifier = OmegaConf.merge(point.verifier, {"gate": gate})
    return Point(
        f"{point.name}+gate",
        f"{point.family} + gate",
        "via-sd",
        f"{point.param}+gate",
        point.framework,
        verifier,
        point.mask,
        point.slim_layers,
        point.full_layers,
    )


# ---------------------------------------------------------------------- summaries


@dataclass
class PointSummary:
    """Everything the frontier reports about one point, pooled over its records (all tasks)."""

    name: str
    family: str
    kind: str
    param: str | None
    records: int
    rejection_rate: float | None  # pooled: 1 - accepted / drafted
    tokens_per_round: float  # pooled: new tokens / verification rounds
    full_per_token: float  # pooled target forwards per generated token
    slim_per_token: float  # pooled slim forwards per generated token
    slim_cost: float | None  # measured ms of a slim forward / a full forward of the same block size
    speedup_vs_ar: float | None  # median of per-record ratios (same prompt and repetition)
    speedup_vs_host: float | None
    agreement: float  # mean token match with the baseline (AR: the target's greedy output)
    exact: float  # share of generations identical to the baseline's
    quality: dict[str, float] = field(default_factory=dict)  # metric -> mean over its scorable records
    quality_n: dict[str, int] = field(default_factory=dict)  # metric -> records scored
    tier_shares: dict[str, float] = field(default_factory=dict)  # pooled share of draft tokens per tier
    settled_share: float | None = (
        None  # pooled: rounds the slim tier settled / rounds (None: records without the count)
    )

    def to_dict(self) -> dict:
        return asdict(self)


def _median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def summarize(
    records: list[dict],
    points: list[Point],
    slim_costs: dict[str, float] | None = None,
    full: str = "target",
    slim: str = "slim",
) -> list[PointSummary]:
    """One summary per point that has records, in the points' order."""
    by_method: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_method[r["method"]].append(r)
    out = []
    for point in points:
        rs = by_method.get(point.name, [])
        if not rs:
            continue
        drafted = sum(r["drafted"] for r in rs)
        accepted = sum(r["accepted"] for r in rs)
        tokens = sum(r["new_tokens"] for r in rs)
        steps = sum(r["steps"] for r in rs)
        calls = lambda key, rs=rs: sum(r["model_calls"].get(key, {}).get("calls", 0) for r in rs)
        quality: dict[str, list[float]] = defaultdict(list)
        for r in rs:
            if r.get("quality_metric") and r.get("quality") is not None:
                quality[r["quality_metric"]].append(float(r["quality"]))
        tiers: dict[str, int] = defaultdict(int)
        for r in rs:
            for t, c in r["tier_counts"].items():
                tiers[t] += c
        decided = sum(tiers.values())
        out.append(
            PointSummary(
                name=point.name,
                family=point.family,
                kind=point.kind,
                param=point.param,
                records=len(rs),
                rejection_rate=1 - accepted / drafted if drafted else None,
                tokens_per_round=tokens / steps if steps else 0.0,
                full_per_token=calls(full) / tokens if tokens else 0.0,
                slim_per_token=calls(slim) / tokens if tokens else 0.0,
                settled_share=(
                    sum(r["settled_blocks"] for r in rs) / steps
                    if steps and all("settled_blocks" in r for r in rs)
                    else None
                ),
                slim_cost=(slim_costs or {}).get(point.mask) if point.mask else None,
                speedup_vs_ar=_median([r.get("speedup_vs_baseline") for r in rs]),
                speedup_vs_host=_median([r.get("speedup_vs_host") for r in rs]),
                agreement=statistics.fmean(r["token_match_vs_baseline"] for r in rs),
                exact=statistics.fmean(r["exact_match_vs_baseline"] for r in rs),
                quality={m: statistics.fmean(v) for m, v in quality.items()},
                quality_n={m: len(v) for m, v in quality.items()},
                tier_shares={t: c / decided for t, c in tiers.items()} if decided else {},
            )
        )
    return out


def quality_gaps(point: PointSummary, reference: PointSummary) -> dict[str, float]:
    """metric -> (point - reference) in points (positive: better than the reference)."""
    return {
        m: POINTS.get(m, 100.0) * (v - reference.quality[m]) for m, v in point.quality.items() if m in reference.quality
    }


def matches_quality(
    point: PointSummary, reference: PointSummary, min_agreement: float = 0.98, tolerance: float = 1.0
) -> bool:
    """Agreement >= `min_agreement` and no task metric more than `tolerance` points below the reference."""
    if point.agreement < min_agreement:
        return False
    return all(gap >= -tolerance for gap in quality_gaps(point, reference).values())


@dataclass
class Comparison:
    """VIA-SD's best matched point against one rival family's best matched point."""

    rival: str  # family name
    via_sd: PointSummary | None  # fastest VIA-SD point that matches quality (None: none does)
    other: PointSummary | None  # fastest matched point of the rival (None: none does)
    rejection_diff: float | None  # VIA-SD minus rival (negative: VIA-SD rejects less)
    speed_diff: float | None  # VIA-SD minus rival, speedup vs AR


def _fastest(points: list[PointSummary]) -> PointSummary | None:
    scored = [p for p in points if p.speedup_vs_ar is not None]
    return max(scored, key=lambda p: p.speedup_vs_ar) if scored else None


def matched_comparison(
    summaries: list[PointSummary],
    baseline: str = "ar",
    min_agreement: float = 0.98,
    tolerance: float = 1.0,
    rivals: tuple[str, ...] = (FASTER_CASCADES, CASCADE_SD, "SD"),
) -> list[Comparison]:
    """For each rival family: VIA-SD's fastest matched point minus the rival's fastest matched point."""
    by_name = {s.name: s for s in summaries}
    if baseline not in by_name:
        raise ValueError(f"the baseline {baseline!r} has no records")
    ref = by_name[baseline]
    matched = [s for s in summaries if matches_quality(s, ref, min_agreement, tolerance)]
    via = _fastest([s for s in matched if s.kind == "via-sd"])
    out = []
    for rival in rivals:
        other = _fastest([s for s in matched if s.family == rival])
        both = via is not None and other is not None
        rej = (
            via.rejection_rate - other.rejection_rate
            if both and via.rejection_rate is not None and other.rejection_rate is not None
            else None
        )
        speed = via.speedup_vs_ar - other.speedup_vs_ar if both else None
        out.append(Comparison(rival, via, other, rej, speed))
    return out


# ---------------------------------------------------------------------- tables


def _f(value, fmt="{:.2f}") -> str:
    return "–" if value is None else fmt.format(value)


def points_table(
    summaries: list[PointSummary], baseline: str = "ar", min_agreement: float = 0.98, tolerance: float = 1.0
) -> str:
    """Every point: cost counters, measured speed, quality (points vs the baseline), matched or not."""
    ref = next(s for s in summaries if s.name == baseline)
    metrics = sorted({m for s in summaries for m in s.quality})
    head = [
        "point",
        "family",
        "rejection rate",
        "tokens/round",
        "full fwd/token",
        "slim fwd/token",
        "settled share",
        "slim cost (x full)",
        "speedup vs ar",
        "speedup vs host",
        "agreement",
        "exact",
    ]
    head += [f"{m} (n)" for m in metrics] + ["matched"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in summaries:
        row = [
            s.name,
            s.family,
            _f(s.rejection_rate, "{:.3f}"),
            _f(s.tokens_per_round),
            _f(s.full_per_token, "{:.3f}"),
            _f(s.slim_per_token, "{:.3f}"),
            _f(s.settled_share, "{:.3f}"),
            _f(s.slim_cost),
            _f(s.speedup_vs_ar),
            _f(s.speedup_vs_host),
            _f(s.agreement, "{:.3f}"),
            _f(s.exact),
        ]
        for m in metrics:
            value = s.quality.get(m)
            row.append("–" if value is None else f"{POINTS.get(m, 100.0) * value:.1f} ({s.quality_n[m]})")
        row.append("yes" if matches_quality(s, ref, min_agreement, tolerance) else "no")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def comparison_table(comparisons: list[Comparison]) -> str:
    head = ["rival", "VIA-SD point", "rival point", "rejection: VIA-SD - rival", "speedup vs ar: VIA-SD - rival"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in comparisons:
        via = (
            f"{c.via_sd.name} (rej {_f(c.via_sd.rejection_rate, '{:.3f}')}, {_f(c.via_sd.speedup_vs_ar)}x, "
            f"agreement {c.via_sd.agreement:.3f})"
            if c.via_sd
            else "none matches quality"
        )
        other = (
            f"{c.other.name} (rej {_f(c.other.rejection_rate, '{:.3f}')}, {_f(c.other.speedup_vs_ar)}x, "
            f"agreement {c.other.agreement:.3f})"
            if c.other
            else "none matches quality"
        )
        lines.append(
            f"| {c.rival} | {via} | {other} | {_f(c.rejection_diff, '{:+.3f}')} | {_f(c.speed_diff, '{:+.2f}')} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------- plots


def _curves(summaries: list[PointSummary]) -> dict[str, list[PointSummary]]:
    curves: dict[str, list[PointSummary]] = defaultdict(list)
    for s in summaries:
        curves[s.family].append(s)
    return curves


def worst_gap(point: PointSummary, reference: PointSummary) -> float | None:
    """The point's largest quality loss against the reference over its task metrics, in points (<= 0 is a loss)."""
    gaps = quality_gaps(point, reference)
    return min(gaps.values()) if gaps else None


def frontier_plots(
    summaries: list[PointSummary], out_dir: Path, subtitle: str = "", baseline: str = "ar"
) -> list[Path]:
    """speed_quality.png (speedup vs AR) and rejection_quality.png (rejection rate), each against two
    quality measures: token agreement with AR, and the worst task-metric gap to AR in points.
    One curve per family, its points joined in sweep order and labelled with their parameter."""
    plt = pyplot()

    ref = next((s for s in summaries if s.name == baseline), None)
    quality = [("token agreement with AR (mean)", lambda p: p.agreement)]
    if ref is not None and ref.quality:
        quality.append(("worst task-metric gap to AR (points)", lambda p: worst_gap(p, ref)))
    paths = []
    for x_key, x_label, file in (
        ("speedup_vs_ar", "speedup vs AR (median, measured)", "speed_quality.png"),
        ("rejection_rate", "rejection rate (pooled)", "rejection_quality.png"),
    ):
        fig, axes = plt.subplots(1, len(quality), figsize=(6.0 * len(quality) + 2.0, 4.8), squeeze=False)
        for ax, (y_label, y_of) in zip(axes[0], quality):
            for k, (family, pts) in enumerate(_curves(summaries).items()):
                pts = [p for p in pts if getattr(p, x_key) is not None and y_of(p) is not None]
                if not pts:
                    continue
                xs, ys = [getattr(p, x_key) for p in pts], [y_of(p) for p in pts]
                # 20 distinct colours (tab20's ten dark hues, then their light twins) and a marker
                # cycle of another length: a sweep of 15+ families stays legible.
                ax.plot(
                    xs,
                    ys,
                    marker="os^Dv<>P*Xhd"[k % 12],
                    ls="-" if len(pts) > 1 else "none",
                    color=plt.cm.tab20((2 * k) % 20 + (k // 10) % 2),
                    label=family,
                    alpha=0.85,
                )
                for p, x, y in zip(pts, xs, ys):
                    if p.param:
                        ax.annotate(p.param, (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
            if x_key == "speedup_vs_ar":
                ax.axvline(1.0, color="grey", lw=0.8, ls="--")
            ax.axhline(0.98 if y_label.startswith("token") else -1.0, color="grey", lw=0.8, ls=":")
            ax.set_xlabel(x_label)
            ax.set_ylabel(y_label)
            ax.grid(alpha=0.3)
        axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        if subtitle:
            fig.suptitle(subtitle, fontsize=8, color="dimgrey")
        fig.tight_layout()
        path = out_dir / file
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths
