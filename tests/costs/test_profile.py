"""The latency profile: lookup, the draft/target cost ratios, merging and files."""

import json

import pytest

from viasd_adapters.costs import CostModel, LatencyEntry, LatencyProfile, load_profile
from viasd_adapters.costs.profile import FORMAT

from .profiles import INTEL, D, T, profile_of


def test_ms_interpolates_tokens_and_picks_the_nearest_context():
    p = LatencyProfile(
        entries=[
            LatencyEntry(T, "bfloat16", 1, 128, 1, 100.0),
            LatencyEntry(T, "bfloat16", 1, 128, 5, 140.0),
            LatencyEntry(T, "bfloat16", 1, 512, 1, 130.0),
            LatencyEntry(T, "bfloat16", 1, 512, 5, 170.0),
        ]
    )
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
    assert json.loads(path.read_text())["format"] == FORMAT
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
        CostModel.fit(cached, T, dtype="bfloat16", threads=2)
    # viasd-costmodel's former file: fitted lines, no entries
    lines = {"device": "cpu", "num_layers": 28, "decode": {"target": {"a": 1.0}}, "prefill": {}, "measurements": []}
    (tmp_path / "lines.json").write_text(json.dumps(lines))
    with pytest.raises(ValueError, match="measure it again with viasd-profile"):
        load_profile(tmp_path / "lines.json")
