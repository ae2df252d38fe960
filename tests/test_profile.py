"""The latency profile: lookup, costs, files, measuring on a tiny model, the choice it drives, and
the cost model fitted to it."""

import json
import math

import pytest

from tests.conftest import tiny
from viasd_adapters.profile import (
    CostModel, LatencyEntry, LatencyProfile, Line, ProfileGrid, choose_configuration, fit_line, load_profile,
    measure_pair, measure_profile, missing_points, time_forwards,
)

T, D = "target-1.5b", "draft-0.5b"


def profile_of(table: dict, threads: int = 2, context: int = 128) -> LatencyProfile:
    """{(model, dtype): {new_tokens: ms}} -> a profile."""
    return LatencyProfile(entries=[
        LatencyEntry(model, dtype, threads, context, n, ms)
        for (model, dtype), row in table.items() for n, ms in row.items()
    ])


# Measured on two CPUs: Intel AMX (bf16 verify nearly free) and AMD Zen 3 (a verify of M
# tokens costs nearly M steps in bf16; fp32 is slower per step but grows less).
INTEL = profile_of({(T, "bfloat16"): {1: 216, 8: 223, 16: 242}, (D, "bfloat16"): {1: 101},
                    (T, "float32"): {1: 279, 8: 814}, (D, "float32"): {1: 150}})
AMD = profile_of({(T, "bfloat16"): {1: 287, 4: 832, 8: 1530, 16: 2756}, (D, "bfloat16"): {1: 98, 4: 274},
                  (T, "float32"): {1: 497, 4: 1658, 8: 1628, 16: 2268}})


def test_ms_interpolates_tokens_and_picks_the_nearest_context():
    p = LatencyProfile(entries=[
        LatencyEntry(T, "bfloat16", 1, 128, 1, 100.0), LatencyEntry(T, "bfloat16", 1, 128, 5, 140.0),
        LatencyEntry(T, "bfloat16", 1, 512, 1, 130.0), LatencyEntry(T, "bfloat16", 1, 512, 5, 170.0),
    ])
    assert p.ms(T, "bfloat16", 1, 3, context=100) == pytest.approx(120.0)
    assert p.ms(T, "bfloat16", 1, 3, context=400) == pytest.approx(150.0)
    assert p.ms(T, "bfloat16", 1, 9, context=128) == pytest.approx(180.0)  # extended by the last segment
    with pytest.raises(KeyError, match="run viasd-profile"):
        p.ms(T, "float32", 1, 1)
    assert not p.has(T, "bfloat16", 1, layers=20)  # a slim view is a separate entry
    with pytest.raises(KeyError, match="20 layers"):
        p.ms(T, "bfloat16", 1, 1, layers=20)


def test_draft_costs_are_ratios_to_the_target_step():
    costs = INTEL.draft_costs(D, T, "bfloat16", "bfloat16", threads=2, max_tokens=9)
    assert costs.draft_step == pytest.approx(101 / 216)
    assert costs.verify[0] == 1.0 and costs.verify[7] == pytest.approx(223 / 216)


def test_the_intel_profile_chooses_sd_in_bf16_and_the_amd_one_greedy_ar():
    intel = choose_configuration(INTEL, D, T, acceptance=0.8, threads=2)
    assert (intel.framework, intel.dtype, intel.draft_dtype) == ("sd", "bfloat16", "bfloat16")
    assert intel.num_draft_tokens >= 2 and intel.expected_speedup > 1.1
    assert intel.expected_tokens_per_second == pytest.approx(intel.expected_speedup * 1000 / 216)
    amd = choose_configuration(AMD, D, T, acceptance=0.8, threads=2)
    assert (amd.framework, amd.dtype, amd.num_draft_tokens) == ("ar", "bfloat16", 0)
    assert "no draft length beats it" in amd.describe()
    with pytest.raises(ValueError, match="run viasd-profile"):
        choose_configuration(INTEL, D, T, acceptance=0.8, threads=1)


def test_a_speedup_is_over_the_fastest_ar_not_ar_in_the_chosen_dtype():
    # fp32 verifies cheaply here but steps slower than bf16: the fp32 SD choice must be priced
    # against bf16 AR (200 ms), not against fp32 AR (300 ms).
    p = profile_of({(T, "bfloat16"): {1: 200, 2: 400}, (D, "bfloat16"): {1: 20},
                    (T, "float32"): {1: 300, 2: 300}})
    choice = choose_configuration(p, D, T, acceptance=0.9, threads=2, draft_dtypes=["bfloat16"], k_max=1)
    assert (choice.framework, choice.dtype) == ("sd", "float32")
    assert choice.ar_tokens_per_second == pytest.approx(5.0)
    assert choice.expected_speedup == pytest.approx(choice.expected_tokens_per_second / 5.0)


def test_on_an_avx2_cpu_the_flat_int8_target_makes_sd_the_choice():
    """The AVX2 shape (measured, docs/results/int8.md): bf16 and fp32 verifies grow with rows, int8's barely."""
    p = profile_of({(T, "bfloat16"): {1: 112, 4: 438, 8: 833}, (T, "float32"): {1: 393, 4: 762, 8: 736},
                    (T, "int8"): {1: 74, 4: 120, 8: 159}, (D, "bfloat16"): {1: 42}, (D, "int8"): {1: 20}})
    choice = choose_configuration(p, D, T, acceptance=0.8, threads=2, dtypes=["int8", "bfloat16", "float32"])
    assert (choice.framework, choice.dtype, choice.draft_dtype) == ("sd", "int8", "int8")
    assert choice.fastest_ar_dtype == "int8" and choice.expected_speedup > 1.2
    bf16_only = choose_configuration(p, D, T, acceptance=0.8, threads=2, dtypes=["bfloat16"])
    assert (bf16_only.framework, bf16_only.fastest_ar_dtype) == ("ar", "bfloat16")


def test_the_choice_takes_the_faster_thread_count():
    # A busy host: two threads are slower than one (a 2-thread op waits for its slower thread).
    busy = LatencyProfile(entries=INTEL.entries + profile_of(
        {(T, "bfloat16"): {1: 400, 8: 420, 16: 450}, (D, "bfloat16"): {1: 190}}, threads=1).entries)
    busy.entries = [e if e.threads == 1 else LatencyEntry(e.model, e.dtype, 2, e.context, e.new_tokens, e.ms * 3) for e in busy.entries]
    choice = choose_configuration(busy, D, T, acceptance=0.8, threads=[1, 2])
    assert choice.threads == 1 and choice.dtype == "bfloat16"


def test_merge_save_and_load(tmp_path):
    a = profile_of({(T, "bfloat16"): {1: 200.0, 2: 210.0}})
    a.model_layers = {T: 28}
    b = profile_of({(T, "bfloat16"): {2: 220.0}, (D, "bfloat16"): {1: 90.0}})
    b.model_layers = {D: 24}
    merged = a.merge(b)
    assert merged.ms(T, "bfloat16", 2, 2) == 220.0 and merged.ms(T, "bfloat16", 2, 1) == 200.0
    assert len(merged.entries) == 3 and merged.model_layers == {T: 28, D: 24}
    path = merged.save(tmp_path / "p" / "cpu.json")
    loaded = load_profile(path)
    assert loaded.entries == merged.entries and loaded.model_layers == merged.model_layers
    assert json.loads(path.read_text())["format"] == 1
    with pytest.raises(FileNotFoundError, match="viasd-profile"):
        load_profile(tmp_path / "missing.json")


def test_profiles_written_before_the_merge_load_or_say_to_measure_again(tmp_path):
    # A viasd-profile cache of before: no layer counts. Its lookups work; the cost model asks for a remeasure.
    old = profile_of({(T, "bfloat16"): {1: 200.0, 8: 210.0}}).to_dict()
    del old["model_layers"]
    (tmp_path / "cache.json").write_text(json.dumps(old))
    cached = load_profile(tmp_path / "cache.json")
    assert cached.ms(T, "bfloat16", 2, 8) == 210.0
    with pytest.raises(ValueError, match="viasd-profile remeasure=true"):
        cached.cost_model(T, dtype="bfloat16", threads=2)
    # viasd-costmodel's former file: fitted lines, no entries
    lines = {"device": "cpu", "num_layers": 28, "decode": {"target": {"a": 1.0}}, "prefill": {}, "measurements": []}
    (tmp_path / "lines.json").write_text(json.dumps(lines))
    with pytest.raises(ValueError, match="measure it again with viasd-profile"):
        load_profile(tmp_path / "lines.json")


def test_time_forwards_takes_turns_and_crops_back_to_the_context(monkeypatch):
    from viasd_adapters.runner import CausalLMRunner

    fed = []  # (model, tokens scored, tokens cached after the forward)
    logits = CausalLMRunner.logits

    def spy(self, ids, n):
        out = logits(self, ids, n)
        fed.append((self.name, n, self.cached_length))
        return out

    monkeypatch.setattr(CausalLMRunner, "logits", spy)
    times = time_forwards({"a": tiny(seed=0).model, "b": tiny(seed=1).model}, context=16, new_tokens=[1, 4], repeats=2)
    assert set(times) == {"a", "b"} and all(len(v) == 2 and min(v) > 0 for row in times.values() for v in row.values())
    assert fed[:2] == [("a", 1, 16), ("b", 1, 16)]  # each model prefills the context once
    timed = fed[2:]
    assert all(cached == 16 + n for _, n, cached in timed)  # cropped back to the context, n tokens fed
    # repetition 0 (warm-up) runs a before b, repetition 1 b before a: drift hits both alike
    assert [name for name, *_ in timed[:4]] == ["a", "b", "a", "b"]
    assert [name for name, *_ in timed[4:8]] == ["b", "a", "b", "a"]
    assert len(timed) == 3 * 2 * 2  # (1 warm-up + 2) repetitions x 2 counts x 2 models


def test_measure_profile_on_a_tiny_model():
    model = tiny(seed=0).model
    grid = ProfileGrid(models=["a", "b", "a"], dtypes=["float32"], threads=[1, 64], new_tokens=[1, 3], contexts=[0, 8], repeats=1)
    assert grid.models == ["a", "b"]
    loads = []
    profile = measure_profile(grid, load=lambda name, dtype, device: loads.append(name) or model, progress=False)
    assert loads == ["a", "b"]  # each model loaded once per dtype
    threads = {e.threads for e in profile.entries}
    assert 1 in threads and 64 not in threads  # clipped to the cores there are
    assert len(profile.entries) == 2 * len(threads) * 2 * 2
    assert profile.cpu["model"] and profile.hardware and profile.torch_version
    assert profile.model_layers == {"a": 4, "b": 4}
    assert missing_points(profile, grid) is None
    wider = ProfileGrid(models=["a", "b"], dtypes=["float32", "bfloat16"], threads=[1])
    assert missing_points(profile, wider).dtypes == ["bfloat16"]
    with pytest.raises(ValueError, match="at least one model"):
        ProfileGrid(models=[])


def test_quantised_drafter_variants_are_measured_as_the_drafter_runs_them(monkeypatch):
    from viasd_adapters.models.quantize import Int8WeightLinear

    model = tiny(seed=0).model
    grid = ProfileGrid(models=["a"], dtypes=["float32"], variants=["float32+int8-weight"], variant_models=["a"],
                       threads=[1], new_tokens=[1, 2], contexts=[4], repeats=1)
    int8_calls = []  # the variant must time the int8 copy, not the model it was loaded as
    forward = Int8WeightLinear.forward
    monkeypatch.setattr(Int8WeightLinear, "forward", lambda self, x: int8_calls.append(1) or forward(self, x))
    profile = measure_profile(grid, load=lambda name, dtype, device: model, progress=False)
    assert {e.dtype for e in profile.entries} == {"float32", "float32+int8-weight"}
    assert int8_calls
    assert missing_points(profile, grid) is None
    wider = ProfileGrid(models=["a"], dtypes=["float32"], variants=["float32+int8-weight", "float32+int8-dynamic"],
                        variant_models=["a"], threads=[1])
    todo = missing_points(profile, wider)
    assert todo.combinations() == [("a", "float32+int8-dynamic")]  # only what the profile lacks
    with pytest.raises(ValueError, match="<dtype>\\+<quantization>"):
        ProfileGrid(models=["a"], variants=["bfloat16+int4"], variant_models=["a"])
    with pytest.raises(ValueError, match="go together"):
        ProfileGrid(models=["a"], variants=["bfloat16+int8-weight"])


def test_a_cheaper_quantised_drafter_wins_the_choice_when_the_profile_has_it():
    int8 = "bfloat16+int8-weight"
    p = profile_of({(T, "bfloat16"): {1: 216, 8: 223, 16: 242}, (D, "bfloat16"): {1: 101}, (D, int8): {1: 50}})
    choice = choose_configuration(p, D, T, acceptance=0.7, threads=2, dtypes=["bfloat16"],
                                  draft_dtypes=["bfloat16", int8])
    plain = choose_configuration(p, D, T, acceptance=0.7, threads=2, dtypes=["bfloat16"])
    assert choice.draft_dtype == int8 and plain.draft_dtype == "bfloat16"
    assert choice.expected_speedup > plain.expected_speedup
    assert int8 in choice.describe()


def test_the_demo_decodes_with_a_chosen_int8_drafter_beside_greedy_ar(monkeypatch):
    import torch
    from hydra import compose, initialize_config_dir

    from viasd_adapters.cli.profile import decode_both
    from viasd_adapters.configs import CONFIG_DIR
    from viasd_adapters.models.quantize import Int8WeightLinear
    from viasd_adapters.profile import Choice

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("profile", overrides=["model_pair=tiny-random", "prompt=hello there", "max_new_tokens=12",
                                            "chat_template=false"])
    int8 = "float32+int8-weight"
    profile = profile_of({("tiny-random", "float32"): {1: 10.0, 8: 11.0}, ("tiny-random", int8): {1: 2.0}},
                         threads=torch.get_num_threads())
    choice = Choice("sd", "float32", int8, 3, 1.5, 150.0, 100.0, torch.get_num_threads(), 0.8)
    int8_rows = []
    forward = Int8WeightLinear.forward
    monkeypatch.setattr(Int8WeightLinear, "forward", lambda self, x: int8_rows.append(x.shape[:-1].numel()) or forward(self, x))
    ar, sd = decode_both(cfg, profile, choice)
    assert sd.result.tokens == ar.result.tokens and len(ar.result.tokens) == 12  # fp32 target: lossless
    assert int8_rows and int8 in sd.label  # the drafter that ran is the int8 copy
    assert sd.result.stats.accepted > 0


def test_the_demo_report_says_where_the_tokens_part_and_why_in_bf16(tmp_path):
    from viasd_adapters.cli.profile import Decoded, ProfileOutcome, report
    from viasd_adapters.decode import DecodeStats, GenerationResult
    from viasd_adapters.profile import Choice

    def decoded(label, tokens):
        return Decoded(label, GenerationResult(tokens, DecodeStats(new_tokens=len(tokens), seconds=1.0)), "text")

    ar = decoded("greedy AR (bfloat16)", [1, 2, 3, 4, 5])
    for dtype, tokens, says in [("bfloat16", [1, 2, 9, 4, 5], "the same first 2 tokens as greedy AR, then they part (bfloat16"),
                                ("float32", [1, 2, 3, 4, 5], "same tokens as greedy AR")]:
        choice = Choice("sd", dtype, "bfloat16", 2, 1.5, 7.5, 5.0, 2, 0.6)
        text = report(ProfileOutcome(tmp_path, LatencyProfile(), False, choice, [ar, decoded("SD", tokens)]))
        assert says in text.splitlines()[-1]


# -- the cost model ------------------------------------------------------------------------

def _plane(line: Line, model: str, layers_list, tokens_list, L: int, dtype="bfloat16", context=64) -> list[LatencyEntry]:
    """Entries on an exact line: the whole model (layers None, i.e. L) and slim views of it."""
    return [LatencyEntry(model, dtype, 2, context, n, line.ms(n, l), layers=None if l == L else float(l))
            for l in layers_list for n in tokens_list]


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
    entries = (_plane(target, T, [28, 20, 14], [1, 4, 8], 28) + _plane(draft, D, [24], [1, 4, 8], 24)
               + _plane(int8, D, [24], [1, 4, 8], 24, dtype="bfloat16+int8-weight")
               + [LatencyEntry(T, "bfloat16", 2, 0, n, 100.0 + 3.0 * n) for n in (64, 192)]  # prefill
               + _plane(Line(a=999.0), T, [28], [1, 4], 28, context=512))  # another context: not mixed in
    profile = LatencyProfile(entries=entries, model_layers={T: 28, D: 24})
    model = profile.cost_model(T, D, "bfloat16", threads=2, context=100)
    assert model.num_layers == 28 and not model.modelled
    assert model.forward_ms("target", 6) == pytest.approx(target.ms(6, 28), abs=1e-6)
    assert model.forward_ms("slim", 6, slim=17) == pytest.approx(target.ms(6, 17), abs=1e-6)  # a depth never timed
    assert model.forward_ms("draft", 1) == pytest.approx(draft.ms(1), abs=1e-6)
    assert model.forward_ms("target", 40, first=True) == pytest.approx(100.0 + 3.0 * 40, abs=1e-6)
    assert model.forward_ms("draft", 40, first=True) == pytest.approx(draft.ms(40), abs=1e-6)  # no prefill: decode line
    quantised = profile.cost_model(T, D, "bfloat16", "bfloat16+int8-weight", threads=2, context=100)
    assert quantised.forward_ms("draft", 1) == pytest.approx(int8.ms(1), abs=1e-6)
    assert quantised.forward_ms("target", 6) == pytest.approx(model.forward_ms("target", 6))
    with pytest.raises(KeyError, match="run viasd-profile"):
        profile.cost_model(T, D, "bfloat16", "bfloat16+int8-dynamic", threads=2)


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
    assert costs.forward_ms("slim", 40, slim=10, first=True) == pytest.approx(0.5 * costs.forward_ms("target", 40, first=True))
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


def test_measure_pair_times_slim_views_prefill_and_the_quantised_drafter(monkeypatch):
    from viasd_adapters.models.quantize import Int8WeightLinear
    from viasd_adapters.pipeline import ModelPair
    from viasd_adapters.routing import RoutingMask

    target, draft = tiny(seed=0), tiny(seed=1, num_layers=2)
    draft.spec.name = "tiny-draft"
    masks = [RoutingMask([2], num_layers=4), RoutingMask([1, 2], num_layers=4), RoutingMask([3], num_layers=4)]
    int8_rows = []  # the variant must time the int8 copy
    forward = Int8WeightLinear.forward
    monkeypatch.setattr(Int8WeightLinear, "forward", lambda self, x: int8_rows.append(1) or forward(self, x))
    profile = measure_pair(ModelPair(target, draft), masks, [16], [1, 4], [24, 40], 1, ["int8-weight"])
    shapes = {(e.model, e.dtype, e.context, e.new_tokens, e.layers) for e in profile.entries}
    assert {("tiny-random", "float32", 16, 4, None), ("tiny-random", "float32", 16, 1, 3.0),
            ("tiny-random", "float32", 16, 4, 2.0), ("tiny-random", "float32", 0, 40, None),
            ("tiny-draft", "float32", 16, 1, None), ("tiny-draft", "float32+int8-weight", 16, 4, None)} <= shapes
    assert not any(e.layers is not None and e.context == 0 for e in profile.entries)  # prefill: whole models only
    assert len({e.layers for e in profile.entries if e.model == "tiny-random"}) == 3  # two masks of 3 layers: one timed
    assert int8_rows and all(e.ms > 0 for e in profile.entries)
    assert profile.model_layers == {"tiny-random": 4, "tiny-draft": 2}
    costs = profile.cost_model("tiny-random", "tiny-draft", "float32", "float32+int8-weight")
    assert set(costs.decode) == set(costs.prefill) == {"target", "draft"}
    assert math.isfinite(costs.forward_ms("slim", 6, slim=3))
    with pytest.raises(ValueError, match="window"):
        measure_pair(ModelPair(target, draft), masks, [10_000], [1], [], 1)
