"""The cost model: fitting, pricing call counts, predicting records, modelled profiles, measuring."""

import math

import pytest

from viasd_adapters.bench.costmodel import (
    LatencyProfile,
    Line,
    Measurement,
    fit_line,
    measure_profile,
    predict_records,
    validation_table,
)


def _grid(line: Line, role: str, layers_list, tokens_list):
    return [Measurement(role, l, n, 64, line.ms(n, l), 3) for l in layers_list for n in tokens_list]


def test_fit_recovers_a_known_plane_over_tokens_and_layers():
    truth = Line(a=5.0, b=7.5, c=0.3, d=0.02)
    fitted = fit_line(_grid(truth, "target", [28, 24, 20, 15], [1, 4, 8]), with_layers=True)
    for name in ("a", "b", "c", "d"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), abs=1e-6)


def test_fit_without_layers_is_a_line_in_tokens():
    fitted = fit_line(_grid(Line(a=40.0, c=2.0), "draft", [24], [1, 4, 8]), with_layers=False)
    assert (fitted.a, fitted.b, fitted.c, fitted.d) == pytest.approx((40.0, 0.0, 2.0, 0.0))


def test_fit_of_noisy_timings_never_prices_a_forward_below_zero():
    # A busy host: the 1-token forward was slowed, so a free line through these points falls with
    # tokens (negative per-token cost) and would predict negative ms for long blocks.
    noisy = [Measurement("draft", 24, n, 64, ms, 3) for n, ms in [(1, 90.0), (2, 60.0), (4, 50.0), (8, 45.0)]]
    fitted = fit_line(noisy, with_layers=True)
    assert min(fitted.a, fitted.b, fitted.c, fitted.d) >= 0
    assert fitted.ms(64, 24) > 0


def _profile() -> LatencyProfile:
    # target: 10 + 2 ms per layer per call, 0.5 ms per token; draft: 30 ms per call, 1 ms per token
    decode = {"target": Line(a=10.0, b=2.0, c=0.5), "draft": Line(a=30.0, c=1.0)}
    prefill = {"target": Line(a=100.0, c=3.0), "draft": Line(a=50.0, c=1.0)}
    return LatencyProfile("test device", 20, decode, prefill)


def test_seconds_prices_prefill_then_decode_calls_by_hand():
    profile = _profile()
    calls = {"target": {"calls": 3, "tokens": 40 + 6 + 6}, "draft": {"calls": 5, "tokens": 40 + 4}}
    # target: prefill of the 40 prompt tokens 100 + 3 * 40 = 220; two more calls: 2 * (10 + 2 * 20) + 12 * 0.5 = 106
    # draft: prefill 50 + 40 = 90; four more calls: 4 * 30 + 4 * 1 = 124
    assert profile.seconds(calls, prompt_tokens=40) == pytest.approx((220 + 106 + 90 + 124) / 1e3)


def test_a_slim_forward_is_the_target_running_fewer_layers_and_a_separate_middle_model_the_draft():
    profile = _profile()
    assert profile.forward_ms("slim", 6, slim=12) == pytest.approx(10 + 2 * 12 + 0.5 * 6)
    assert profile.forward_ms("slim", 6, slim=12) < profile.forward_ms("target", 6)
    assert profile.forward_ms("slim", 6, slim="draft") == profile.forward_ms("draft", 6)
    # a slim prefill runs its share of the target's layers
    assert profile.forward_ms("slim", 40, slim=10, first=True) == pytest.approx(0.5 * profile.forward_ms("target", 40, first=True))
    with pytest.raises(ValueError, match="layers it runs"):
        profile.seconds({"slim": {"calls": 2, "tokens": 10}}, 4)
    with pytest.raises(ValueError, match="not one the cost model prices"):
        profile.seconds({"eagle": {"calls": 2, "tokens": 10}}, 4)


def _record(method, prompt, calls, tok_s, new_tokens=30, prompt_tokens=40):
    return {"method": method, "task": "t", "prompt_id": prompt, "rep": 0, "model_calls": calls,
            "prompt_tokens": prompt_tokens, "new_tokens": new_tokens, "tokens_per_second": tok_s}


def test_predictions_equal_measurement_when_the_profile_is_exact():
    profile = _profile()
    ar_calls = {"target": {"calls": 30, "tokens": 40 + 29}}
    sd_calls = {"target": {"calls": 10, "tokens": 40 + 9 * 6}, "draft": {"calls": 50, "tokens": 40 + 49}}
    ar_s, sd_s = profile.seconds(ar_calls, 40), profile.seconds(sd_calls, 40)
    records = [_record("ar", 1, ar_calls, 30 / ar_s), _record("sd", 1, sd_calls, 30 / sd_s),
               _record("ar", 2, ar_calls, 0.5 * 30 / ar_s), _record("sd", 2, sd_calls, 0.5 * 30 / sd_s)]
    by_method = {p.method: p for p in predict_records(records, profile, {})}
    # prompt 1 measured exactly as predicted (error 0), prompt 2 at half the predicted speed (+100 %)
    assert by_method["ar"].error == pytest.approx(0.5) and by_method["sd"].error == pytest.approx(0.5)
    assert by_method["sd"].predicted_speedup == pytest.approx(ar_s / sd_s)
    assert by_method["sd"].measured_speedup == pytest.approx(ar_s / sd_s)
    table = validation_table(list(by_method.values()), profile.device)
    assert "test device" in table and "| sd | 2 |" in table


def test_modelled_gpu_profile_prices_a_verify_block_like_one_step():
    profile = LatencyProfile.synthetic(num_layers=28, draft_ratio=0.05)
    assert profile.modelled and "modelled" in profile.device
    assert profile.forward_ms("target", 6) == pytest.approx(profile.forward_ms("target", 1)) == pytest.approx(1.0)
    assert profile.forward_ms("draft", 1) == pytest.approx(0.05)
    assert profile.forward_ms("slim", 6, slim=14) == pytest.approx(0.1 + 0.9 * 0.5)
    # SD accepting 4 tokens per round of 5 drafts: per round 1 target + 5 draft steps = 1.25 vs 4 AR steps
    rounds = 10
    sd = {"target": {"calls": rounds, "tokens": rounds * 6}, "draft": {"calls": 5 * rounds, "tokens": 5 * rounds}}
    ar = {"target": {"calls": 4 * rounds, "tokens": 4 * rounds}}
    assert profile.seconds(ar, 1) / profile.seconds(sd, 1) == pytest.approx(4 / 1.25)
    with pytest.raises(ValueError):
        LatencyProfile.synthetic(28, draft_ratio=0.0)


def test_profile_round_trips_through_json(tmp_path):
    profile = _profile()
    profile.measurements = _grid(Line(a=1.0), "draft", [2], [1, 4])
    loaded = LatencyProfile.load(profile.save(tmp_path / "p.json"))
    assert loaded.decode == profile.decode and loaded.prefill == profile.prefill
    assert loaded.measurements == profile.measurements
    with pytest.raises(ValueError, match="measure one"):
        LatencyProfile.load(tmp_path / "missing.json")


def test_measure_profile_on_a_tiny_pair():
    from viasd_adapters.models import ModelSpec, load_model
    from viasd_adapters.routing import RoutingMask

    target = load_model(ModelSpec("tiny-random", dtype="float32", tiny={"num_layers": 4, "seed": 0})).model
    draft = load_model(ModelSpec("tiny-random", dtype="float32", tiny={"num_layers": 2, "seed": 1})).model
    masks = [RoutingMask([2], num_layers=4), RoutingMask([1, 2], num_layers=4)]
    profile = measure_profile(target, draft, masks, context=16, tokens=(1, 4), prefill=(24, 40), repetitions=2)
    shapes = {(m.role, m.layers, m.tokens) for m in profile.measurements}
    assert {("target", 4.0, 1), ("target", 3.0, 4), ("target", 2.0, 1), ("draft", 2.0, 4), ("target", 4.0, 40)} <= shapes
    assert set(profile.decode) == {"target", "draft"} and set(profile.prefill) == {"target", "draft"}
    assert all(m.ms > 0 for m in profile.measurements)
    assert math.isfinite(profile.forward_ms("slim", 6, slim=3))
    with pytest.raises(ValueError, match="window"):
        measure_profile(target, draft, masks, context=10_000)


def test_entries_of_a_viasd_profile_cache_become_measurements():
    from types import SimpleNamespace

    from viasd_adapters.bench.costmodel import from_profile_entries

    def entry(model, tokens, ms, layers=None, dtype="bfloat16", threads=2, context=128):
        return SimpleNamespace(model=model, dtype=dtype, threads=threads, context=context, new_tokens=tokens, ms=ms,
                               repeats=5, layers=layers)

    entries = [entry("big", 1, 200.0), entry("big", 8, 210.0), entry("big", 1, 150.0, layers=20),
               entry("big", 8, 158.0, layers=20), entry("small", 1, 90.0), entry("small", 8, 95.0),
               entry("big", 1, 999.0, dtype="float32"), entry("other", 1, 5.0), entry("big", 1, 999.0, threads=1)]
    got = from_profile_entries(entries, "big", "small", 28, "bfloat16", 2)
    assert [(m.role, m.layers, m.tokens, m.ms) for m in got] == [
        ("target", 28.0, 1, 200.0), ("target", 28.0, 8, 210.0), ("target", 20.0, 1, 150.0),
        ("target", 20.0, 8, 158.0), ("draft", 0.0, 1, 90.0), ("draft", 0.0, 8, 95.0)]
    profile = LatencyProfile.fit(got, 28, "test")
    assert profile.forward_ms("target", 1) == pytest.approx(200.0, abs=1e-6)
    assert profile.forward_ms("slim", 8, slim=20) == pytest.approx(158.0, abs=1e-6)


def test_settled_share_needed_by_hand():
    from viasd_adapters.bench.costmodel import settled_share_needed

    # GPU-like: c = 0.05, K = 5: SD costs 1.25 per round; VIA-SD with s = 0.6, e = 0.8 must keep
    # s + (1 - x) e <= 1.25 / 1.1 - 0.25 = 0.8864 -> x >= 1 - 0.2864 / 0.8 = 0.642
    assert settled_share_needed(0.05, 5, 0.6, 0.8) == pytest.approx(1 - (1.25 / 1.1 - 0.25 - 0.6) / 0.8)
    # this CPU: c = 0.47: the slim pass alone (0.83) is more than SD's whole margin
    assert settled_share_needed(0.47, 5, 0.83, 0.6) is None
    # a free slim pass that settles nothing, against no gain: nothing needed
    assert settled_share_needed(0.1, 4, 0.0, 1.0, gain=1.0) == pytest.approx(0.0, abs=1e-12)


def test_slim_ratio_needed_by_hand():
    from viasd_adapters.bench.costmodel import settled_share_needed, slim_ratio_needed

    # c = 0.25, K = 2: the host pays 1.5 per round; settling 36 % with e = 0.6 leaves
    # s <= 1.5 / 1.1 - 0.5 - 0.64 * 0.6 = 0.4796
    assert slim_ratio_needed(0.25, 2, 0.36, 0.6) == pytest.approx(1.5 / 1.1 - 0.5 - 0.64 * 0.6)
    # the two are inverses of one another
    s = slim_ratio_needed(0.1, 3, 0.5, 0.7)
    assert settled_share_needed(0.1, 3, s, 0.7) == pytest.approx(0.5)
    # settling nothing with a full escalation: even a free slim pass loses the 10 %
    assert slim_ratio_needed(0.25, 2, 0.0, 1.0) is None


def test_escalations_over_a_shared_prefix_are_priced_by_the_layers_they_run():
    profile = _profile()  # target: 10 + 2 ms per layer per call, 0.5 ms per token, 20 layers
    calls = {"target": {"calls": 2, "tokens": 40 + 6}}
    whole = profile.seconds(calls, 40)
    upper = profile.seconds(calls, 40, full=5)  # layers [15, 20) only
    # prefill scaled by 5 / 20; the second call: 10 + 2 * 5 + 6 * 0.5 = 23 instead of 53
    assert whole == pytest.approx((220 + 53) / 1e3) and upper == pytest.approx((220 / 4 + 23) / 1e3)
