"""The cost model against benchmark records: predictions, and the variant each record ran."""

import pytest

from viasd_adapters.bench.costmodel import (
    modelled_speedups,
    predict_records,
    record_costs,
    validation_table,
)
from viasd_adapters.costs import CostModel, LatencyEntry, LatencyProfile, Line


def _costs() -> CostModel:
    # target: 10 + 2 ms per layer per call, 0.5 ms per token; draft: 30 ms per call, 1 ms per token
    decode = {"target": Line(a=10.0, b=2.0, c=0.5), "draft": Line(a=30.0, c=1.0)}
    prefill = {"target": Line(a=100.0, c=3.0), "draft": Line(a=50.0, c=1.0)}
    return CostModel("test device", 20, decode, prefill)


def _record(method, prompt, calls, tok_s, new_tokens=30, prompt_tokens=40, **fields):
    return {
        "method": method,
        "task": "t",
        "prompt_id": prompt,
        "rep": 0,
        "model_calls": calls,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "tokens_per_second": tok_s,
        **fields,
    }


def test_predictions_equal_measurement_when_the_profile_is_exact():
    costs = _costs()
    ar_calls = {"target": {"calls": 30, "tokens": 40 + 29}}
    sd_calls = {"target": {"calls": 10, "tokens": 40 + 9 * 6}, "draft": {"calls": 50, "tokens": 40 + 49}}
    ar_s, sd_s = costs.seconds(ar_calls, 40), costs.seconds(sd_calls, 40)
    records = [
        _record("ar", 1, ar_calls, 30 / ar_s),
        _record("sd", 1, sd_calls, 30 / sd_s),
        _record("ar", 2, ar_calls, 0.5 * 30 / ar_s),
        _record("sd", 2, sd_calls, 0.5 * 30 / sd_s),
    ]
    by_method = {p.method: p for p in predict_records(records, lambda _: costs, {})}
    # prompt 1 measured exactly as predicted (error 0), prompt 2 at half the predicted speed (+100 %)
    assert by_method["ar"].error == pytest.approx(0.5) and by_method["sd"].error == pytest.approx(0.5)
    assert by_method["sd"].predicted_speedup == pytest.approx(ar_s / sd_s)
    assert by_method["sd"].measured_speedup == pytest.approx(ar_s / sd_s)
    table = validation_table(list(by_method.values()), costs.device)
    assert "test device" in table and "| sd | 2 |" in table


def test_each_record_is_priced_with_the_drafter_variant_it_ran():
    def entries(model, dtype, ms_1, ms_8, layers=None):
        return [
            LatencyEntry(model, dtype, 2, 128, 1, ms_1, layers=layers),
            LatencyEntry(model, dtype, 2, 128, 8, ms_8, layers=layers),
        ]

    profile = LatencyProfile(
        entries=entries("big", "float32", 200.0, 270.0)
        + entries("big", "float32", 120.0, 160.0, 14.0)
        + entries("small", "bfloat16", 90.0, 97.0)
        + entries("small", "bfloat16+int8-weight", 20.0, 48.0),
        model_layers={"big": 28, "small": 24},
    )
    costs = record_costs(profile, "big", "small", context=128)
    calls = {"target": {"calls": 1, "tokens": 1}, "draft": {"calls": 1, "tokens": 1}}
    plain = {"dtype": "float32", "draft_dtype": "bfloat16", "threads": 2, "model_calls": calls}
    int8 = {**plain, "model_calls": {**calls, "draft": {"calls": 1, "tokens": 1, "variant": "bfloat16+int8-weight"}}}
    assert costs(plain).forward_ms("draft", 1) == pytest.approx(90.0, abs=1e-6)
    assert costs(int8).forward_ms("draft", 1) == pytest.approx(20.0, abs=1e-6)
    assert costs(int8).forward_ms("target", 8) == pytest.approx(270.0, abs=1e-6)
    assert costs(plain) is costs({**plain})  # fitted once per (dtype, draft variant, threads)
    with pytest.raises(KeyError, match="1 thread"):
        costs({**plain, "threads": 1})


def test_modelled_speedups_come_from_the_measured_call_counts():
    sd = {"target": {"calls": 10, "tokens": 10 * 6}, "draft": {"calls": 50, "tokens": 50}}
    ar = {"target": {"calls": 40, "tokens": 40}}
    records = [_record("ar", 1, ar, 1.0, prompt_tokens=1), _record("sd", 1, sd, 1.0, prompt_tokens=1)]
    table = modelled_speedups(records, [CostModel.synthetic(28, draft_ratio=0.05)], {})
    ((device, speedups),) = table.items()
    # 40 AR steps against 10 verifies (1 step each) + 50 draft steps of 0.05 = 12.5
    assert "modelled" in device and speedups["sd"] == pytest.approx(40 / 12.5) and speedups["ar"] == pytest.approx(1.0)
    with pytest.raises(AssertionError):
        modelled_speedups(records, [_costs()], {})


def test_the_costmodel_command_profiles_the_tiny_pair_then_predicts_records_with_it(tmp_path):
    import json

    from hydra import compose, initialize_config_dir

    from viasd_adapters.cli.costmodel import run
    from viasd_adapters.configs import CONFIG_DIR

    shape = [
        "model_pair=tiny-random",
        "runtime.weights=float32",
        "runtime.draft_weights=float32",
        "masks=[tiny-random-1l]",
        "context=16",
        "tokens=[1,4]",
        "prefill=[24,40]",
        "repetitions=1",
    ]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        measure = compose("costmodel", overrides=shape + ["mode=profile", f"out_dir={tmp_path}/p"])
        predict = compose(
            "costmodel",
            overrides=shape
            + [
                "mode=predict",
                f"records={tmp_path}/run",
                f"profile={tmp_path}/p/profile.json",
                f"out_dir={tmp_path}/p",
            ],
        )
    markdown = run(measure).read_text()
    assert "| float32+int8-weight | decode draft |" in markdown and "| float32 | decode target |" in markdown
    calls = {
        "target": {"calls": 10, "tokens": 40},
        "draft": {"calls": 30, "tokens": 50, "variant": "float32+int8-weight"},
    }
    rows = [
        _record("ar", 1, {"target": {"calls": 30, "tokens": 59}}, 20.0, dtype="float32", threads=None),
        _record("sd-int8", 1, calls, 30.0, dtype="float32", threads=None),
    ]
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = run(predict).read_text()
    assert "| sd-int8 | 1 |" in text and "MODELLED, not measured" in text
