"""`viasd-profile`: the demo decodes with the chosen configuration beside greedy AR, and its report."""

import json

import pytest
import torch
from hydra import compose, initialize_config_dir

from viasd_adapters.cli.profile import Decoded, ProfileOutcome, _cached_profile, decode_both, report
from viasd_adapters.configs import CONFIG_DIR
from viasd_adapters.costs import Choice, LatencyProfile
from viasd_adapters.decode import DecodeStats, GenerationResult
from viasd_adapters.models.quantize import Int8WeightLinear
from viasd_adapters.models.vocab import DraftVocabulary, ReducedHead

from .profiles import profile_of


@pytest.mark.parametrize("variant", ["float32+int8-weight", "float32@{vocabulary}"])
def test_the_demo_decodes_with_the_chosen_drafter_variant_beside_greedy_ar(monkeypatch, tmp_path, variant):
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "profile",
            overrides=["model_pair=tiny-random", "prompt=hello there", "max_new_tokens=12", "chat_template=false"],
        )
    variant = variant.format(vocabulary=DraftVocabulary(list(range(0, 257, 2)), 257).save(tmp_path / "half.json"))
    profile = profile_of(
        {("tiny-random", "float32"): {1: 10.0, 8: 11.0}, ("tiny-random", variant): {1: 2.0}},
        threads=torch.get_num_threads(),
    )
    choice = Choice("sd", "float32", variant, 3, 1.5, 150.0, 100.0, torch.get_num_threads(), 0.8)
    ran = []  # the drafter that ran is the priced variant: its int8 copy, or its reduced head
    spied = Int8WeightLinear if "+" in variant else ReducedHead
    forward = spied.forward
    monkeypatch.setattr(spied, "forward", lambda self, x: ran.append(1) or forward(self, x))
    ar, sd = decode_both(cfg, profile, choice)
    assert sd.result.tokens == ar.result.tokens and len(ar.result.tokens) == 12  # fp32 target: lossless
    assert ran and variant in sd.label
    assert sd.result.stats.accepted > 0


def test_the_demo_report_says_where_the_tokens_part_and_why_in_bf16(tmp_path):
    def decoded(label, tokens):
        return Decoded(label, GenerationResult(tokens, DecodeStats(new_tokens=len(tokens), seconds=1.0)), "text")

    ar = decoded("greedy AR (bfloat16)", [1, 2, 3, 4, 5])
    for dtype, tokens, says in [
        ("bfloat16", [1, 2, 9, 4, 5], "the same first 2 tokens as greedy AR, then they part (bfloat16"),
        ("float32", [1, 2, 3, 4, 5], "same tokens as greedy AR"),
    ]:
        choice = Choice("sd", dtype, "bfloat16", 2, 1.5, 7.5, 5.0, 2, 0.6)
        text = report(ProfileOutcome(tmp_path, LatencyProfile(), False, choice, [ar, decoded("SD", tokens)]))
        assert says in text.splitlines()[-1]


def _head_with_recipe(tmp_path, rank_acceptance):
    """A random EAGLE head for the tiny-random target, with a recipe.json as training writes it."""
    import json

    from viasd_adapters.models import ModelSpec, load_model
    from viasd_adapters.models.spec import TinyModelConfig
    from viasd_adapters.third_party.eagle import build_head, head_config, save_head

    target = load_model(ModelSpec("tiny-random", weights="float32", tiny=TinyModelConfig())).model
    config = head_config(target.config, intermediate_size=32)
    torch.manual_seed(0)
    folder = save_head(build_head(config), config, tmp_path / "head", full=False, compact=True)
    (folder / "recipe.json").write_text(json.dumps({"rank_acceptance": rank_acceptance}))
    return folder


def test_the_demo_decodes_eagle_with_the_chosen_tree_as_greedy_ar_does(tmp_path):
    pytest.importorskip("eagle.model.cnets")
    head = _head_with_recipe(tmp_path, None)
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "profile",
            overrides=["model_pair=tiny-random", "prompt=hello there", "max_new_tokens=12", "chat_template=false"],
        )
    tree = ((0,), (1,), (0, 0))
    choice = Choice(
        "eagle", "float32", None, 3, 1.5, 150.0, 100.0, torch.get_num_threads(), 0.8, tree=tree, head=str(head)
    )
    ar, eagle = decode_both(cfg, LatencyProfile(), choice)
    assert eagle.result.tokens == ar.result.tokens and len(ar.result.tokens) == 12  # fp32 target: lossless
    assert "EAGLE" in eagle.label
    assert eagle.result.stats.drafted == 2 * eagle.result.stats.steps  # its tree: paths of 2 drafts


def test_the_profile_considers_a_head_only_with_its_measured_acceptance(tmp_path, caplog):
    pytest.importorskip("eagle.model.cnets")
    from viasd_adapters.costs import eagle_candidate

    measured = {"offered": [[1, 0, 10]], "taken": [[1, 0, 7]]}
    assert eagle_candidate("tiny-random", "tiny-random") is None  # no head shipped for tiny-random
    assert eagle_candidate("tiny-random", str(_head_with_recipe(tmp_path, None))) is None
    assert "no measured acceptance" in caplog.text
    candidate = eagle_candidate("tiny-random", str(_head_with_recipe(tmp_path, measured)))
    assert candidate.acceptance.rate(1, 0, prior=0) == 0.7 and candidate.key.startswith("tiny-random+eagle:")
    assert eagle_candidate("tiny-random", None) is None


def test_a_profile_of_an_older_format_or_unreadable_is_measured_again(tmp_path, caplog):
    path = tmp_path / "profile.json"
    profile_of({("tiny-random", "float32"): {1: 10.0}}, threads=2).save(path)
    assert _cached_profile(path, "cpu") is not None
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "format": data["format"] - 1}))
    assert _cached_profile(path, "cpu") is None
    assert "measuring it again" in caplog.text
    path.write_text(path.read_text()[:20])  # cut off mid-write
    assert _cached_profile(path, "cpu") is None
    assert f"{path} is not a readable profile" in caplog.text


def test_without_the_native_operators_the_4_bit_drafters_are_not_profiled(monkeypatch, caplog):
    from viasd_adapters.cli.profile import runnable_grid
    from viasd_adapters.costs import ProfileGrid
    from viasd_adapters.models import native

    def grid():
        return ProfileGrid(models=["a"], dtypes=["int8"], variants=["int8+int4"], variant_models=["a"])

    assert runnable_grid(grid(), "cpu").variants == ["int8+int4"]  # CI's AVX2 CPU builds them
    monkeypatch.setattr(native, "load", lambda: "no compiler")
    assert runnable_grid(grid(), "cpu").variants == []
    assert "4-bit drafters are not profiled: no compiler" in caplog.text
