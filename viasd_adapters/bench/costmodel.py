"""The cost model against the benchmark: records' wall time predicted from their forward counts.

Every benchmark record holds, per model, how many forward passes ran, how many tokens they fed
and the variant that ran (`DecodeStats.model_calls`: `calls`, `tokens`, `variant`). A
`CostModel` (`viasd_adapters.costs`: lines fitted on a device's latency profile, or modelled
ratios) prices those counts; `predict_records` sets the prediction beside the measured speed, so
the model states its own error (what it leaves out: drafting's sampling and the verifier's
bookkeeping between forwards). The cost model itself, and what a gain over the host needs
(`costs.breakeven`), live in `viasd_adapters.costs`.
"""

from __future__ import annotations

import functools
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from ..costs import CostModel, LatencyProfile


def record_costs(
    profile: LatencyProfile, target: str, draft: str | None = None, context: int = 256
) -> Callable[[dict], CostModel]:
    """record -> the `CostModel` of the variants it ran: the target's dtype and the drafter's
    variant ("bfloat16+int8-weight" is priced on its own line), at the record's torch threads.
    Models without a `variant` in `model_calls` ran in the run's `dtype` / `draft_dtype`."""

    @functools.cache
    def fitted(dtype: str, draft_dtype: str, threads: int | None) -> CostModel:
        return CostModel.fit(profile, target, draft, dtype, draft_dtype, threads, context)

    def costs(record: dict) -> CostModel:
        calls = record["model_calls"]
        dtype = record["dtype"]
        draft_dtype = calls.get("draft", {}).get("variant") or record.get("draft_dtype") or dtype
        return fitted(dtype, draft_dtype, record.get("threads"))

    return costs


# ---------------------------------------------------------------------- validation


@dataclass
class Prediction:
    """Predicted against measured speed of one method (medians over its records)."""

    method: str
    records: int
    measured_tok_s: float
    predicted_tok_s: float
    error: float  # predicted / measured - 1 (median over records)
    measured_speedup: float | None  # vs the baseline, median of per-record ratios
    predicted_speedup: float | None


def predict_records(
    records: list[dict],
    costs: Callable[[dict], CostModel],
    slim_layers: dict[str, float | str],
    baseline: str = "ar",
    full_layers: dict[str, float] | None = None,
) -> list[Prediction]:
    """Per method: the predicted tokens/s and speedup against `baseline`, beside the measured.

    `costs`: record -> the cost model that prices it (`record_costs`, or one modelled device).
    `slim_layers`: method name -> layers its slim verifier runs, or "draft" when its middle tier is
    the separate draft model (methods without a slim model need no entry). `full_layers`: method
    name -> layers its target forwards run (shared-prefix escalations: L - p); absent: all L. Speedups pair records of the same (task, prompt, rep) as the harness does.
    """
    predicted: dict[int, float] = {}
    for k, r in enumerate(records):
        seconds = costs(r).seconds(
            r["model_calls"], r["prompt_tokens"], slim_layers.get(r["method"]), (full_layers or {}).get(r["method"])
        )
        predicted[k] = r["new_tokens"] / seconds if seconds > 0 else 0.0
    base = {(r.get("task"), r["prompt_id"], r["rep"]): k for k, r in enumerate(records) if r["method"] == baseline}
    out = []
    for method in dict.fromkeys(r["method"] for r in records):
        mine = [k for k, r in enumerate(records) if r["method"] == method]
        errors = [predicted[k] / records[k]["tokens_per_second"] - 1 for k in mine if records[k]["tokens_per_second"]]
        speedups_m, speedups_p = [], []
        for k in mine:
            b = base.get((records[k].get("task"), records[k]["prompt_id"], records[k]["rep"]))
            if b is not None and records[b]["tokens_per_second"] and predicted[b]:
                speedups_m.append(records[k]["tokens_per_second"] / records[b]["tokens_per_second"])
                speedups_p.append(predicted[k] / predicted[b])
        out.append(
            Prediction(
                method,
                len(mine),
                statistics.median(records[k]["tokens_per_second"] for k in mine),
                statistics.median(predicted[k] for k in mine),
                statistics.median(errors) if errors else float("nan"),
                statistics.median(speedups_m) if speedups_m else None,
                statistics.median(speedups_p) if speedups_p else None,
            )
        )
    return out


def validation_table(predictions: list[Prediction], device: str) -> str:
    lines = [
        f"Cost model against measurement on {device} (medians over each method's records).",
        "",
        "| method | n | measured tok/s | predicted tok/s | error | measured speedup vs ar | predicted speedup vs ar |",
        "|---|---|---|---|---|---|---|",
    ]
    fmt = lambda v: "–" if v is None else f"{v:.2f}"
    for p in predictions:
        lines.append(
            f"| {p.method} | {p.records} | {p.measured_tok_s:.2f} | {p.predicted_tok_s:.2f} | "
            f"{100 * p.error:+.0f} % | {fmt(p.measured_speedup)} | {fmt(p.predicted_speedup)} |"
        )
    errors = [abs(p.error) for p in predictions if p.error == p.error]
    speed_errors = [
        abs(p.predicted_speedup / p.measured_speedup - 1)
        for p in predictions
        if p.measured_speedup and p.predicted_speedup
    ]
    if errors:
        lines += [
            "",
            f"Median absolute error: tokens/s {100 * statistics.median(errors):.0f} %"
            + (f", speedup vs ar {100 * statistics.median(speed_errors):.0f} %." if speed_errors else "."),
        ]
    return "\n".join(lines)


def modelled_speedups(
    records: list[dict],
    models: list[CostModel],
    slim_layers: dict[str, float | str],
    baseline: str = "ar",
    full_layers: dict[str, float] | None = None,
) -> dict[str, dict[str, float]]:
    """{model.device: {method: median modelled speedup vs baseline}} from the measured call counts."""
    out = {}
    for model in models:
        assert model.modelled, "modelled_speedups is for modelled cost models; measured ones: predict_records"
        out[model.device] = {
            p.method: p.predicted_speedup
            for p in predict_records(records, lambda _, model=model: model, slim_layers, baseline, full_layers)
        }
    return out
