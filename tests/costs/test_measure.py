"""Measuring a profile on tiny models: the grid, what a cached profile lacks, quantised drafters, slim views."""

import math
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import tiny
from viasd_adapters.costs import CostModel, LatencyProfile, ProfileGrid, measure_pair, measure_profile, missing_points
from viasd_adapters.models.int8_gemv import GEMV_MAX_ROWS


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
    wider = ProfileGrid(
        models=["a", "b"], dtypes=["float32", "bfloat16"], threads=[1], new_tokens=[1, 3], contexts=[0, 8]
    )
    assert missing_points(profile, wider).dtypes == ["bfloat16"]
    longer = ProfileGrid(models=["a"], dtypes=["float32"], threads=[1], new_tokens=[1, 3, 5], contexts=[8])
    assert missing_points(profile, longer).combinations() == [("a", "float32")]  # a forward size it lacks
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
    loads = []  # one load: the quantised copy takes turns with the plain model it was made from
    profile = measure_profile(grid, load=lambda name, dtype, device: loads.append(dtype) or model, progress=False)
    assert loads == ["float32"]
    assert {e.dtype for e in profile.entries} == {"float32", "float32+int8-weight"}
    assert int8_calls
    assert missing_points(profile, grid) is None
    wider = ProfileGrid(
        models=["a"],
        dtypes=["float32"],
        variants=["float32+int8-weight", "float32+int8-dynamic"],
        variant_models=["a"],
        threads=[1],
        new_tokens=[1, 2],
        contexts=[4],
    )
    todo = missing_points(profile, wider)
    assert todo.combinations() == [("a", "float32+int8-dynamic")]  # only what the profile lacks
    with pytest.raises(ValueError, match="<dtype>\\+<quantization>"):
        ProfileGrid(models=["a"], variants=["bfloat16+int2"], variant_models=["a"])
    with pytest.raises(ValueError, match="made from an int8 draft: int8\\+int4"):
        ProfileGrid(models=["a"], variants=["bfloat16+int4"], variant_models=["a"])
    with pytest.raises(ValueError, match="go together"):
        ProfileGrid(models=["a"], variants=["bfloat16+int8-weight"])


def test_a_drafter_over_a_draft_vocabulary_is_timed_with_its_reduced_head(monkeypatch, tmp_path):
    from viasd_adapters.models.vocab import DraftVocabulary, ReducedHead

    model = tiny(seed=0).model
    V = int(model.config.vocab_size)
    kept = list(range(0, V, 2))
    vocabulary = str(DraftVocabulary(kept, V).save(tmp_path / "half.json"))
    grid = ProfileGrid(
        models=["a"],
        dtypes=["float32"],
        variant_models=["a"],
        draft_vocabulary=vocabulary,
        vocabulary_dtypes=["float32", "int8"],
        threads=[1],
        new_tokens=[1],
        contexts=[4],
        repeats=1,
    )
    assert grid.variants == [f"float32@{vocabulary}"]  # int8 is not profiled here
    widths = []  # the variant must score the kept ids only, as the drafter does
    forward = ReducedHead.forward

    def spied(self, hidden):
        logits = forward(self, hidden)
        widths.append(logits.shape[-1])
        return logits

    monkeypatch.setattr(ReducedHead, "forward", spied)
    loads = []  # one load: the reduced head takes turns with the plain draft on the same weights
    profile = measure_profile(grid, load=lambda name, dtype, device: loads.append(dtype) or model, progress=False)
    assert loads == ["float32"]
    assert {e.dtype for e in profile.entries} == {"float32", f"float32@{vocabulary}"}
    assert widths and set(widths) == {len(kept)}
    alone = ProfileGrid(  # without its plain dtype it is loaded and timed on its own
        models=[], variants=[f"float32@{vocabulary}"], variant_models=["a"], threads=[1], new_tokens=[1], contexts=[4]
    )
    loads.clear()
    profile = measure_profile(alone, load=lambda name, dtype, device: loads.append(dtype) or model, progress=False)
    assert loads == ["float32"] and {e.dtype for e in profile.entries} == {f"float32@{vocabulary}"}
    with pytest.raises(ValueError, match="<dtype>@<draft vocabulary>"):
        ProfileGrid(models=["a"], variants=[f"float32+int2@{vocabulary}"], variant_models=["a"])


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


def test_the_choice_times_every_step_and_verifies_only_where_they_can_win():
    import copy
    import time

    from viasd_adapters.costs import measure_for_choice

    fast = tiny(seed=0).model
    slow = copy.deepcopy(fast)  # a precision whose step is far dearer: a real sleep in every forward
    slow.register_forward_pre_hook(lambda *_: time.sleep(0.05))
    loads = []

    def load(name, dtype, device):
        loads.append((name, dtype))
        return slow if dtype == "bfloat16" else fast

    grid = ProfileGrid(models=["d", "t"], dtypes=["float32", "bfloat16"], threads=[1], new_tokens=[1, 2, 4], contexts=[8], repeats=1)  # fmt: skip
    profile, dtypes = measure_for_choice(None, grid, "d", "t", 0.6, 8, load=load, progress=False)
    assert dtypes == ["float32"]
    measured = {}
    for e in profile.entries:
        measured.setdefault((e.model, e.dtype), []).append(e.new_tokens)
    measured = {key: sorted(counts) for key, counts in measured.items()}
    assert measured == {
        ("d", "float32"): [1],
        ("d", "bfloat16"): [1],
        ("t", "float32"): [1, 2, 4],
        ("t", "bfloat16"): [1],
    }
    loads.clear()
    again, _ = measure_for_choice(profile, grid, "d", "t", 0.6, 8, load=load, progress=False)
    assert again is profile and not loads  # a cached profile that has it all measures nothing


def test_an_eagle_heads_tree_level_is_profiled_once_per_dtype(tmp_path):
    pytest.importorskip("eagle.model.cnets")
    from tests.costs.test_cli import _head_with_recipe
    from viasd_adapters.costs import ProfileGrid, draft_head_key, measure_draft_head
    from viasd_adapters.models import ModelSpec, load_model
    from viasd_adapters.models.spec import TinyModelConfig

    head = str(_head_with_recipe(tmp_path, None))
    loads = []

    def load(name, dtype, device):
        loads.append((name, dtype))
        return load_model(ModelSpec("tiny-random", weights=dtype, tiny=TinyModelConfig()))

    grid = ProfileGrid(
        models=["tiny-random"], dtypes=["float32"], threads=[1], new_tokens=[1, 4], contexts=[16], repeats=1
    )
    profile = measure_draft_head(
        LatencyProfile(), "tiny-random", head, ["float32"], grid, 16, load=load, progress=False
    )
    key = draft_head_key("tiny-random", head)
    assert {(e.model, e.new_tokens) for e in profile.entries} == {(key, 1), (key, 4)}
    assert all(e.ms > 0 and e.context == 16 for e in profile.entries) and loads == [("tiny-random", "float32")]
    again = measure_draft_head(profile, "tiny-random", head, ["float32"], grid, 16, load=load, progress=False)
    assert again is profile and len(loads) == 1  # nothing measured twice


def test_the_default_grids_time_both_sides_of_the_gemv_row_limit():
    """A verify of GEMV_MAX_ROWS + 1 rows leaves the int8 GEMV for fbgemm and costs a jump (the
    Xeon's 1.5B: 114 ms at 4 rows, 155 at 5); the profile prices it only if it times both counts."""
    conf = OmegaConf.load(Path(__file__).parents[2] / "conf" / "profile.yaml")
    for new_tokens in (ProfileGrid(models=["a"]).new_tokens, list(conf.grid.new_tokens)):
        assert {GEMV_MAX_ROWS, GEMV_MAX_ROWS + 1} <= set(new_tokens)
