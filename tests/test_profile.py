"""The latency profile: lookup, costs, files, measuring on a tiny model, and the choice it drives."""

import json

import pytest

from tests.conftest import tiny
from viasd_adapters.profile import (
    LatencyEntry, LatencyProfile, ProfileGrid, choose_configuration, load_profile, measure_profile,
    missing_points, time_forwards,
)

T, D = "target-1.5b", "draft-0.5b"


def profile_of(table: dict, threads: int = 2, context: int = 128) -> LatencyProfile:
    """{(model, dtype): {new_tokens: ms}} -> a profile."""
    return LatencyProfile(entries=[
        LatencyEntry(model, dtype, threads, context, n, ms)
        for (model, dtype), row in table.items() for n, ms in row.items()
    ])


# Issue 12's measurements: Intel AMX (bf16 verify nearly free) and AMD Zen 3 (a verify of M
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


def test_the_choice_takes_the_faster_thread_count():
    # A busy host: two threads are slower than one (a 2-thread op waits for its slower thread).
    busy = LatencyProfile(entries=INTEL.entries + profile_of(
        {(T, "bfloat16"): {1: 400, 8: 420, 16: 450}, (D, "bfloat16"): {1: 190}}, threads=1).entries)
    busy.entries = [e if e.threads == 1 else LatencyEntry(e.model, e.dtype, 2, e.context, e.new_tokens, e.ms * 3) for e in busy.entries]
    choice = choose_configuration(busy, D, T, acceptance=0.8, threads=[1, 2])
    assert choice.threads == 1 and choice.dtype == "bfloat16"


def test_merge_save_and_load(tmp_path):
    a = profile_of({(T, "bfloat16"): {1: 200.0, 2: 210.0}})
    b = profile_of({(T, "bfloat16"): {2: 220.0}, (D, "bfloat16"): {1: 90.0}})
    merged = a.merge(b)
    assert merged.ms(T, "bfloat16", 2, 2) == 220.0 and merged.ms(T, "bfloat16", 2, 1) == 200.0
    assert len(merged.entries) == 3
    path = merged.save(tmp_path / "p" / "cpu.json")
    assert load_profile(path).entries == merged.entries
    assert json.loads(path.read_text())["format"] == 1
    with pytest.raises(FileNotFoundError, match="viasd-profile"):
        load_profile(tmp_path / "missing.json")


def test_time_forwards_and_measure_profile_on_a_tiny_model():
    model = tiny(seed=0).model
    times = time_forwards(model, context=16, new_tokens=[1, 4], repeats=2)
    assert set(times) == {1, 4} and all(len(v) == 2 and min(v) > 0 for v in times.values())
    grid = ProfileGrid(models=["a", "b", "a"], dtypes=["float32"], threads=[1, 64], new_tokens=[1, 3], contexts=[0, 8], repeats=1)
    assert grid.models == ["a", "b"]
    loads = []
    profile = measure_profile(grid, load=lambda name, dtype, device: loads.append(name) or model, progress=False)
    assert loads == ["a", "b"]  # each model loaded once per dtype
    threads = {e.threads for e in profile.entries}
    assert 1 in threads and 64 not in threads  # clipped to the cores there are
    assert len(profile.entries) == 2 * len(threads) * 2 * 2
    assert profile.cpu["model"] and profile.hardware and profile.torch_version
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
