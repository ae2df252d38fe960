"""Aggregate benchmark records into the Markdown tables (and their unformatted numbers).

Every figure is recomputed from the JSONL records:

- medians over records (one per method, prompt and repetition) for speed, accepted length,
  rejection rate, forward calls per token, memory and CPU load;
- speedups are medians of per-record ratios, each record divided by the baseline's (or host's)
  record of the same prompt and repetition (paired, so drift between prompts cancels); "at
  equal cores" divides by the record of the baseline's kind run on as many cores (AR at 1 and
  at 2 threads both run when a method uses two cores);
- means for agreement with the baseline and for quality (rates of 0/1 outcomes, BLEU, ROUGE);
- tier shares pool the tier counts of all records (so they sum to 1).
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

TIER_ORDER = ("accept", "slim", "full")  # VIA-SD's three tiers, in decision order
DASH = "–"


@dataclass(frozen=True)
class Column:
    """One table column: how it is labelled, computed from records and printed."""

    header: str
    key: str  # the record field aggregated (or the row field for grouping columns)
    how: str  # "median" | "mean" | "count" | "label" | "tiers" | "quality"
    fmt: str = "{:.2f}"


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


AGGREGATORS: dict[str, Callable[[list[float]], float | None]] = {"median": median, "mean": mean}


def values_of(records: list[dict], key: str) -> list[float]:
    return [r[key] for r in records if r.get(key) is not None]


def tier_names(records: list[dict]) -> list[str]:
    present = {t for r in records for t in r["tier_counts"]}
    return [t for t in TIER_ORDER if t in present] + sorted(present - set(TIER_ORDER))


def pooled_tier_shares(records: list[dict]) -> dict[str, float]:
    counts: Counter = Counter()
    for r in records:
        counts.update(r["tier_counts"])
    total = sum(counts.values())
    return {t: c / total for t, c in counts.items()} if total else {}


def columns(baseline: str, host: str | None, per_category: bool) -> list[Column]:
    cols = [Column("category", "category", "label", "{}")] if per_category else []
    cols += [
        Column("method", "method", "label", "{}"),
        Column("n", "method", "count", "{}"),
        Column("cores", "cores", "median", "{:.0f}"),
        Column("tok/s", "tokens_per_second", "median"),
        Column(f"speedup vs {baseline}", "speedup_vs_baseline", "median"),
        Column("speedup at equal cores", "speedup_same_cores", "median"),
    ]
    if host:
        cols.append(Column(f"speedup vs {host}", "speedup_vs_host", "median"))
    cols += [
        Column("accepted length", "mean_accepted_length", "median"),
        Column("a (per token)", "per_token_acceptance", "median", "{:.3f}"),
        Column("rejection rate", "rejection_rate", "median", "{:.3f}"),
    ]
    if per_category:
        cols += [
            Column(f"token match vs {baseline}", "token_match_vs_baseline", "mean", "{:.3f}"),
            Column(f"exact match vs {baseline}", "exact_match_vs_baseline", "mean", "{:.2f}"),
            Column("quality (mean)", "quality", "quality", "{:.3f}"),
        ]
    else:
        cols += [
            Column("tier shares", "tier_counts", "tiers"),
            Column("full calls/token", "full_calls_per_token", "median", "{:.3f}"),
            Column("slim calls/token", "slim_calls_per_token", "median", "{:.3f}"),
            Column(f"token match vs {baseline}", "token_match_vs_baseline", "mean", "{:.3f}"),
            Column(f"exact match vs {baseline}", "exact_match_vs_baseline", "mean", "{:.2f}"),
            Column("CPU s/token", "cpu_seconds_per_token", "median", "{:.3f}"),
            Column("peak RSS MB", "peak_rss_mb", "median", "{:.0f}"),
            Column("system CPU %", "system_cpu_percent", "median", "{:.0f}"),
        ]
    return cols


def cost_columns() -> list[Column]:
    """Where a generated token's time goes (medians of per-record ms/token)."""
    return [
        Column("method", "method", "label", "{}"),
        Column("cores", "cores", "median", "{:.0f}"),
        Column("equal-cores baseline", "baseline_same_cores", "label", "{}"),
        Column("ms/token", "ms_per_token", "median", "{:.1f}"),
        Column("target ms", "target_ms_per_token", "median", "{:.1f}"),
        Column("draft ms", "draft_ms_per_token", "median", "{:.1f}"),
        Column("slim ms", "slim_ms_per_token", "median", "{:.1f}"),
        Column("overhead ms", "overhead_ms_per_token", "median", "{:.1f}"),
        Column("speedup at equal cores", "speedup_same_cores", "median"),
        Column("bound without overhead", "speedup_bound_no_overhead", "median"),
    ]


def aggregate(records: list[dict], col: Column) -> object:
    """The unformatted value of `col` over a group of records (None when undefined)."""
    if col.how == "label":
        return records[0].get(col.key)  # None (a dash) in records of older runs
    if col.how == "count":
        return len(records)
    if col.how == "tiers":
        return pooled_tier_shares(records)
    if col.how == "quality":
        metrics = {r["quality_metric"] for r in records if r["quality_metric"]}
        assert len(metrics) <= 1, f"one category, one metric: {metrics}"
        value = mean(values_of(records, "quality"))
        return {"metric": metrics.pop(), "value": value} if metrics and value is not None else None
    return AGGREGATORS[col.how](values_of(records, col.key))


def render(value: object, col: Column, tiers: list[str]) -> str:
    if value is None:
        return DASH
    if col.how == "tiers":
        return " / ".join(f"{value.get(t, 0.0):.2f}" for t in tiers) if value else DASH
    if col.how == "quality":
        fmt = "{:.1f}" if value["metric"] == "bleu" else col.fmt
        return f"{value['metric']} {fmt.format(value['value'])}"
    return col.fmt.format(value)


def group(records: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    """Records grouped by `keys`, groups in first-seen order."""
    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    return groups


def summarize(records: list[dict], cols: list[Column], keys: tuple[str, ...]) -> list[dict]:
    """One row of unformatted values per group: {header: value}."""
    return [{c.header: aggregate(rs, c) for c in cols} for rs in group(records, keys).values()]


def markdown_table(records: list[dict], cols: list[Column], keys: tuple[str, ...]) -> str:
    tiers = tier_names(records)
    headers = [f"{c.header} ({'/'.join(tiers)})" if c.how == "tiers" and tiers else c.header for c in cols]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for rs in group(records, keys).values():
        lines.append("| " + " | ".join(render(aggregate(rs, c), c, tiers) for c in cols) + " |")
    return "\n".join(lines)


def load_line(records: list[dict]) -> str:
    """What the machine was doing during the run (from the records' probes)."""
    loads = values_of(records, "loadavg_1m_start") + values_of(records, "loadavg_1m_end")
    system = values_of(records, "system_cpu_percent")
    process = values_of(records, "process_cpu_percent")
    cores = records[0].get("cpu_count")
    threads = sorted({f"{r['method']} {r['threads']}" for r in records if r.get("threads")}, key=str)
    threads_text = f" (torch threads: {', '.join(threads)})" if threads else ""
    return (
        f"CPU during the run: 1-min load average {min(loads):.2f}-{max(loads):.2f} on {cores} cores"
        f"{threads_text}; machine-wide CPU use median {median(system):.0f} %;"
        f" this process median {median(process):.0f} % (100 % = one core)."
    )


def equal_cores_note(records: list[dict]) -> str:
    """Which methods lack a baseline at their core count (their equal-cores column is a dash)."""
    missing = sorted(
        {
            f"{r['method']} ({r['cores']} cores)"
            for r in records
            if r.get("cores") and r.get("baseline_same_cores") is None
        }
    )
    if not missing:
        return ""
    return f"No baseline ran at the cores of {', '.join(missing)}: add one (e.g. method ar-2t) to compare them fairly."


def build_report(records: list[dict], baseline: str, host: str | None, title: str = "") -> tuple[str, dict]:
    """(Markdown text, unformatted summary) of a run's records."""
    if not records:
        raise ValueError("no records to report")
    overall = columns(baseline, host, per_category=False)
    by_category = columns(baseline, host, per_category=True)
    costs = cost_columns()
    prompts = len({(r["category"], r["prompt_id"]) for r in records})
    reps = len({r["rep"] for r in records})
    hardware = records[0].get("hardware")
    text = [
        f"## {title or records[0]['task']}",
        "",
        *([f"Measured on {hardware}.", ""] if hardware else []),
        f"{prompts} prompts x {reps} repetitions per method; max_new_tokens {records[0]['max_new_tokens']}.",
        "",
        "### All prompts",
        "",
        markdown_table(records, overall, ("method",)),
        "",
        "### Per category",
        "",
        markdown_table(records, by_category, ("category", "method")),
        "",
        "### Cost per generated token",
        "",
        markdown_table(records, costs, ("method",)),
        "",
        "Medians over records (one per method, prompt and repetition); speedups are medians of"
        f" ratios to the {baseline} record of the same prompt and repetition (at equal cores: to"
        f" the record of {baseline}'s kind that ran on as many cores); agreement and quality are"
        " means; tier shares pool the draft tokens each tier decided. Cores are torch threads"
        " summed over a method's processes (a draft worker's included); CPU s/token is the CPU"
        " time this process and its children used. Tokens/s is measured wall time of the whole"
        " generation, prefill included. Cost per token splits that wall time into the time inside"
        " each model's forwards and the rest (overhead); the bound is the equal-cores baseline's"
        " ms/token over the forwards' ms/token, the speedup with no overhead at all (for PEARL the"
        " draft worker's forwards overlap the target's, so its parts exceed the whole).",
        "",
        load_line(records),
        "",
    ]
    note = equal_cores_note(records)
    if note:
        text += [note, ""]
    summary = {
        "overall": summarize(records, overall, ("method",)),
        "per_category": summarize(records, by_category, ("category", "method")),
        "cost_per_token": summarize(records, costs, ("method",)),
    }
    return "\n".join(text), summary


def paired_ratios(records: list[dict], method: str, reference: str) -> list[float]:
    """tokens/s of `method` over `reference` per (prompt, repetition) both decoded."""
    ref = {(r["prompt_id"], r["rep"]): r["tokens_per_second"] for r in records if r["method"] == reference}
    return [
        r["tokens_per_second"] / ref[(r["prompt_id"], r["rep"])]
        for r in records
        if r["method"] == method and ref.get((r["prompt_id"], r["rep"]))
    ]


def ablation(
    records: list[dict], reference: str, levers: list[str], combined: str | None = None
) -> tuple[str, list[dict]]:
    """Each lever's gain over `reference` (the method without levers) and its share of the gain.

    Gains are medians of paired ratios; shares split the log-gain, so the levers' shares and the
    interaction (what the combination gains beyond the product of the levers alone) add up to
    the combination's log-gain: share_i = ln g_i / ln g_combined.
    """
    import math

    methods = {r["method"] for r in records}
    missing = [m for m in [reference, *levers, *([combined] if combined else [])] if m not in methods]
    if missing:
        raise ValueError(f"ablation: methods {missing} are not in this run's records: add them to method=[...]")
    rows = []
    total = median(paired_ratios(records, combined, reference)) if combined else None
    log_total = math.log(total) if total and total != 1 else None
    for lever in levers:
        gain = median(paired_ratios(records, lever, reference))
        share = math.log(gain) / log_total if gain and log_total else None
        rows.append({"method": lever, "gain": gain, "share": share})
    if combined:
        alone = sum(math.log(r["gain"]) for r in rows if r["gain"])
        rows.append({"method": f"{combined} (all levers)", "gain": total, "share": 1.0 if log_total else None})
        rows.append(
            {
                "method": "interaction (combined beyond the product of the levers alone)",
                "gain": math.exp(math.log(total) - alone) if total else None,
                "share": (math.log(total) - alone) / log_total if log_total else None,
            }
        )
    fmt = lambda v, f: DASH if v is None else f.format(v)
    lines = [
        f"| lever (method) | speedup vs {reference} | share of the combined gain |",
        "|---|---|---|",
        *(f"| {r['method']} | {fmt(r['gain'], '{:.2f}')} | {fmt(r['share'], '{:.0%}')} |" for r in rows),
    ]
    return "\n".join(lines), rows
