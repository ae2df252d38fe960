"""framework=auto / method=auto: what this machine's latency profile chooses, lossless either way.

The profiles here are written by the test (a measured one would make the choice depend on the
machine the test runs on); what is checked is that the choice is followed and the output kept."""

from __future__ import annotations

import pytest
import torch

from tests.test_configs import compose_generate
from viasd_adapters.cli.generate import run
from viasd_adapters.costs import LatencyEntry, LatencyProfile, chosen_draft_variant, default_profile_path

NAME = "tiny-random"  # draft and target of the tiny pair share the name; the variant tells them apart
TINY = (
    "model_pair=tiny-random",
    "runtime.weights=float32",
    "runtime.draft_weights=float32",
    "prompt=Hello there",
    "max_new_tokens=24",
)


def write_profile(tmp_path, monkeypatch, int8_draft_ms: float, **variant_ms: float) -> None:
    """A profile of the tiny pair: the target's steps and verifies, the int8-weight drafter's step
    and those of `variant_ms` ({variant label: ms})."""
    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))
    threads = torch.get_num_threads()
    costs = {"float32": {1: 100.0, 4: 104.0, 8: 108.0}, "float32+int8-weight": {1: int8_draft_ms}}
    costs |= {variant: {1: ms} for variant, ms in variant_ms.items()}
    LatencyProfile(
        entries=[
            LatencyEntry(NAME, dtype, threads, 256, n, ms) for dtype, row in costs.items() for n, ms in row.items()
        ]
    ).save(default_profile_path())


def test_a_cheap_int8_drafter_is_chosen_and_drafts(tmp_path, monkeypatch):
    write_profile(tmp_path, monkeypatch, int8_draft_ms=5.0)
    assert chosen_draft_variant(NAME, NAME, "float32", "float32") == "float32+int8-weight"
    _, ar = run(compose_generate(*TINY, "framework=ar"))
    _, auto = run(compose_generate(*TINY, "framework=auto"))
    assert auto.tokens == ar.tokens
    assert auto.stats.drafted > 0 and auto.stats.model_calls["draft"].variant == "float32+int8-weight"


def test_where_no_drafting_pays_auto_takes_greedy_steps(tmp_path, monkeypatch):
    write_profile(tmp_path, monkeypatch, int8_draft_ms=95.0)  # a draft step nearly as dear as the target's
    _, ar = run(compose_generate(*TINY, "framework=ar"))
    _, auto = run(compose_generate(*TINY, "framework=auto"))
    assert auto.tokens == ar.tokens and auto.stats.drafted == 0


def test_auto_without_a_profile_says_how_to_measure_one(tmp_path, monkeypatch):
    monkeypatch.setenv("VIASD_CACHE", str(tmp_path))
    with pytest.raises(Exception, match="viasd-profile"):
        run(compose_generate(*TINY, "framework=auto"))


@pytest.mark.parametrize("vocabulary_acceptance, reduced_chosen", [(None, True), (0.1, False)])
def test_auto_drafts_over_the_draft_vocabulary_where_the_profile_prices_it_faster(
    tmp_path, monkeypatch, vocabulary_acceptance, reduced_chosen
):
    from viasd_adapters.models.vocab import DraftVocabulary, ReducedHead

    V = 257  # the tiny pair's vocabulary
    vocabulary = str(DraftVocabulary(list(range(0, V, 2)), V).save(tmp_path / "half.json"))
    reduced = f"float32@{vocabulary}"
    write_profile(tmp_path, monkeypatch, int8_draft_ms=20.0, **{reduced: 5.0})
    scored = []
    forward = ReducedHead.forward
    monkeypatch.setattr(ReducedHead, "forward", lambda self, hidden: scored.append(1) or forward(self, hidden))
    pair_settings = [f"++model_pair.draft_vocabulary={vocabulary}"]
    if vocabulary_acceptance is not None:
        pair_settings.append(f"++model_pair.variant_acceptance.vocabulary={vocabulary_acceptance}")
    _, ar = run(compose_generate(*TINY, "framework=ar"))
    _, auto = run(compose_generate(*TINY, "framework=auto", *pair_settings))
    assert auto.tokens == ar.tokens and auto.stats.drafted > 0
    assert bool(scored) == reduced_chosen
    assert auto.stats.model_calls["draft"].variant == (reduced if reduced_chosen else "float32+int8-weight")


@pytest.mark.parametrize("int4_acceptance, four_bit_chosen", [(None, True), (0.05, False)])
def test_auto_drafts_with_4_bit_steps_where_the_profile_prices_them_faster(
    tmp_path, monkeypatch, int4_acceptance, four_bit_chosen
):
    write_profile(tmp_path, monkeypatch, int8_draft_ms=50.0, int8=20.0, **{"int8+int4": 5.0})
    settings = ["runtime.draft_weights=int8"]
    if int4_acceptance is not None:
        settings.append(f"++model_pair.variant_acceptance.int4={int4_acceptance}")
    _, ar = run(compose_generate(*TINY, "framework=ar"))
    _, auto = run(compose_generate(*TINY, "framework=auto", *settings))
    assert auto.tokens == ar.tokens and auto.stats.drafted > 0
    assert auto.stats.model_calls["draft"].variant == ("int8+int4" if four_bit_chosen else "int8")


def _head_for_tiny_random(tmp_path, top_rate: float):
    """A random EAGLE head for tiny-random with a recipe's measured acceptance, and a tokenizer folder."""
    import json

    from viasd_adapters.decode import RankAcceptance
    from viasd_adapters.pipeline import load_pair
    from viasd_adapters.third_party.eagle import build_head, head_config, save_head

    pair = load_pair(compose_generate(*TINY).model_pair, with_draft=False)
    config = head_config(pair.target.model.config, intermediate_size=32)
    torch.manual_seed(0)
    folder = save_head(build_head(config), config, tmp_path / "head", full=False, compact=True)
    ranks = RankAcceptance()
    for depth in range(1, 6):
        ranks.offered[depth, 0], ranks.taken[depth, 0] = 100, int(100 * top_rate)
    (folder / "recipe.json").write_text(json.dumps({"rank_acceptance": ranks.to_dict()}))
    pair.target.tokenizer.save_pretrained(tmp_path / "tokenizer")
    return folder, tmp_path / "tokenizer"


@pytest.mark.parametrize("head_ms, chosen", [(1.0, "auto: EAGLE"), (400.0, "auto: SD")])
def test_auto_decodes_with_eagle_where_the_profile_predicts_its_tree_fastest(tmp_path, monkeypatch, head_ms, chosen):
    pytest.importorskip("eagle.model.cnets")
    from viasd_adapters.costs import draft_head_key, load_profile

    write_profile(tmp_path, monkeypatch, int8_draft_ms=5.0)
    head, tokenizer = _head_for_tiny_random(tmp_path, top_rate=0.9)
    profile = load_profile()
    key, threads = draft_head_key(NAME, str(head)), torch.get_num_threads()
    profile.entries += [LatencyEntry(key, "float32", threads, 256, n, head_ms) for n in (1, 8)]
    profile.save(default_profile_path())
    eagle = (f"framework.decoder.eagle_head={head}", f"framework.decoder.tokenizer_path={tokenizer}")
    ar = run(compose_generate(*TINY, "framework=ar"))
    auto = run(compose_generate(*TINY, "framework=auto", *eagle))
    assert auto.method == chosen
    assert auto.result.tokens == ar.result.tokens  # lossless either way
    assert (auto.result.stats.tree_ranks is not None) == (chosen == "auto: EAGLE")
