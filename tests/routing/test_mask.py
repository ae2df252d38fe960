import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from viasd_adapters.routing import RoutingMask, format_layers


def test_index_out_of_range():
    with pytest.raises(ValueError, match=r"layer index 4 is out of range for a 4-layer model \(valid: 0-3\)"):
        RoutingMask([1, 4], num_layers=4)


def test_negative_index():
    with pytest.raises(ValueError, match=">= 0"):
        RoutingMask([-1])


def test_skip_every_layer():
    with pytest.raises(ValueError, match="skips all 4 decoder layers"):
        RoutingMask([0, 1, 2, 3], num_layers=4)


def test_skip_every_attention():
    with pytest.raises(ValueError, match="every attention sub-block"):
        RoutingMask([0, 1], skip_attention=[2, 3], num_layers=4)


def test_duplicates_and_types():
    with pytest.raises(ValueError, match="more than once"):
        RoutingMask([2, 2])
    with pytest.raises(TypeError, match="integer"):
        RoutingMask([1.5])
    with pytest.raises(TypeError, match="list of layer indices"):
        RoutingMask("12")


def test_mask_that_does_not_fit_the_model():
    mask = RoutingMask([12, 13], num_layers=28, model="qwen2.5-coder-1.5b-instruct")
    with pytest.raises(ValueError, match=r"28-layer model \(qwen2.5-coder-1.5b-instruct\) does not fit the 4-layer"):
        mask.check_fits(4)
    # A mask without num_layers is checked when it is bound to a model.
    with pytest.raises(ValueError, match="out of range"):
        RoutingMask([5]).bind(4)
    assert RoutingMask([3]).bind(4).num_layers == 4


def test_normalisation():
    mask = RoutingMask([5, 1], skip_attention=[2, 3, 1], skip_mlp=[3, 4], num_layers=8)
    assert mask.skip_layers == (1, 3, 5)  # attention + MLP of layer 3 is layer 3
    assert mask.skip_attention == (2,)
    assert mask.skip_mlp == (4,)
    assert mask.touched_layers == (1, 2, 3, 4, 5)
    assert mask.num_prefix_layers(8) == 1
    assert RoutingMask.none().num_prefix_layers(8) == 8
    assert mask.skipped_cost(attention_share=0.25) == 3 + 0.25 + 0.75
    assert format_layers([3, 12, 13, 14, 15]) == "3,12-15"


def test_yaml_round_trip_and_hydra(tmp_path):
    mask = RoutingMask(
        [12, 13, 14],
        skip_attention=[2],
        num_layers=28,
        model="m",
        provenance={"budget": {"kind": "layers", "value": 3}, "kl": 0.1},
    )
    path = mask.to_yaml(tmp_path / "m-3l.yaml")
    loaded = RoutingMask.from_yaml(path)
    assert loaded == mask and loaded.provenance == mask.provenance
    via_hydra = instantiate(OmegaConf.load(path))
    assert via_hydra == mask and via_hydra.provenance["budget"]["value"] == 3
    assert isinstance(via_hydra.provenance, dict)
    assert path.read_text().startswith("# Routing mask for m")


def test_unknown_field(tmp_path):
    with pytest.raises(ValueError, match="unknown routing mask field"):
        RoutingMask.from_dict({"skip_layer": [1]})


def test_random_like_keeps_the_budget_and_is_seeded():
    like = dict(skip_layers=[12, 13], skip_attention=[2], skip_mlp=[5, 6], num_layers=28, model="m")
    a = RoutingMask.random_like(seed=3, **like)
    assert (len(a.skip_layers), len(a.skip_attention), len(a.skip_mlp)) == (2, 1, 2)
    assert a == RoutingMask.random_like(seed=3, **like) and a.num_layers == 28
    assert len({RoutingMask.random_like(seed=s, **like).skips for s in range(5)}) > 1
    with pytest.raises(ValueError, match="num_layers"):
        RoutingMask.random_like(skip_layers=[1])
