"""Measuring a profile on tiny models: the grid, what a cached profile lacks, quantised drafters, slim views."""

import math

import pytest

from tests.conftest import tiny
from viasd_adapters.costs import CostModel, ProfileGrid, measure_pair, measure_profile, missing_points


def test_measure_profile_on_a_tiny_model():
    model = tiny(seed=0).model
    grid = ProfileGrid(
        models=["a", "b", "a"], dtypes=["float32"], threads=[1, 64], new_tokens=[1, 3], contexts=[0, 8], repeats=1
    )
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
    grid = ProfileGrid(
        models=["a"],
        dtypes=["float32"],
        variants=["float32+int8-weight"],
        variant_models=["a"],
        threads=[1],
        new_tokens=[1, 2],
        contexts=[4],
        repeats=1,
    )
    int8_calls = []  # the variant must time the int8 copy, not the model it was loaded as
    forward = Int8WeightLinear.forward
    monkeypatch.setattr(Int8WeightLinear, "forward", lambda self, x: int8_calls.append(1) or forward(self, x))
    profile = measure_profile(grid, load=lambda name, dtype, device: model, progress=False)
    assert {e.dtype for e in profile.entries} == {"float32", "float32+int8-weight"}
    assert int8_calls
    assert missing_points(profile, grid) is None
    wider = ProfileGrid(
        models=["a"],
        dtypes=["float32"],
        variants=["float32+int8-weight", "float32+int8-dynamic"],
        variant_models=["a"],
        threads=[1],
    )
    todo = missing_points(profile, wider)
    assert todo.combinations() == [("a", "float32+int8-dynamic")]  # only what the profile lacks
    with pytest.raises(ValueError, match="<dtype>\\+<quantization>"):
        ProfileGrid(models=["a"], variants=["bfloat16+int4"], variant_models=["a"])
    with pytest.raises(ValueError, match="go together"):
        ProfileGrid(models=["a"], variants=["bfloat16+int8-weight"])


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
    assert {
        ("tiny-random", "float32", 16, 4, None),
        ("tiny-random", "float32", 16, 1, 3.0),
        ("tiny-random", "float32", 16, 4, 2.0),
        ("tiny-random", "float32", 0, 40, None),
        ("tiny-draft", "float32", 16, 1, None),
        ("tiny-draft", "float32+int8-weight", 16, 4, None),
    } <= shapes
    assert not any(e.layers is not None and e.context == 0 for e in profile.entries)  # prefill: whole models only
    assert len({e.layers for e in profile.entries if e.model == "tiny-random"}) == 3  # two masks of 3 layers: one timed
    assert int8_rows and all(e.ms > 0 for e in profile.entries)
    assert profile.model_layers == {"tiny-random": 4, "tiny-draft": 2}
    costs = CostModel.fit(profile, "tiny-random", "tiny-draft", "float32", "float32+int8-weight")
    assert set(costs.decode) == set(costs.prefill) == {"target", "draft"}
    assert math.isfinite(costs.forward_ms("slim", 6, slim=3))
    with pytest.raises(ValueError, match="window"):
        measure_pair(ModelPair(target, draft), masks, [10_000], [1], [], 1)
