"""Aggregation and rendering of hand-made records."""

import math

import pytest

from viasd_adapters.bench.report import ablation, build_report, pooled_tier_shares, tier_names


def record(method, prompt_id, rep, tps, tiers, quality=None, metric=None, category="c", cores=1, same=None):
    return {
        "cores": cores,
        "threads": cores,
        "speedup_same_cores": tps / 2.0 if same else None,
        "baseline_same_cores": same,
        "cpu_seconds_per_token": 0.5,
        "ms_per_token": 1000 / tps,
        "target_ms_per_token": 100.0,
        "draft_ms_per_token": 50.0,
        "slim_ms_per_token": 0.0,
        "overhead_ms_per_token": 1000 / tps - 150.0,
        "speedup_bound_no_overhead": 500 / 150.0 if same else None,
        "task": "t",
        "category": category,
        "prompt_id": prompt_id,
        "rep": rep,
        "method": method,
        "max_new_tokens": 8,
        "tokens_per_second": tps,
        "speedup_vs_baseline": tps / 2.0,
        "speedup_vs_host": None,
        "mean_accepted_length": 2.0,
        "per_token_acceptance": 0.8,
        "rejection_rate": 0.25,
        "tier_counts": tiers,
        "full_calls_per_token": 0.5,
        "slim_calls_per_token": 0.25,
        "token_match_vs_baseline": 1.0,
        "exact_match_vs_baseline": 1.0,
        "peak_rss_mb": 100.0,
        "system_cpu_percent": 50.0,
        "process_cpu_percent": 90.0,
        "loadavg_1m_start": 1.0,
        "loadavg_1m_end": 1.5,
        "cpu_count": 2,
        "quality": quality,
        "quality_metric": metric,
    }


def test_tier_shares_pool_counts_in_decision_order():
    records = [record("v", 1, 0, 1.0, {"full": 2, "accept": 6}), record("v", 2, 0, 1.0, {"slim": 2})]
    assert tier_names(records) == ["accept", "slim", "full"]
    assert pooled_tier_shares(records) == pytest.approx({"accept": 0.6, "slim": 0.2, "full": 0.2})


def test_report_medians_means_and_dashes():
    records = [
        record("ar", 1, 0, 2.0, {}, 10.0, "bleu", same="ar"),
        record("v", 1, 0, 3.0, {"accept": 3, "full": 1}, 20.0, "bleu", same="ar"),
        record("v", 2, 0, 5.0, {"accept": 1, "slim": 1, "full": 2}, 30.0, "bleu", same="ar"),
        record("v", 3, 0, 10.0, {"full": 4}, 41.0, "bleu", same="ar"),
        record("w", 1, 0, 4.0, {"full": 4}, 41.0, "bleu", cores=2),  # no baseline at 2 cores
    ]
    text, summary = build_report(records, baseline="ar", host=None)
    overall = {row["method"]: row for row in summary["overall"]}
    assert overall["v"]["tok/s"] == 5.0 and overall["v"]["speedup vs ar"] == 2.5
    assert overall["v"]["speedup at equal cores"] == 2.5 and overall["w"]["speedup at equal cores"] is None
    assert overall["ar"]["tier shares"] == {}
    assert "| v | 3 | 1 | 5.00 | 2.50 | 2.50 | 2.00 | 0.800 | 0.250 | 0.33 / 0.08 / 0.58 |" in text
    assert "| w | 1 | 2 | 4.00 | 2.00 | – |" in text
    assert "tier shares (accept/slim/full)" in text and "speedup vs sd" not in text
    assert "| c | v | 3 | 1 | 5.00 | 2.50 | 2.50 | 2.00 | 0.800 | 0.250 | 1.000 | 1.00 | bleu 30.3 |" in text
    assert "1-min load average 1.00-1.50 on 2 cores" in text
    costs = {row["method"]: row for row in summary["cost_per_token"]}
    assert costs["v"]["ms/token"] == 200.0 and costs["v"]["overhead ms"] == 50.0
    assert costs["v"]["bound without overhead"] == pytest.approx(500 / 150)
    assert "No baseline ran at the cores of w (2 cores)" in text
    with pytest.raises(ValueError, match="no records"):
        build_report([], "ar", None)


def test_ablation_gains_and_log_shares():
    records = []
    for pid in (1, 2, 3):
        records += [
            record("sd", pid, 0, 2.0, {}),
            record("a", pid, 0, 2.4, {}),
            record("b", pid, 0, 3.0, {}),
            record("ab", pid, 0, 3.3, {}),
        ]
    text, rows = ablation(records, "sd", ["a", "b"], "ab")
    by = {r["method"]: r for r in rows}
    assert by["a"]["gain"] == pytest.approx(1.2) and by["b"]["gain"] == pytest.approx(1.5)
    assert by["a"]["share"] == pytest.approx(math.log(1.2) / math.log(1.65))
    inter = rows[-1]
    assert inter["gain"] == pytest.approx(1.65 / 1.8)  # less than the product of the levers alone
    assert by["a"]["share"] + by["b"]["share"] + inter["share"] == pytest.approx(1.0)
    assert "| a | 1.20 | 36% |" in text
    with pytest.raises(ValueError, match=r"methods \['c'\] are not in this run"):
        ablation(records, "sd", ["c"])
