"""Task quality of several benchmark runs on the same prompts, with intervals and paired counts.

Each run is a `viasd-bench` run directory (its records.jsonl), e.g. one per target precision. For
every scored category it gives each run's mean with a 95% interval (Wilson for 0/1 metrics, t for
BLEU / ROUGE), and each run against a reference run on the same prompts: the mean paired
difference with its paired-bootstrap 95% interval and its one-sided 95% bound on the drop (what a
non-inferiority margin is judged against), and, for 0/1 metrics, the prompts only one of them
gets right with McNemar's exact p-value (the paired t test for the others). Token match says how
far the outputs agree. Answers that hit the
token budget are counted, since a cut answer scores what it lacks.

    python -m viasd_adapters.bench.quality int8=RUN_DIR bfloat16=RUN_DIR --reference bfloat16
    python -m viasd_adapters.bench.quality sd-confident=JOB0,JOB1 'via-sd[8l]@0.9/0.9'=JOB0,JOB1 \
        --reference sd-confident --by-method --screen SCREEN_DIR --out OUT   # a powered frontier run
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy import stats

from .metrics import token_agreement

BINARY_METRICS = ("math_accuracy", "pass@1", "answer_match")  # each prompt scores 0 or 1
# The non-inferiority margins, fixed before any powered run (docs/results/frontier.md): the
# largest acceptable drop, in the metric's own units (0/1 metrics and ROUGE-L as fractions, BLEU
# in points), judged against the one-sided 95% bound of the paired drop.
DEFAULT_MARGINS = {"math_accuracy": 0.05, "pass@1": 0.05, "answer_match": 0.05, "rouge_l": 0.02, "bleu": 2.0}


@dataclass
class RunQuality:
    """One run's score on one category."""

    run: str
    category: str
    metric: str
    n: int  # prompts scored
    mean: float
    low: float  # 95% interval
    high: float
    cut: int  # answers that reached the token budget


@dataclass
class PairedQuality:
    """One run against the reference run on the prompts both scored."""

    run: str
    reference: str
    category: str
    metric: str
    n: int
    difference: float  # run mean - reference mean
    low: float  # 95% interval of the paired difference (paired bootstrap)
    high: float
    drop_bound: float  # one-sided 95% upper bound of reference mean - run mean (paired bootstrap)
    margin: float | None  # the largest acceptable drop (None: no margin for this metric)
    only_run: int | None  # prompts only this run got right (0/1 metrics)
    only_reference: int | None
    p_value: float  # McNemar's exact test (0/1 metrics), the paired t test (others)
    token_match: float  # mean over prompts (`metrics.token_agreement`)
    identical: int  # prompts with identical outputs

    @property
    def non_inferior(self) -> bool | None:
        """Whether the drop's one-sided 95% bound is within the margin (None without one)."""
        return None if self.margin is None else self.drop_bound <= self.margin


def load_records(run_dir: str | Path, method: str | None = None) -> dict[tuple[str, str], dict]:
    """The scored records of a run by (category, prompt id): repetition 0 of `method` (None: the
    run's baseline). A run is a viasd-bench run directory (records.jsonl) or a viasd-frontier one
    (records-<task>.jsonl)."""
    run_dir = Path(run_dir)
    paths = (
        [run_dir / "records.jsonl"]
        if (run_dir / "records.jsonl").is_file()
        else sorted(run_dir.glob("records-*.jsonl"))
    )
    if not paths:
        raise ValueError(
            f"{run_dir / 'records.jsonl'} does not exist: give a viasd-bench or viasd-frontier run directory"
        )
    records = [json.loads(line) for path in paths for line in path.read_text().splitlines() if line.strip()]
    path = run_dir
    chosen = {}
    for r in records:
        if r["rep"] == 0 and r["method"] == (method or r["baseline"]) and r.get("quality") is not None:
            chosen[(r["category"], r["prompt_id"])] = r
    if not chosen:
        raise ValueError(f"{path} has no scored record of method {method or 'the baseline'}")
    return chosen


def merge_runs(runs: list[dict[tuple[str, str], dict]]) -> dict[tuple[str, str], dict]:
    """One run from several (`load_records`'), in order: a later run's record of a prompt replaces
    an earlier one's (`paired_quality` refuses pairs decoded with different budgets)."""
    merged: dict[tuple[str, str], dict] = {}
    for records in runs:
        replaced = sorted(k[1] for k in records if k in merged)
        if replaced:
            print(f"replaced by a later run: {len(replaced)} prompts ({', '.join(replaced)})", file=sys.stderr)
        merged.update(records)
    return merged


def _interval(values: list[float], binary: bool) -> tuple[float, float]:
    n = len(values)
    if binary:
        ci = stats.binomtest(int(sum(values)), n).proportion_ci(0.95, method="wilson")
        return ci.low, ci.high
    if n < 2 or len(set(values)) == 1:
        return values[0], values[0]
    ci = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
    return ci.low, ci.high


def paired_bootstrap(
    run: list[float], reference: list[float], confidence: float = 0.95, resamples: int = 10_000, seed: int = 0
) -> tuple[float, float]:
    """The two-sided `confidence` interval of mean(run - reference) over prompts, by the paired
    percentile bootstrap (prompts resampled with both scores), seeded. Its low end at a confidence
    of 0.90 is the one-sided 95% lower bound."""
    differences = np.asarray(run, dtype=float) - np.asarray(reference, dtype=float)
    if len(differences) < 2 or np.all(differences == differences[0]):  # no spread to resample
        return float(differences.mean()), float(differences.mean())
    result = stats.bootstrap(
        (differences,),
        np.mean,
        confidence_level=confidence,
        n_resamples=resamples,
        method="percentile",
        random_state=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def drop_bound(run: list[float], reference: list[float]) -> float:
    """The one-sided 95% upper bound of mean(reference - run), by the paired bootstrap: what a
    non-inferiority margin is judged against."""
    return -paired_bootstrap(run, reference, confidence=0.90)[0]


def noninferiority_power(n: int, spread: float, margin: float, true_drop: float = 0.0) -> float:
    """The chance that `n` paired prompts show non-inferiority at `margin` (one-sided 95% bound
    of the drop below it) when the drop is `true_drop`: the normal approximation, with `spread`
    the standard deviation of one prompt's paired difference. For a 0/1 metric with a share d of
    discordant prompts and no drop, spread = sqrt(d): at d = 0.10 and n = 80 the bound sits at
    1.645 * sqrt(0.10 / 80) = 5.8 points."""
    if n < 1 or spread < 0:
        raise ValueError(f"need n >= 1 prompts and spread >= 0, got n={n}, spread={spread}")
    if spread == 0:
        return float(true_drop < margin)
    z = stats.norm.ppf(0.95)
    return float(stats.norm.cdf((margin - true_drop) / (spread / math.sqrt(n)) - z))


def run_quality(runs: dict[str, dict[tuple[str, str], dict]]) -> list[RunQuality]:
    rows = []
    for name, records in runs.items():
        for category in sorted({c for c, _ in records}):
            group = [r for (c, _), r in records.items() if c == category]
            metric = group[0]["quality_metric"]
            values = [r["quality"] for r in group]
            low, high = _interval(values, metric in BINARY_METRICS)
            cut = sum(r["new_tokens"] >= r["max_new_tokens"] for r in group)
            rows.append(RunQuality(name, category, metric, len(values), sum(values) / len(values), low, high, cut))
    return rows


def paired_quality(
    runs: dict[str, dict[tuple[str, str], dict]], reference: str, margins: dict[str, float] | None = None
) -> list[PairedQuality]:
    """Every run against `reference` per category; `margins` (metric -> largest acceptable drop,
    default `DEFAULT_MARGINS`) sets each row's non-inferiority verdict."""
    margins = DEFAULT_MARGINS if margins is None else margins
    if reference not in runs:
        raise ValueError(f"the reference run {reference!r} is not among the runs {sorted(runs)}")
    base = runs[reference]
    rows = []
    for name, records in runs.items():
        if name == reference:
            continue
        for category in sorted({c for c, _ in records}):
            keys = sorted(k for k in records if k[0] == category and k in base)
            if not keys:
                continue
            if unequal := [k[1] for k in keys if records[k].get("max_new_tokens") != base[k].get("max_new_tokens")]:
                raise ValueError(
                    f"{name} and {reference} decoded prompts {unequal} with different max_new_tokens: rerun "
                    "every point of a prompt with the same budget (a rerun's dir holds all of them)"
                )
            metric = records[keys[0]]["quality_metric"]
            a = [records[k]["quality"] for k in keys]
            b = [base[k]["quality"] for k in keys]
            agreement = [token_agreement(records[k]["output_tokens"], base[k]["output_tokens"]) for k in keys]
            difference = (sum(a) - sum(b)) / len(keys)
            low, high = paired_bootstrap(a, b)
            only_a = only_b = None
            if metric in BINARY_METRICS:
                only_a = sum(x > y for x, y in zip(a, b))
                only_b = sum(y > x for x, y in zip(a, b))
                discordant = only_a + only_b
                p = stats.binomtest(min(only_a, only_b), discordant).pvalue if discordant else 1.0
            else:
                p = 1.0 if a == b else float(stats.ttest_rel(a, b).pvalue)
            rows.append(
                PairedQuality(
                    name,
                    reference,
                    category,
                    metric,
                    len(keys),
                    difference,
                    low,
                    high,
                    drop_bound(a, b),
                    margins.get(metric),
                    only_a,
                    only_b,
                    float(p),
                    sum(m for m, _ in agreement) / len(keys),
                    sum(exact for _, exact in agreement),
                )
            )
    return rows


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else f"{value:.{digits}f}"


def markdown(quality: list[RunQuality], paired: list[PairedQuality]) -> str:
    lines = ["| category | metric | run | n | mean | 95% interval | cut at budget |", "|---|---|---|---|---|---|---|"]
    for q in quality:
        lines.append(
            f"| {q.category} | {q.metric} | {q.run} | {q.n} | {_fmt(q.mean)} | {_fmt(q.low)}-{_fmt(q.high)} | {q.cut} |"
        )
    lines += [
        "",
        "| category | run - reference | n | difference | 95% interval (paired bootstrap) | drop, one-sided 95% bound"
        " | margin | non-inferior | only run / only reference right | p | token match | identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in paired:
        counts = "-" if p.only_run is None else f"{p.only_run} / {p.only_reference}"
        verdict = {None: "-", True: "yes", False: "no"}[p.non_inferior]
        lines.append(
            f"| {p.category} | {p.run} - {p.reference} | {p.n} | {_fmt(p.difference)} | {_fmt(p.low)} to {_fmt(p.high)}"
            f" | {_fmt(p.drop_bound)} | {_fmt(p.margin)} | {verdict} | {counts} | {_fmt(p.p_value, 2)}"
            f" | {_fmt(p.token_match)} | {p.identical} |"
        )
    return "\n".join(lines) + "\n"


def screen_speeds(screen_dir: str | Path, key: str = "speedup_vs_host") -> dict[str, float]:
    """Point name -> its speedup (`key`) in a viasd-frontier run's frontier.json: the screen's
    speeds, measured interleaved, beside the quality of the powered runs (which are not timed)."""
    path = Path(screen_dir) / "frontier.json"
    if not path.is_file():
        raise ValueError(f"{path} does not exist: give the viasd-frontier run directory of the screen")
    return {p["name"]: p[key] for p in json.loads(path.read_text())["points"] if p.get(key) is not None}


def speed_quality_plot(quality: list[RunQuality], speeds: dict[str, float], path: Path, xlabel: str) -> Path:
    """One panel per category: each run's mean task metric with its 95% interval against its
    speed (runs without a speed are left out)."""
    from .plots import pyplot

    categories = list(dict.fromkeys(q.category for q in quality))
    plt = pyplot()
    fig, axes = plt.subplots(1, len(categories), figsize=(4.6 * len(categories), 4.0), squeeze=False)
    for ax, category in zip(axes[0], categories):
        rows = [q for q in quality if q.category == category and q.run in speeds]
        for k, q in enumerate(rows):
            x = speeds[q.run]
            ax.errorbar([x], [q.mean], yerr=[[q.mean - q.low], [q.high - q.mean]], fmt="os^Dv<>P"[k % 8], capsize=3,
                        color=f"C{k}", label=q.run)  # fmt: skip
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{rows[0].metric if rows else ''} ({category}, n = {rows[0].n if rows else 0})", fontsize=9)
        ax.set_xlabel(xlabel)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean, 95% interval")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "runs",
        nargs="+",
        metavar="NAME=RUN_DIR",
        help="runs to compare (several run dirs of one name: join them with ','; a later dir's record of a "
        "prompt replaces an earlier one's, e.g. a rerun of the answers cut at the budget with a larger one)",
    )
    parser.add_argument("--reference", required=True, help="the NAME the others are paired with")
    parser.add_argument("--method", default=None, help="the method of each run to score (default: its baseline)")
    parser.add_argument(
        "--by-method",
        action="store_true",
        help="score in each run the method its NAME names (viasd-frontier points jobs hold several points)",
    )
    parser.add_argument("--out", default=None, help="also write quality.md and quality.json into this directory")
    parser.add_argument(
        "--margin",
        action="append",
        default=[],
        metavar="METRIC=DROP",
        help=f"a non-inferiority margin in the metric's units (default {DEFAULT_MARGINS})",
    )
    parser.add_argument(
        "--screen",
        default=None,
        metavar="FRONTIER_DIR",
        help="a viasd-frontier run of the same points: with --out, plot their speed vs the host against quality",
    )
    args = parser.parse_args(argv)
    if args.by_method and args.method:
        parser.error("--by-method scores each run's NAME: drop --method")
    margins = dict(DEFAULT_MARGINS)
    for spec in args.margin:
        metric, sep, value = spec.partition("=")
        if not sep or metric not in DEFAULT_MARGINS:
            parser.error(f"--margin {spec!r}: write METRIC=DROP with METRIC one of {sorted(DEFAULT_MARGINS)}")
        margins[metric] = float(value)
    runs = {}
    for spec in args.runs:
        name, sep, dirs = spec.partition("=")
        if not sep or not name or not dirs:
            parser.error(f"{spec!r}: write NAME=RUN_DIR")
        runs[name] = merge_runs([load_records(d, name if args.by_method else args.method) for d in dirs.split(",")])
    quality, paired = run_quality(runs), paired_quality(runs, args.reference, margins)
    table = markdown(quality, paired)
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "quality.md").write_text(table)
        if args.screen:
            speeds = screen_speeds(args.screen)
            speed_quality_plot(quality, speeds, out / "speed_quality.png", "speedup vs the host (screen, median)")
        (out / "quality.json").write_text(
            json.dumps(
                {
                    "runs": [asdict(q) for q in quality],
                    "paired": [asdict(p) | {"non_inferior": p.non_inferior} for p in paired],
                    "margins": margins,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
