"""The cost model: lines fitted to a profile over tokens and layers, and generations priced by their call counts."""

import pytest

from viasd_adapters.costs import CostModel, LatencyEntry, LatencyProfile, Line, fit_line

from .profiles import D, T


def _plane(
    line: Line, model: str, layers_list, tokens_list, L: int, dtype="bfloat16", context=64
) -> list[LatencyEntry]:
    """Entries on an exact line: the whole model (layers None, i.e. L) and slim views of it."""
    return [
        LatencyEntry(model, dtype, 2, context, n, line.ms(n, l), layers=None if l == L else float(l))
        for l in layers_list
        for n in tokens_list
    ]


def test_fit_recovers_a_known_plane_over_tokens_and_layers():
    truth = Line(a=5.0, b=7.5, c=0.3, d=0.02)
    fitted = fit_line([(n, l, truth.ms(n, l)) for l in [28, 24, 20, 15] for n in [1, 4, 8]], with_layers=True)
    for name in ("a", "b", "c", "d"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), abs=1e-6)
    line = fit_line([(n, 0.0, 40.0 + 2.0 * n) for n in [1, 4, 8]], with_layers=False)
    assert (line.a, line.b, line.c, line.d) == pytest.approx((40.0, 0.0, 2.0, 0.0))


def test_fit_of_noisy_timings_never_prices_a_forward_below_zero():
    # A busy host: the 1-token forward was slowed, so a free line through these points falls with
    # tokens (negative per-token cost) and would predict negative ms for long blocks.
    fitted = fit_line([(n, 24.0, ms) for n, ms in [(1, 90.0), (2, 60.0), (4, 50.0), (8, 45.0)]], with_layers=True)
    assert min(fitted.a, fitted.b, fitted.c, fitted.d) >= 0
    assert fitted.ms(64, 24) > 0


def test_the_cost_model_is_fitted_on_the_profiles_entries_with_each_drafter_variant_its_own_line():
    target, draft, int8 = Line(a=10.0, b=2.0, c=0.5, d=0.01), Line(a=30.0, c=1.0), Line(a=12.0, c=3.0)
    entries = (
        _plane(target, T, [28, 20, 14], [1, 4, 8], 28)
        + _plane(draft, D, [24], [1, 4, 8], 24)
        + _plane(int8, D, [24], [1, 4, 8], 24, dtype="bfloat16+int8-weight")
        + [LatencyEntry(T, "bfloat16", 2, 0, n, 100.0 + 3.0 * n) for n in (64, 192)]  # prefill
        + _plane(Line(a=999.0), T, [28], [1, 4], 28, context=512)
    )  # another context: not mixed in
    profile = LatencyProfile(entries=entries, model_layers={T: 28, D: 24})
    model = CostModel.fit(profile, T, D, "bfloat16", threads=2, context=100)
    assert model.num_layers == 28 and not model.modelled
    assert model.forward_ms("target", 6) == pytest.approx(target.ms(6, 28), abs=1e-6)
    assert model.forward_ms("slim", 6, slim=17) == pytest.approx(target.ms(6, 17), abs=1e-6)  # a depth never timed
    assert model.forward_ms("draft", 1) == pytest.approx(draft.ms(1), abs=1e-6)
    assert model.forward_ms("target", 40, first=True) == pytest.approx(100.0 + 3.0 * 40, abs=1e-6)
    assert model.forward_ms("draft", 40, first=True) == pytest.approx(draft.ms(40), abs=1e-6)  # no prefill: decode line
    quantised = CostModel.fit(profile, T, D, "bfloat16", "bfloat16+int8-weight", threads=2, context=100)
    assert quantised.forward_ms("draft", 1) == pytest.approx(int8.ms(1), abs=1e-6)
    assert quantised.forward_ms("target", 6) == pytest.approx(model.forward_ms("target", 6))
    with pytest.raises(KeyError, match="run viasd-profile"):
        CostModel.fit(profile, T, D, "bfloat16", "bfloat16+int8-dynamic", threads=2)


def _costs() -> CostModel:
    # target: 10 + 2 ms per layer per call, 0.5 ms per token; draft: 30 ms per call, 1 ms per token
    decode = {"target": Line(a=10.0, b=2.0, c=0.5), "draft": Line(a=30.0, c=1.0)}
    prefill = {"target": Line(a=100.0, c=3.0), "draft": Line(a=50.0, c=1.0)}
    return CostModel("test device", 20, decode, prefill)


def test_seconds_prices_prefill_then_decode_calls_by_hand():
    calls = {"target": {"calls": 3, "tokens": 40 + 6 + 6}, "draft": {"calls": 5, "tokens": 40 + 4}}
    # target: prefill of the 40 prompt tokens 100 + 3 * 40 = 220; two more calls: 2 * (10 + 2 * 20) + 12 * 0.5 = 106
    # draft: prefill 50 + 40 = 90; four more calls: 4 * 30 + 4 * 1 = 124
    assert _costs().seconds(calls, prompt_tokens=40) == pytest.approx((220 + 106 + 90 + 124) / 1e3)


def test_a_slim_forward_is_the_target_running_fewer_layers_and_a_separate_middle_model_the_draft():
    costs = _costs()
    assert costs.forward_ms("slim", 6, slim=12) == pytest.approx(10 + 2 * 12 + 0.5 * 6)
    assert costs.forward_ms("slim", 6, slim=12) < costs.forward_ms("target", 6)
    assert costs.forward_ms("slim", 6, slim="draft") == costs.forward_ms("draft", 6)
    # a slim prefill runs its share of the target's layers
    assert costs.forward_ms("slim", 40, slim=10, first=True) == pytest.approx(
        0.5 * costs.forward_ms("target", 40, first=True)
    )
    with pytest.raises(ValueError, match="layers it runs"):
        costs.seconds({"slim": {"calls": 2, "tokens": 10}}, 4)
    with pytest.raises(ValueError, match="not one the cost model prices"):
        costs.seconds({"eagle": {"calls": 2, "tokens": 10}}, 4)


def test_escalations_over_a_shared_prefix_are_priced_by_the_layers_they_run():
    costs = _costs()  # target: 10 + 2 ms per layer per call, 0.5 ms per token, 20 layers
    calls = {"target": {"calls": 2, "tokens": 40 + 6}}
    whole = costs.seconds(calls, 40)
    upper = costs.seconds(calls, 40, full=5)  # layers [15, 20) only
    # prefill scaled by 5 / 20; the second call: 10 + 2 * 5 + 6 * 0.5 = 23 instead of 53
    assert whole == pytest.approx((220 + 53) / 1e3) and upper == pytest.approx((220 / 4 + 23) / 1e3)


def test_modelled_gpu_costs_price_a_verify_block_like_one_step():
    costs = CostModel.synthetic(num_layers=28, draft_ratio=0.05)
    assert costs.modelled and "modelled" in costs.device
    assert costs.forward_ms("target", 6) == pytest.approx(costs.forward_ms("target", 1)) == pytest.approx(1.0)
    assert costs.forward_ms("draft", 1) == pytest.approx(0.05)
    assert costs.forward_ms("slim", 6, slim=14) == pytest.approx(0.1 + 0.9 * 0.5)
    # SD accepting 4 tokens per round of 5 drafts: per round 1 target + 5 draft steps = 1.25 vs 4 AR steps
    rounds = 10
    sd = {"target": {"calls": rounds, "tokens": rounds * 6}, "draft": {"calls": 5 * rounds, "tokens": 5 * rounds}}
    ar = {"target": {"calls": 4 * rounds, "tokens": 4 * rounds}}
    assert costs.seconds(ar, 1) / costs.seconds(sd, 1) == pytest.approx(4 / 1.25)
    with pytest.raises(ValueError):
        CostModel.synthetic(28, draft_ratio=0.0)
